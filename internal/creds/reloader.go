package creds

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// settle is how long the files must stay quiet before they are reloaded:
// a rotation writes several files, often in several steps.
const settle = 100 * time.Millisecond

// Reloader watches the files of one TLS and serves the newest certificate and
// CA pool that load; a change that does not load is reported and the
// previous material is kept.
type Reloader struct {
	// Read-only after NewReloader.
	t      TLS
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{} // closed when the watch goroutine returns

	cur atomic.Pointer[material] // replaced whole by the watch goroutine
}

// NewReloader loads t's files now (an error names the file that does not
// load) and watches them until ctx is done or Close is called.
func NewReloader(ctx context.Context, t TLS, logger *slog.Logger) (*Reloader, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	m, err := load(t)
	if err != nil {
		return nil, err
	}
	r := &Reloader{t: t, log: logger, done: make(chan struct{})}
	r.cur.Store(m)
	dirs := t.dirs()
	if len(dirs) == 0 {
		r.cancel = func() {}
		close(r.done)
		return r, nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("creds: watch: %w", err)
	}
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			w.Close()
			return nil, fmt.Errorf("creds: watch %s: %w", d, err)
		}
	}
	ctx, r.cancel = context.WithCancel(ctx)
	go r.watch(ctx, w)
	return r, nil
}

// Close stops watching the files and waits for the watcher to finish. The
// configurations already handed out keep serving the last material.
func (r *Reloader) Close() {
	r.cancel()
	<-r.done
}

// dirs returns the directories holding t's files. Directories, not files, are
// watched: files are often replaced by a rename or a symlink swap (as
// Kubernetes updates a mounted secret), which a watch on the file misses.
func (t TLS) dirs() []string {
	seen := make(map[string]bool)
	var dirs []string
	for _, f := range []string{t.CertFile, t.KeyFile, t.CAFile} {
		if f == "" {
			continue
		}
		if d := filepath.Dir(f); !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs
}

func (r *Reloader) watch(ctx context.Context, w *fsnotify.Watcher) {
	defer close(r.done)
	defer w.Close()
	var quiet <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-w.Errors:
			r.log.Warn("watching certificate files", "error", err)
		case <-w.Events:
			quiet = time.After(settle)
		case <-quiet:
			quiet = nil
			r.reload()
		}
	}
}

func (r *Reloader) reload() {
	m, err := load(r.t)
	if err != nil {
		r.log.Error("certificate files changed but do not load; keeping the previous ones", "error", err)
		return
	}
	if m.same(r.cur.Load()) {
		return
	}
	r.cur.Store(m)
	attrs := []any{"cert", r.t.CertFile, "ca", r.t.CAFile}
	if m.cert != nil && m.cert.Leaf != nil {
		attrs = append(attrs, "not_after", m.cert.Leaf.NotAfter)
	}
	r.log.Info("certificate files reloaded", attrs...)
}

// NotAfter is when the certificate now served expires; false without one.
func (r *Reloader) NotAfter() (time.Time, bool) {
	m := r.cur.Load()
	if m == nil || m.cert == nil || m.cert.Leaf == nil {
		return time.Time{}, false
	}
	return m.cert.Leaf.NotAfter, true
}

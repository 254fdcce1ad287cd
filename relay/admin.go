package relay

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/upstream"
)

// startAdmin serves the admin endpoint on admin.address, if set.
func (r *Relay) startAdmin() error {
	if r.cfg.Admin.Address == "" {
		return nil
	}
	aln, err := net.Listen("tcp", r.cfg.Admin.Address)
	if err != nil {
		return fmt.Errorf("admin.address: %w", err)
	}
	r.adminLn = aln
	r.admin = &http.Server{Handler: r.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
	r.goRun(func() {
		if err := r.admin.Serve(aln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("admin server", "error", err)
		}
	})
	return nil
}

func (r *Relay) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !r.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		// Ready while serving, whatever the control plane does: clients are
		// served from the cache ("outages are not outages"). Each group's
		// upstream state follows, for people.
		fmt.Fprintln(w, "ready")
		for _, g := range r.snapshotGroups() {
			fmt.Fprintf(w, "group %q: %s\n", g.key, describe(g.status(), g.cache.Len()))
		}
		for _, line := range r.persistHealth.detail() {
			fmt.Fprintln(w, line)
		}
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		r.metrics.WriteTo(w)
	})
	return mux
}

func (r *Relay) snapshotGroups() []*group {
	r.mu.Lock()
	defer r.mu.Unlock()
	gs := make([]*group, 0, len(r.groups))
	for _, g := range r.groups {
		gs = append(gs, g)
	}
	slices.SortFunc(gs, func(a, b *group) int { return strings.Compare(a.key, b.key) })
	return gs
}

func describe(s upstream.Status, resources int) string {
	state := "upstream connected"
	if !s.Connected {
		state = "upstream DOWN, serving from cache"
		if s.LastError != "" {
			state += " (" + s.LastError + ")"
		}
	}
	age := "no response yet"
	if !s.LastResponse.IsZero() {
		age = "last response " + time.Since(s.LastResponse).Round(time.Second).String() + " ago"
	}
	if s.Invalid != "" {
		age += "; " + s.Invalid
	}
	return fmt.Sprintf("%s; %d resources cached; %s", state, resources, age)
}

package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// File serves a directory of resource files as if a control plane had sent
// them. Each .yaml, .yml or .json file holds one resource, a list of them, or
// (YAML) several documents; a resource is the proto3 JSON form of a
// google.protobuf.Any ({"@type": "type.googleapis.com/...", ...}). The
// directory is watched: a change is served to every group, and a change that
// does not load is reported and ignored, keeping what was served.
type File struct {
	// Read-only after NewFile.
	dir string
	log *slog.Logger

	mu        sync.Mutex
	resources map[string]map[string]*cache.Resource // type → name → resource; replaced whole, never mutated
	wakes     map[chan struct{}]struct{}
	loaded    time.Time // when the files last loaded
}

// Status reports the files as a connected upstream whose last response is
// the last successful load.
func (f *File) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Status{Connected: true, LastResponse: f.loaded}
}

// NewFile loads dir; an error names the file that does not load.
func NewFile(dir string, logger *slog.Logger) (*File, error) {
	if logger == nil {
		logger = slog.Default()
	}
	f := &File{dir: dir, log: logger.With("component", "upstream", "dir", dir), wakes: make(map[chan struct{}]struct{})}
	rs, err := loadDir(dir)
	if err != nil {
		return nil, err
	}
	f.resources, f.loaded = rs, time.Now()
	return f, nil
}

// Count returns how many resources are loaded.
func (f *File) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, byName := range f.resources {
		n += len(byName)
	}
	return n
}

// Run watches the directory until ctx is done.
func (f *File) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("upstream: watch %s: %w", f.dir, err)
	}
	defer w.Close()
	if err := w.Add(f.dir); err != nil {
		return fmt.Errorf("upstream: watch %s: %w", f.dir, err)
	}
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-w.Errors:
			f.log.Warn("watching resource files", "error", err)
		case <-w.Events:
			// Editors write in several steps: reload once they settle.
			settle = time.After(100 * time.Millisecond)
		case <-settle:
			settle = nil
			f.reload()
		}
	}
}

func (f *File) reload() {
	rs, err := loadDir(f.dir)
	if err != nil {
		f.log.Error("resource files changed but do not load; still serving the previous ones", "error", err)
		return
	}
	f.mu.Lock()
	f.resources, f.loaded = rs, time.Now()
	for w := range f.wakes {
		select {
		case w <- struct{}{}:
		default:
		}
	}
	f.mu.Unlock()
	f.log.Info("resource files reloaded")
}

// Serve keeps c filled from the files until ctx is done: what c's group
// wants, as it changes and as the files change.
func (f *File) Serve(ctx context.Context, c *cache.Cache) {
	wake := make(chan struct{}, 1)
	f.mu.Lock()
	f.wakes[wake] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.wakes, wake)
		f.mu.Unlock()
	}()
	for {
		f.apply(c)
		select {
		case <-ctx.Done():
			return
		case <-c.InterestChanged():
		case <-wake:
		}
	}
}

// apply gives c what its group wants; a wanted name that no file holds is
// reported as not existing.
func (f *File) apply(c *cache.Cache) {
	f.mu.Lock()
	rs := f.resources
	f.mu.Unlock()
	for typeURL, in := range c.Interest() {
		byName := rs[typeURL]
		var ups []*cache.Resource
		var removed []string
		if in.Wildcard {
			for _, r := range byName {
				ups = append(ups, r)
			}
			for n := range c.Versions(typeURL) {
				if _, ok := byName[n]; !ok {
					removed = append(removed, n)
				}
			}
		}
		for _, n := range in.Names {
			if r, ok := byName[n]; ok {
				ups = append(ups, r)
			} else {
				removed = append(removed, n)
			}
		}
		c.Apply(typeURL, cache.Change{Upserts: ups, Removed: removed, Synced: in.Wildcard})
	}
}

func loadDir(dir string) (map[string]map[string]*cache.Resource, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("upstream: resource directory: %w", err)
	}
	out := make(map[string]map[string]*cache.Resource)
	where := make(map[string]string) // type/name → file, to report duplicates
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		anys, err := loadFile(path)
		if err != nil {
			return nil, fmt.Errorf("upstream: %s: %w", path, err)
		}
		for i, a := range anys {
			r, err := encodeFileResource(a)
			if err != nil {
				return nil, fmt.Errorf("upstream: %s: resource %d: %w", path, i+1, err)
			}
			key := a.GetTypeUrl() + "/" + r.Name
			if prev, dup := where[key]; dup {
				return nil, fmt.Errorf("upstream: %s: %s %q is also defined in %s", path, xds.ShortName(a.GetTypeUrl()), r.Name, prev)
			}
			where[key] = path
			if out[a.GetTypeUrl()] == nil {
				out[a.GetTypeUrl()] = make(map[string]*cache.Resource)
			}
			out[a.GetTypeUrl()][r.Name] = r
		}
	}
	return out, nil
}

// loadFile reads the Any resources of one file.
func loadFile(path string) ([]*anypb.Any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var docs []any
	dec := yaml.NewDecoder(bytes.NewReader(data)) // JSON is YAML too
	for {
		var doc any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		if list, ok := doc.([]any); ok {
			docs = append(docs, list...)
		} else if doc != nil {
			docs = append(docs, doc)
		}
	}
	out := make([]*anypb.Any, 0, len(docs))
	for i, doc := range docs {
		js, err := json.Marshal(doc)
		if err != nil {
			return nil, fmt.Errorf("resource %d: %w", i+1, err)
		}
		a := &anypb.Any{}
		if err := protojson.Unmarshal(js, a); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i+1, err)
		}
		out = append(out, a)
	}
	return out, nil
}

func encodeFileResource(a *anypb.Any) (*cache.Resource, error) {
	if !xds.Known(a.GetTypeUrl()) {
		return nil, fmt.Errorf("type %q is not an xDS resource type the relay carries", a.GetTypeUrl())
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	name := resourceName(m.ProtoReflect())
	return xds.Encode(name, "", a, nil, nil)
}

// resourceName is a resource's name field: name, or cluster_name for a
// ClusterLoadAssignment.
func resourceName(m protoreflect.Message) string {
	fields := m.Descriptor().Fields()
	for _, f := range []protoreflect.Name{"name", "cluster_name"} {
		if fd := fields.ByName(f); fd != nil && fd.Kind() == protoreflect.StringKind {
			return m.Get(fd).String()
		}
	}
	return ""
}

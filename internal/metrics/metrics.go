// Package metrics is the relay's small set of counters and gauges, written in
// the Prometheus text exposition format on the admin endpoint.
package metrics

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Registry holds metric families in registration order.
type Registry struct {
	mu       sync.Mutex
	families []*Vec   // guarded by mu
	collect  []func() // guarded by mu; run before every write
}

// OnScrape registers f to run before the metrics are written, to set gauges
// that are computed rather than kept (ages, sizes).
func (r *Registry) OnScrape(f func()) {
	r.mu.Lock()
	r.collect = append(r.collect, f)
	r.mu.Unlock()
}

// Vec is a metric family: one value per combination of label values.
type Vec struct {
	name, help, kind string
	labels           []string

	mu     sync.RWMutex
	values map[string]*Value // by joined label values; guarded by mu
}

// Value is one series of a family.
type Value struct {
	labels []string
	v      atomic.Int64
}

// Add adds d to the value.
func (v *Value) Add(d int64) { v.v.Add(d) }

// Inc adds one.
func (v *Value) Inc() { v.v.Add(1) }

// Dec subtracts one.
func (v *Value) Dec() { v.v.Add(-1) }

// Set sets the value (gauges).
func (v *Value) Set(x int64) { v.v.Store(x) }

// Get returns the value.
func (v *Value) Get() int64 { return v.v.Load() }

// Counter registers a counter family.
func (r *Registry) Counter(name, help string, labels ...string) *Vec {
	return r.add(name, help, "counter", labels)
}

// Gauge registers a gauge family.
func (r *Registry) Gauge(name, help string, labels ...string) *Vec {
	return r.add(name, help, "gauge", labels)
}

func (r *Registry) add(name, help, kind string, labels []string) *Vec {
	v := &Vec{name: name, help: help, kind: kind, labels: labels, values: make(map[string]*Value)}
	r.mu.Lock()
	r.families = append(r.families, v)
	r.mu.Unlock()
	return v
}

// With returns the series for the label values, creating it if needed.
func (f *Vec) With(values ...string) *Value {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s takes %d labels, got %d", f.name, len(f.labels), len(values)))
	}
	key := strings.Join(values, "\xff")
	f.mu.RLock()
	v := f.values[key]
	f.mu.RUnlock()
	if v != nil {
		return v
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if v = f.values[key]; v == nil {
		v = &Value{labels: slices.Clone(values)}
		f.values[key] = v
	}
	return v
}

// Delete drops the series for the label values (a group that went away).
func (f *Vec) Delete(values ...string) {
	f.mu.Lock()
	delete(f.values, strings.Join(values, "\xff"))
	f.mu.Unlock()
}

// WriteTo writes every family in the Prometheus text format.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	r.mu.Lock()
	families := slices.Clone(r.families)
	collect := slices.Clone(r.collect)
	r.mu.Unlock()
	for _, f := range collect {
		f()
	}
	for _, f := range families {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.kind)
		f.mu.RLock()
		keys := slices.Sorted(maps.Keys(f.values))
		for _, k := range keys {
			v := f.values[k]
			b.WriteString(f.name)
			if len(f.labels) > 0 {
				b.WriteByte('{')
				for i, l := range f.labels {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, "%s=%q", l, v.labels[i])
				}
				b.WriteByte('}')
			}
			fmt.Fprintf(&b, " %d\n", v.Get())
		}
		f.mu.RUnlock()
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

package metrics

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// MaxLabelLen is the longest label value exposed as is.
const MaxLabelLen = 64

// GroupLabel is the label that Options.NoGroupLabel drops.
const GroupLabel = "group"

// Options are a Registry's settings.
type Options struct {
	// NoGroupLabel drops the group label: the series of the groups are
	// summed (or, for families made with Max, their largest is kept).
	NoGroupLabel bool
}

// Registry holds the metric families. The zero value is ready to use, with
// the group label kept.
type Registry struct {
	// Read-only after New.
	opts Options

	// Set once, by prom.
	once sync.Once
	reg  *prometheus.Registry

	mu       lockorder.Mutex[registryMu]
	families map[string]*Vec          // by name; guarded by mu
	hists    map[string]*HistogramVec // by name; guarded by mu
	collect  []func()                 // guarded by mu; run before every scrape
}

// New returns a registry with opts.
func New(opts Options) *Registry { return &Registry{opts: opts} }

func (r *Registry) prom() *prometheus.Registry {
	r.once.Do(func() {
		r.reg = prometheus.NewRegistry()
		r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	})
	return r.reg
}

// OnScrape registers f to run before the metrics are gathered, to set
// gauges that are computed rather than kept (ages, sizes).
func (r *Registry) OnScrape(f func()) {
	r.mu.Lock()
	r.collect = append(r.collect, f)
	r.mu.Unlock()
}

// Gather runs the OnScrape functions, then gathers every family.
func (r *Registry) Gather() ([]*dto.MetricFamily, error) {
	r.mu.Lock()
	collect := slices.Clone(r.collect)
	r.mu.Unlock()
	for _, f := range collect {
		f()
	}
	return r.prom().Gather()
}

// Handler serves the metrics in the format the scraper asks for: the
// Prometheus text format, or OpenMetrics when the Accept header names
// application/openmetrics-text (as Prometheus's own scraper does).
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(prometheus.GathererFunc(r.Gather), promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
}

// WriteTo writes every family in the Prometheus text format.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	mfs, err := r.Gather()
	if err != nil {
		return 0, fmt.Errorf("metrics: gather: %w", err)
	}
	var n int64
	for _, mf := range mfs {
		m, err := expfmt.MetricFamilyToText(w, mf)
		n += int64(m)
		if err != nil {
			return n, fmt.Errorf("metrics: write %s: %w", mf.GetName(), err)
		}
	}
	return n, nil
}

// Counter registers a counter family (or returns the one of that name).
func (r *Registry) Counter(name, help string, labels ...string) *Vec {
	return r.add(name, help, prometheus.CounterValue, labels)
}

// Gauge registers a gauge family (or returns the one of that name).
func (r *Registry) Gauge(name, help string, labels ...string) *Vec {
	return r.add(name, help, prometheus.GaugeValue, labels)
}

func (r *Registry) add(name, help string, kind prometheus.ValueType, labels []string) *Vec {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.families[name]; f != nil {
		return f
	}
	drop, exposed := r.exposedLabels(labels)
	f := &Vec{name: name, help: help, kind: kind, labels: labels, drop: drop,
		desc: prometheus.NewDesc(name, help, exposed, nil), values: make(map[string]*Value)}
	r.prom().MustRegister(f)
	if r.families == nil {
		r.families = make(map[string]*Vec)
	}
	r.families[name] = f
	return f
}

// exposedLabels returns the index of the label the registry drops (-1 if
// none) and the label names as exposed, without it.
func (r *Registry) exposedLabels(labels []string) (drop int, exposed []string) {
	drop = -1
	if r.opts.NoGroupLabel {
		drop = slices.Index(labels, GroupLabel)
	}
	exposed = slices.Clone(labels)
	if drop >= 0 {
		exposed = slices.Delete(exposed, drop, drop+1)
	}
	return drop, exposed
}

// Vec is a counter or gauge family: one value per combination of label
// values. It is a prometheus.Collector.
type Vec struct {
	// Read-only after registration.
	name   string
	help   string
	kind   prometheus.ValueType
	labels []string
	drop   int // index of the dropped label; -1 if none
	desc   *prometheus.Desc

	// Atomic.
	max atomic.Bool // with a dropped label, keep the largest rather than the sum

	mu     lockorder.RWMutex[vecMu]
	values map[string]*Value // by joined label values; guarded by mu
}

// Max makes the family expose, when the group label is dropped, the largest
// of the groups' values rather than their sum (ages).
func (f *Vec) Max() *Vec {
	f.max.Store(true)
	return f
}

// Value is one series of a family.
type Value struct {
	exposed []string // read-only: label values as exposed, bounded, without the dropped one
	v       atomic.Int64
}

// Add adds d to the value.
func (v *Value) Add(d int64) { v.v.Add(d) }

// Inc adds one.
func (v *Value) Inc() { v.v.Add(1) }

// Dec subtracts one.
func (v *Value) Dec() { v.v.Add(-1) }

// Set sets the value (gauges, and counters kept elsewhere).
func (v *Value) Set(x int64) { v.v.Store(x) }

// Get returns the value.
func (v *Value) Get() int64 { return v.v.Load() }

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
		v = &Value{exposed: exposed(values, f.drop)}
		f.values[key] = v
	}
	return v
}

// Zero creates, at 0, the series of each set of label values that does not
// exist yet, so that a counter is on /metrics before its first event: a
// series born at 1 shows Prometheus no increase, and an alert on
// increase() would miss that event. Families whose labels take a finite set
// of values (types, reasons, configured names) call it at registration.
func (f *Vec) Zero(sets ...[]string) *Vec {
	for _, values := range sets {
		f.With(values...)
	}
	return f
}

// ZeroEach is Zero for a one-label family: a series at 0 for each value.
func (f *Vec) ZeroEach(values ...string) *Vec {
	for _, v := range values {
		f.With(v)
	}
	return f
}

// Cross is every combination of one value of a and one of b, for Zero on
// a two-label family.
func Cross(a, b []string) [][]string {
	out := make([][]string, 0, len(a)*len(b))
	for _, x := range a {
		for _, y := range b {
			out = append(out, []string{x, y})
		}
	}
	return out
}

// Delete drops the series for the label values (a group that went away).
func (f *Vec) Delete(values ...string) {
	f.mu.Lock()
	delete(f.values, strings.Join(values, "\xff"))
	f.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (f *Vec) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }

// Collect implements prometheus.Collector: with a dropped label, the series
// that differ only by it are merged.
func (f *Vec) Collect(ch chan<- prometheus.Metric) {
	type series struct {
		labels []string
		v      int64
	}
	merged := make(map[string]*series)
	var order []string
	f.mu.RLock()
	for _, v := range f.values {
		k := strings.Join(v.exposed, "\xff")
		x := v.Get()
		s := merged[k]
		switch {
		case s == nil:
			merged[k] = &series{labels: v.exposed, v: x}
			order = append(order, k)
		case f.max.Load():
			s.v = max(s.v, x)
		default:
			s.v += x
		}
	}
	f.mu.RUnlock()
	for _, k := range order {
		s := merged[k]
		ch <- prometheus.MustNewConstMetric(f.desc, f.kind, float64(s.v), s.labels...)
	}
}

// HistogramVec is a histogram family.
type HistogramVec struct {
	// Read-only after registration.
	name   string
	help   string
	labels []string
	drop   int
	vec    *prometheus.HistogramVec
}

// Observer takes observations of one histogram series.
type Observer = prometheus.Observer

// Histogram registers a histogram family with the buckets' upper bounds (or
// returns the one of that name).
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *HistogramVec {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hists == nil {
		r.hists = make(map[string]*HistogramVec)
	}
	if h := r.hists[name]; h != nil {
		return h
	}
	drop, exposed := r.exposedLabels(labels)
	h := &HistogramVec{name: name, help: help, labels: labels, drop: drop,
		vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, exposed)}
	r.prom().MustRegister(h.vec)
	r.hists[name] = h
	return h
}

// With returns the series for the label values, creating it if needed.
// Callers on a hot path keep what it returns.
func (h *HistogramVec) With(values ...string) Observer {
	if len(values) != len(h.labels) {
		panic(fmt.Sprintf("metrics: %s takes %d labels, got %d", h.name, len(h.labels), len(values)))
	}
	return h.vec.WithLabelValues(exposed(values, h.drop)...)
}

// exposed is the label values as exposed: without the dropped one, each
// bounded.
func exposed(values []string, drop int) []string {
	out := make([]string, 0, len(values))
	for i, v := range values {
		if i != drop {
			out = append(out, Bound(v))
		}
	}
	return out
}

// Bound returns v if it is at most MaxLabelLen bytes and valid UTF-8, and
// its short hash otherwise.
func Bound(v string) string {
	if len(v) <= MaxLabelLen && utf8.ValidString(v) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// Bucket upper bounds shared by the relay's histograms.
var (
	// LatencyBuckets, in seconds, for work the relay does itself (an
	// upstream response applied, a change pushed): 50µs to about 13s.
	LatencyBuckets = prometheus.ExponentialBuckets(50e-6, 4, 10)
	// WaitBuckets, in seconds, for waits on others (a first response,
	// which may wait for the control plane): 1ms to about 4m.
	WaitBuckets = prometheus.ExponentialBuckets(1e-3, 4, 10)
	// SizeBuckets, in bytes, for messages: 256B to 64MiB.
	SizeBuckets = prometheus.ExponentialBuckets(256, 4, 10)
)

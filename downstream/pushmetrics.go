package downstream

import (
	"time"

	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// pushMetrics are the per-response families, with each relayed type's
// series looked up once, so that a push costs no allocation. Read-only
// after New.
type pushMetrics struct {
	pushes  *metrics.Vec
	sizes   *metrics.HistogramVec
	latency *metrics.HistogramVec
	first   *metrics.HistogramVec
	conv    *metrics.HistogramVec
	byType  map[string]typeMetrics // every type of xds.Types; read-only
}

type typeMetrics struct {
	pushes  *metrics.Value
	size    metrics.Observer
	latency metrics.Observer
	conv    metrics.Observer
}

// ConvergenceBuckets, in seconds, for the time from a change's arrival to
// a client's ACK of it: 1ms to 2m.
var ConvergenceBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newPushMetrics(m *metrics.Registry) pushMetrics {
	p := pushMetrics{
		pushes: m.Counter("xdsrelay_downstream_pushes_total", "Responses sent to downstream clients.", "type"),
		sizes: m.Histogram("xdsrelay_downstream_response_bytes", "Encoded size of the responses sent to downstream clients.",
			metrics.SizeBuckets, "type"),
		latency: m.Histogram("xdsrelay_downstream_push_latency_seconds", "From the arrival of a change from the control plane to the write of the response carrying it to a client that was already connected.",
			metrics.LatencyBuckets, "type"),
		first: m.Histogram("xdsrelay_downstream_first_response_seconds", "From a stream's opening to its first response.",
			metrics.WaitBuckets, "variant"),
		conv: m.Histogram("xdsrelay_convergence_seconds", "From the arrival of a change from the control plane to a client's ACK of a resource it changed, for clients connected before it arrived: how long the fleet takes to accept a change (an ACK says the client accepted the configuration, not that traffic uses it).",
			ConvergenceBuckets, "type"),
		byType: make(map[string]typeMetrics, len(xds.Types)),
	}
	for _, t := range xds.Types {
		p.byType[t] = p.forType(t)
	}
	for _, v := range streamVariants {
		p.first.With(v)
	}
	return p
}

func (p *pushMetrics) forType(typeURL string) typeMetrics {
	short := xds.ShortName(typeURL)
	return typeMetrics{pushes: p.pushes.With(short), size: p.sizes.With(short), latency: p.latency.With(short), conv: p.conv.With(short)}
}

// converged observes a client's time to accept a change of typeURL.
func (p *pushMetrics) converged(typeURL string, took time.Duration) {
	m, ok := p.byType[typeURL]
	if !ok {
		m = p.forType(typeURL)
	}
	m.conv.Observe(took.Seconds())
}

// pushed counts a response of typeURL written to a client: size bytes, with
// the content upstream sent at received (zero: unknown), on a stream opened
// at opened (zero: not a stream). The latency is observed only for content
// that arrived after the stream opened: older content was waiting in the
// cache, not being pushed.
func (p *pushMetrics) pushed(typeURL string, size int, received, opened time.Time) {
	m, ok := p.byType[typeURL]
	if !ok {
		m = p.forType(typeURL)
	}
	m.pushes.Inc()
	m.size.Observe(float64(size))
	if !received.IsZero() && !opened.IsZero() && received.After(opened) {
		m.latency.Observe(time.Since(received).Seconds())
	}
}

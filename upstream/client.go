package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Metrics are the upstream families, shared by every group's client.
type Metrics struct {
	Streams    *metrics.Vec          // gauge, by group: 1 while the stream is up
	Responses  *metrics.Vec          // counter, by type
	NACKs      *metrics.Vec          // counter, by type: responses the relay rejected
	Apply      *metrics.HistogramVec // by type: seconds to apply a response to the cache
	Reconnects *metrics.Vec          // counter, by group: streams that ended and are opened again
}

// NewMetrics registers the upstream families on r.
func NewMetrics(r *metrics.Registry) *Metrics {
	return &Metrics{
		Streams:   r.Gauge("xdsrelay_upstream_connected", "1 while the group's upstream delta-ADS stream is up.", "group"),
		Responses: r.Counter("xdsrelay_upstream_responses_total", "Responses received from the control plane.", "type"),
		NACKs:     r.Counter("xdsrelay_upstream_nacks_total", "Upstream responses the relay rejected (NACKed).", "type"),
		Apply: r.Histogram("xdsrelay_upstream_apply_seconds", "Time to apply one control-plane response to the group's cache.",
			metrics.LatencyBuckets, "type"),
		Reconnects: r.Counter("xdsrelay_upstream_reconnects_total", "Times the group's upstream delta-ADS stream ended and is being opened again (with backoff).", "group"),
	}
}

// Options configure a Client.
type Options struct {
	Conn    grpc.ClientConnInterface // the control plane; required
	Node    *corepb.Node             // presented upstream; required
	Cache   *cache.Cache             // the group's cache; required
	Group   string                   // the group key, for logs and metrics
	Metrics *Metrics                 // required
	Logger  *slog.Logger             // slog.Default() if nil
	Backoff backoff.Config           // backoff.DefaultConfig if zero
	// NotFoundTimeout is how long a subscribed name may go unanswered
	// before it is taken not to exist; 0 disables the timer.
	NotFoundTimeout time.Duration
	// MaxRequestBytes bounds every request sent upstream: subscriptions
	// and resumes larger than this are split. DefaultMaxRequestBytes if 0.
	MaxRequestBytes int
}

// Client is one group's upstream: a delta-ADS stream, re-established with
// exponential backoff whenever it fails.
type Client struct {
	// Read-only after New.
	opts Options
	ads  discoverypb.AggregatedDiscoveryServiceClient
	log  *slog.Logger

	mu     sync.Mutex
	status Status // guarded by mu
}

// Status is what the admin endpoint shows of a group's upstream.
type Status struct {
	Connected    bool      // the stream is up and the control plane has answered on it
	LastResponse time.Time // of the last response received; zero if none yet
	LastError    string    // why the last stream ended
	Invalid      string    // what the source holds but does not serve, and why (resource files); empty if nothing
}

// Status returns the upstream's current status.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

func (c *Client) setStatus(f func(*Status)) {
	c.mu.Lock()
	f(&c.status)
	c.mu.Unlock()
}

// New returns a client; Run starts it.
func New(opts Options) (*Client, error) {
	switch {
	case opts.Conn == nil:
		return nil, errors.New("upstream: Options.Conn is required")
	case opts.Node == nil:
		return nil, errors.New("upstream: Options.Node is required")
	case opts.Cache == nil:
		return nil, errors.New("upstream: Options.Cache is required")
	case opts.Metrics == nil:
		return nil, errors.New("upstream: Options.Metrics is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Backoff == (backoff.Config{}) {
		opts.Backoff = backoff.DefaultConfig
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	opts.Node = proto.Clone(opts.Node).(*corepb.Node)
	return &Client{
		opts: opts,
		ads:  discoverypb.NewAggregatedDiscoveryServiceClient(opts.Conn),
		log:  opts.Logger.With("component", "upstream", "group", xds.Clip(opts.Group)),
	}, nil
}

// Run keeps the stream up until ctx is done.
func (c *Client) Run(ctx context.Context) {
	defer c.opts.Metrics.Streams.Delete(c.opts.Group)
	defer c.opts.Metrics.Reconnects.Delete(c.opts.Group)
	for attempt := 0; ; attempt++ {
		healthy, err := c.session(ctx)
		c.opts.Metrics.Streams.With(c.opts.Group).Set(0)
		c.setStatus(func(s *Status) { s.Connected, s.LastError = false, fmt.Sprint(err) })
		if ctx.Err() != nil {
			return
		}
		if healthy {
			attempt = 0 // the stream had worked: start the backoff again
		}
		c.opts.Metrics.Reconnects.With(c.opts.Group).Inc()
		delay := backoffDelay(c.opts.Backoff, attempt)
		c.log.Warn("upstream stream ended; reconnecting", "error", err, "in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// backoffDelay is gRPC's connection backoff: exponential with jitter,
// capped (gRPC's connection-backoff.md, with grpc/backoff's parameters).
func backoffDelay(cfg backoff.Config, retries int) time.Duration {
	if retries == 0 {
		return cfg.BaseDelay
	}
	d, limit := float64(cfg.BaseDelay), float64(cfg.MaxDelay)
	for d < limit && retries > 0 {
		d *= cfg.Multiplier
		retries--
	}
	d = min(d, limit)
	d *= 1 + cfg.Jitter*(rand.Float64()*2-1)
	return time.Duration(max(d, 0))
}

// session runs one stream. healthy reports whether the control plane
// answered on it.
func (c *Client) session(ctx context.Context) (healthy bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("upstream: open stream: %w", err)
	}
	s := &session{c: c, st: st, subs: make(map[string]*subscription), notFound: notFound{timeout: c.opts.NotFoundTimeout}}
	defer s.notFound.stop()
	resps, errc := receive(ctx, st)
	defer func() { cancel(); <-errc }() // cancelling the stream ends Recv
	if err := s.sync(); err != nil {
		return false, err
	}
	for {
		select {
		case r := <-resps:
			if r == nil {
				return healthy, fmt.Errorf("upstream: %w", <-errc)
			}
			if !healthy {
				healthy = true
				c.opts.Metrics.Streams.With(c.opts.Group).Set(1)
			}
			c.setStatus(func(s *Status) { s.Connected, s.LastResponse = true, time.Now() })
			if err := s.handle(r); err != nil {
				return healthy, err
			}
		case <-c.opts.Cache.InterestChanged():
			if err := s.sync(); err != nil {
				return healthy, err
			}
		case now := <-s.notFound.C():
			s.timedOut(now)
		case <-ctx.Done():
			return healthy, ctx.Err()
		}
	}
}

// receive turns the stream's Recv into a channel of responses, closed when
// receiving ends. Why it ended is then written to errc on every path (a
// Recv error, or the context's end) and errc is closed, so that every wait
// on errc is answered, the first with the error.
func receive(ctx context.Context, st grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]) (<-chan *discoverypb.DeltaDiscoveryResponse, <-chan error) {
	resps := make(chan *discoverypb.DeltaDiscoveryResponse)
	errc := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			close(resps)
			errc <- err
			close(errc)
		}()
		for {
			var r *discoverypb.DeltaDiscoveryResponse
			if r, err = st.Recv(); err != nil {
				return
			}
			select {
			case resps <- r:
			case <-ctx.Done():
				err = ctx.Err()
				return
			}
		}
	}()
	return resps, errc
}

package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/loadstats"
)

// featureSendAllClusters tells an LRS server that the client understands
// send_all_clusters (load_stats/v3/lrs.proto; Envoy and grpc-go send it).
const featureSendAllClusters = "envoy.lrs.supports_send_all_clusters"

// LoadMetrics are the series a load reporter keeps.
type LoadMetrics struct {
	Streams *metrics.Value // xdsrelay_lrs_streams{side="upstream"}: open streams; nil: not counted
	Reports *metrics.Value // xdsrelay_lrs_reports_total{side="upstream"}: reports sent; nil: not counted
	// Blocked is xdsrelay_lrs_dropped_stats_total{reason="send_blocked"}:
	// the cluster stats lost with a stream ended because a send did not
	// return within SendTimeout (see send); nil: not counted.
	Blocked *metrics.Value
}

// LoadReporterOptions configure a LoadReporter.
type LoadReporterOptions struct {
	Store *loadstats.Store // the group's load; required
	Node  *corepb.Node     // the group's node, presented upstream; required
	// Server returns the server to report to now: the one the group's
	// stream for Clusters uses (ServerOf), so that the reports follow its
	// fallback (gRFC A71). Required.
	Server  func() (Server, bool)
	Group   string // the group id (relay.GroupID), for logs
	Metrics LoadMetrics
	Logger  *slog.Logger   // slog.Default() if nil
	Backoff backoff.Config // backoff.DefaultConfig if zero
	// MaxRequestBytes bounds every report sent: a larger one goes in
	// parts, a cluster's stats whole in each. DefaultMaxRequestBytes if 0.
	MaxRequestBytes int
	// SendTimeout is lrs.send_timeout: a send that has not returned
	// within it (a control plane that reads nothing) ends the stream,
	// which is opened again. Required.
	SendTimeout time.Duration
	// After, if set, is closed when an earlier reporter of the store has
	// ended: Run waits for it, so that two reporters never send the same
	// periods.
	After <-chan struct{}
}

// LoadReporter is one group's load reports to the control plane: one LRS
// stream, opened again with backoff when it fails, that tells the store
// what the control plane asks and sends it the store's sums on the
// control plane's interval.
type LoadReporter struct {
	// Read-only after NewLoadReporter.
	opts LoadReporterOptions
	node *corepb.Node
	log  *slog.Logger

	mu     lockorder.Mutex[loadReporterMu]
	status LoadStatus // guarded by mu
}

// LoadStatus is what the admin endpoint shows of a group's load reports
// upstream.
type LoadStatus struct {
	Server     string    // the server reported to, or being tried
	Connected  bool      // the stream is open
	LastError  string    // why the last stream ended
	LastReport time.Time // when the last report was sent; zero if none yet
}

// NewLoadReporter returns a reporter; Run starts it. Its defaults are a
// Client's (New), on purpose: it talks to the same servers.
func NewLoadReporter(opts LoadReporterOptions) (*LoadReporter, error) {
	switch {
	case opts.Store == nil:
		return nil, errors.New("upstream: LoadReporterOptions.Store is required")
	case opts.Node == nil:
		return nil, errors.New("upstream: LoadReporterOptions.Node is required")
	case opts.Server == nil:
		return nil, errors.New("upstream: LoadReporterOptions.Server is required")
	case opts.SendTimeout <= 0:
		return nil, errors.New("upstream: LoadReporterOptions.SendTimeout must be positive")
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
	for _, v := range []**metrics.Value{&opts.Metrics.Streams, &opts.Metrics.Reports, &opts.Metrics.Blocked} {
		if *v == nil {
			*v = new(metrics.Value) // counted nowhere
		}
	}
	node := proto.Clone(opts.Node).(*corepb.Node)
	if !slices.Contains(node.ClientFeatures, featureSendAllClusters) {
		node.ClientFeatures = append(node.ClientFeatures, featureSendAllClusters)
	}
	return &LoadReporter{opts: opts, node: node,
		log: opts.Logger.With("component", "lrs", "group", opts.Group)}, nil
}

// Status returns the reporter's status.
func (lr *LoadReporter) Status() LoadStatus {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.status
}

func (lr *LoadReporter) setStatus(f func(*LoadStatus)) {
	lr.mu.Lock()
	f(&lr.status)
	lr.mu.Unlock()
}

// Run reports until ctx is done, then sends what is left on the stream if
// it is up. Periods end on the control plane's interval whether the
// stream is up or not (docs/architecture.md, invariant 6 "Outages are not
// outages"):
// those that cannot be sent stay in the store, and go out together once a
// stream is answered again. Every response starts a new period, as Envoy
// takes it. Reports wait for the stream's first response: the interval is
// the control plane's to set. When the group's stream for Clusters moves
// to another server (gRFC A71), the reports follow at the next period.
func (lr *LoadReporter) Run(ctx context.Context) {
	if lr.opts.After != nil {
		select {
		case <-lr.opts.After:
		case <-ctx.Done():
			return
		}
	}
	store := lr.opts.Store
	tick := time.NewTicker(store.Instructions().Interval)
	defer tick.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	var s *loadSession
	defer func() { lr.finish(s) }()
	attempt := 0
	failed := func(err error) {
		healthy := s != nil && s.answered
		lr.end(s, err)
		s = nil
		if healthy {
			attempt = 0 // the stream had worked: start the backoff again
		}
		retry.Reset(backoffDelay(lr.opts.Backoff, attempt))
		attempt++
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
			var err error
			if s, err = lr.open(ctx); err != nil {
				failed(err)
			}
		case resp, ok := <-s.responses():
			if !ok {
				failed(<-s.errc)
				continue
			}
			s.answered = true
			store.Instruct(loadstats.FromResponse(resp))
			tick.Reset(store.Instructions().Interval)
		case now := <-tick.C:
			store.Cut(now)
			if s == nil || !s.answered {
				continue
			}
			if cur, ok := lr.opts.Server(); ok && cur.Name != s.server.Name {
				lr.log.Info("the group's stream moved to another server; load reports follow (gRFC A71)",
					"from", s.server.Name, "to", cur.Name)
				lr.end(s, nil)
				s, attempt = nil, 0
				retry.Reset(0)
				continue
			}
			if err := lr.send(ctx, s, lr.opts.SendTimeout); err != nil {
				failed(err)
			}
		}
	}
}

// loadSession is one LRS stream.
type loadSession struct {
	server   Server
	st       grpc.BidiStreamingClient[lrspb.LoadStatsRequest, lrspb.LoadStatsResponse]
	cancel   context.CancelFunc
	resps    chan *lrspb.LoadStatsResponse // closed when receiving ends; then errc says why
	errc     chan error
	answered bool // a response arrived
	lastSent int  // the cluster stats of the last report part the stream took; owned by Run
}

// responses is the session's responses; nil (never ready) for no session.
func (s *loadSession) responses() <-chan *lrspb.LoadStatsResponse {
	if s == nil {
		return nil
	}
	return s.resps
}

// open opens a stream to the server the group uses now and sends the
// first request: the node alone ("load_stats/v3/lrs.proto"). The stream
// outlives ctx, so that Run can send a last report; ctx ends it only while
// it opens.
func (lr *LoadReporter) open(ctx context.Context) (*loadSession, error) {
	srv, ok := lr.opts.Server()
	if !ok {
		return nil, errors.New("upstream: no control plane serves the group's Clusters")
	}
	lr.setStatus(func(st *LoadStatus) { st.Server = srv.Name })
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	st, err := lrspb.NewLoadReportingServiceClient(srv.Conn).StreamLoadStats(sctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("upstream: open load reports to %s: %w", srv.Name, err)
	}
	s := &loadSession{server: srv, st: st, cancel: cancel, resps: make(chan *lrspb.LoadStatsResponse), errc: make(chan error, 1)}
	if err := s.sendWithin(ctx, &lrspb.LoadStatsRequest{Node: lr.node}, lr.opts.SendTimeout); err != nil {
		cancel()
		return nil, fmt.Errorf("upstream: open load reports to %s: %w", srv.Name, err)
	}
	go s.receive(sctx)
	lr.opts.Metrics.Streams.Inc()
	lr.setStatus(func(st *LoadStatus) { st.Connected, st.LastError = true, "" })
	return s, nil
}

// receive reads responses into s.resps until the stream ends, then writes
// why to errc and closes both.
func (s *loadSession) receive(ctx context.Context) {
	var err error
	defer func() {
		close(s.resps)
		s.errc <- err
		close(s.errc)
	}()
	for {
		var r *lrspb.LoadStatsResponse
		if r, err = s.st.Recv(); err != nil {
			return
		}
		select {
		case s.resps <- r:
		case <-ctx.Done():
			err = ctx.Err()
			return
		}
	}
}

// errSendBlocked is why a stream whose send did not return within
// lrs.send_timeout was ended.
var errSendBlocked = errors.New("the control plane read nothing for lrs.send_timeout")

// sendWithin sends req on the stream, bounded: if the send has not
// returned within bound, or within finalWait of ctx's end, it ends the
// stream (a control plane that stops reading would otherwise hold the
// send, and the reporter with it, forever: the stream's context outlives
// ctx). Past either bound it returns errSendBlocked. ctx's end alone does
// not end the stream: a report sent as Run stops must reach the control
// plane, and finish sends the last one on the same stream.
func (s *loadSession) sendWithin(ctx context.Context, req *lrspb.LoadStatsRequest, bound time.Duration) error {
	var blocked atomic.Bool
	end := func() { blocked.Store(true); s.cancel() }
	t := time.AfterFunc(bound, end)
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		late := time.NewTimer(min(bound, finalWait))
		defer late.Stop()
		select {
		case <-done:
		case <-late.C:
			end()
		}
	})
	err := s.st.Send(req)
	close(done)
	t.Stop()
	stop()
	if blocked.Load() {
		return errSendBlocked
	}
	return err
}

// send sends what the store holds pending, in parts no larger than
// MaxRequestBytes, each within bound (sendWithin). What a failed send did
// not carry stays pending: a send that blocks has not given its part to
// the stream (gRPC waits for the stream's write quota before taking a
// message). The part the stream took last before it is lost: a send
// blocks only while what was written before it is still unsent, so the
// control plane never read it, and the stream is ended. Its cluster stats
// are counted dropped (send_blocked); earlier parts may be lost too,
// uncounted, as a report in flight is when a control plane dies (LRS has
// no acknowledgement).
func (lr *LoadReporter) send(ctx context.Context, s *loadSession, bound time.Duration) error {
	stats, n := lr.opts.Store.Pending()
	if n == 0 {
		return nil
	}
	parts := packStats(stats, lr.opts.MaxRequestBytes)
	for i, part := range parts {
		if err := s.sendWithin(ctx, &lrspb.LoadStatsRequest{ClusterStats: part}, bound); err != nil {
			if errors.Is(err, errSendBlocked) {
				lr.opts.Metrics.Blocked.Add(int64(s.lastSent))
			}
			lr.opts.Store.Delivered(n, slices.Concat(parts[i:]...))
			return fmt.Errorf("upstream: send load report to %s: %w", s.server.Name, err)
		}
		s.lastSent = len(part)
		lr.opts.Metrics.Reports.Inc()
	}
	lr.opts.Store.Delivered(n, nil)
	lr.setStatus(func(st *LoadStatus) { st.LastReport = time.Now() })
	return nil
}

// packStats cuts stats into parts of at most max bytes each; a cluster's
// stats larger than that are cut first (cutStats). An empty report is one
// empty part: the control plane hears from the relay every period, as
// from Envoy.
func packStats(stats []*endpointpb.ClusterStats, max int) [][]*endpointpb.ClusterStats {
	parts := [][]*endpointpb.ClusterStats{nil}
	size := 0
	for _, cs := range slices.Concat(cutEach(stats, max)...) {
		n := proto.Size(cs) + statsOverhead
		if size > 0 && size+n > max {
			parts, size = append(parts, nil), 0
		}
		parts[len(parts)-1] = append(parts[len(parts)-1], cs)
		size += n
	}
	return parts
}

// end closes a session (nil: none), recording err as why.
func (lr *LoadReporter) end(s *loadSession, err error) {
	if s == nil {
		lr.setStatus(func(st *LoadStatus) { st.LastError = fmt.Sprint(err) })
		lr.log.Warn("load reports to the control plane failed; retrying", "error", err)
		return
	}
	s.cancel()
	for range s.resps { // until the receiver has ended
	}
	lr.opts.Metrics.Streams.Dec()
	lr.setStatus(func(st *LoadStatus) {
		st.Connected = false
		if err != nil {
			st.LastError = err.Error()
		}
	})
	if err != nil {
		lr.log.Warn("load report stream ended; reconnecting", "server", s.server.Name, "error", err, "answered", s.answered)
	}
}

// finalWait bounds the wait for the control plane to read the last report
// once the relay has closed its side.
const finalWait = time.Second

// finish sends a last report on s, if it is up and answered, closes its
// side and waits (finalWait at most) for the control plane to end it; then
// it closes s.
func (lr *LoadReporter) finish(s *loadSession) {
	if s == nil {
		return
	}
	if s.answered {
		lr.opts.Store.Cut(time.Now())
		// Run's context has ended: the last report has its own bound.
		if err := lr.send(context.Background(), s, min(lr.opts.SendTimeout, finalWait)); err == nil && s.st.CloseSend() == nil {
			t := time.NewTimer(finalWait)
			defer t.Stop()
		wait:
			for {
				select {
				case _, ok := <-s.resps:
					if !ok {
						break wait
					}
				case <-t.C:
					break wait
				}
			}
		}
	}
	lr.end(s, nil)
}

// ServerOf returns the server of the control plane that serves typeURL
// (its names other than xdstp ones) to the group fed by f, that the
// group's stream uses now or tries (gRFC A71); false if no control plane
// serves it (resource files). Load reports go to the control plane of the
// Clusters and follow its fallback.
func ServerOf(f Feed, typeURL string) (Server, bool) {
	if so, ok := f.(interface {
		serverOf(typeURL string) (Server, bool)
	}); ok {
		return so.serverOf(typeURL)
	}
	return Server{}, false
}

// serverOf is the server in use, or being tried.
func (c *Client) serverOf(string) (Server, bool) {
	name := c.Status().Server
	for _, s := range c.opts.Servers {
		if s.Name == name {
			return s, true
		}
	}
	return c.opts.Servers[0], true
}

// serverOf asks the stream to the upstream that serves typeURL, or, if the
// group has none open, names that upstream's first server.
func (f *routedFeed) serverOf(typeURL string) (Server, bool) {
	return f.serverOfRoute(f.r.routes.Of(typeURL, ""), typeURL)
}

// serverOfRoute is serverOf for upstream i (an index in the routes).
func (f *routedFeed) serverOfRoute(i int, typeURL string) (Server, bool) {
	if i < 0 || i >= len(f.members) {
		return Server{}, false
	}
	f.mu.Lock()
	var feed Feed
	if m := f.members[i]; slices.Contains(f.running, m) {
		feed = m.feed
	}
	f.mu.Unlock()
	if feed != nil {
		return ServerOf(feed, typeURL)
	}
	if a, ok := f.r.members[i].(*ADS); ok {
		return a.opts.Servers[0], true
	}
	return Server{}, false
}

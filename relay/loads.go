package relay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/loadstats"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// Load reports (LRS) flow the other way: clients report to the relay's
// load reporting service (downstream), each group's reports are summed in
// its loadstats.Store, and one reporter per group with reporting clients
// sends the sums to the control plane that serves the group's Clusters
// (upstream). The relay wires the two; the store decides.

// loadReports are the relay's load report metrics and its warning about
// zones. Read-only after New but for the Once.
type loadReports struct {
	downStreams, downReports *metrics.Value
	upStreams, upReports     *metrics.Value
	dropped, ignored         *metrics.Value
	droppedStats             *metrics.Vec // xdsrelay_lrs_dropped_stats_total{reason}
	saturated, clamped       *metrics.Value
	zones                    *sync.Once // the mixed-zones warning, once for the relay
}

// droppedReasons are the reason label's values of
// xdsrelay_lrs_dropped_stats_total, each series there at 0 from the start.
var droppedReasons = []string{loadstats.ReasonMaxNames, loadstats.ReasonInvalidValue, loadstats.ReasonMaxPendingBytes, loadstats.ReasonSendBlocked}

func newLoadReports(m *metrics.Registry) loadReports {
	streams := m.Gauge("xdsrelay_lrs_streams", "Open load report (LRS) streams, by side: downstream from clients, upstream to the control plane (one per group that has reporting clients).", "side")
	reports := m.Counter("xdsrelay_lrs_reports_total", "Load reports (LRS requests): received from clients (side downstream), sent to the control plane (side upstream).", "side")
	droppedStats := m.Counter("xdsrelay_lrs_dropped_stats_total",
		"Stats left out of load reports, by reason: max_names (a cluster's, locality's, endpoint's, named metric's or drop category's stats, or a gauge, past lrs.max_names names in a group's period), invalid_value (a load metric whose total is NaN, infinite or negative; the rest of the report is kept), max_pending_bytes (the cluster stats of the relay's held reports dropped past lrs.max_pending_bytes while the control plane could not be reached), send_blocked (the cluster stats of the report last written on a stream whose next send did not return within lrs.send_timeout: the control plane never read it, and the stream is ended and opened again).", "reason")
	for _, reason := range droppedReasons {
		droppedStats.With(reason) // at 0 from the start
	}
	return loadReports{
		downStreams: streams.With("downstream"),
		upStreams:   streams.With("upstream"),
		downReports: reports.With("downstream"),
		upReports:   reports.With("upstream"),
		dropped: m.Counter("xdsrelay_lrs_dropped_reports_total",
			"The relay's load reports (one per group and interval) dropped undelivered: past lrs.max_pending or lrs.max_pending_bytes while the control plane could not be reached, or left when a group ended.").With(),
		ignored: m.Counter("xdsrelay_lrs_ignored_stats_total",
			"Cluster stats in clients' load reports left out: for a cluster the client was not told to report, or that the control plane no longer asks for.").With(),
		droppedStats: droppedStats,
		clamped: m.Counter("xdsrelay_lrs_clamped_intervals_total",
			"Control plane load report instructions whose load_reporting_interval was below lrs.min_interval: raised to it, for clients and for the relay's own reports.").With(),
		saturated: m.Counter("xdsrelay_lrs_saturated_sums_total",
			"Sums of load reports held at their largest value (2^64-1, or the largest double) where they would have wrapped or become infinite: one client's count near 2^64 cannot cancel the others' load.").With(),
		zones: &sync.Once{},
	}
}

// downstream is what the downstream's load reporting service needs.
func (l loadReports) downstream(g downstream.LoadGroups) downstream.LoadOptions {
	return downstream.LoadOptions{Groups: g, Streams: l.downStreams, Reports: l.downReports}
}

// groupLoads is a group's load reports: its store and, while clients
// report (and cache.retention after the last one left), the reporter that
// sends the store's sums upstream.
type groupLoads struct {
	store *loadstats.Store // read-only after newGroupLoads

	// Guarded by Relay.mu.
	reporter   *upstream.LoadReporter // the running one; nil if none
	cancel     context.CancelFunc     // ends reporter
	done       chan struct{}          // closed when the last reporter started has ended; nil before the first
	noUpstream bool                   // no control plane serves the group's Clusters: nothing is sent
}

var _ downstream.LoadGroups = (*Relay)(nil)

// JoinLoads implements downstream.LoadGroups: it places node in its group
// as Join does, and makes sure the group's load reports go upstream.
func (r *Relay) JoinLoads(node *corepb.Node, from downstream.Caller) (*loadstats.Store, func(), error) {
	g, leave, err := r.join(node, from)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	if g.loads == nil {
		store, err := r.newLoadStore(g.id)
		if err != nil {
			r.mu.Unlock()
			leave()
			return nil, nil, err
		}
		g.loads = &groupLoads{store: store}
	}
	store, start := g.loads.store, r.reporterDueLocked(g)
	r.mu.Unlock()
	if start {
		// Where the reports go is read from every Cluster name the group
		// wants: off the relay's lock, which every group's Join takes
		// (docs/architecture.md, invariant 9 "Every bound is explicit").
		// The group stays while its client is in it.
		route, name := r.loadRoute(g)
		r.mu.Lock()
		r.startReporterLocked(g, route, name)
		r.mu.Unlock()
	}
	return store, leave, nil
}

// newLoadStore makes a group's store, its counts going to the relay's
// metrics.
func (r *Relay) newLoadStore(id string) (*loadstats.Store, error) {
	byLocality := slices.ContainsFunc(r.cfg.Upstream.GroupBy, func(f string) bool { return strings.HasPrefix(f, "locality.") })
	var clamped sync.Once // the group's log line
	return loadstats.New(loadstats.Options{
		Interval:    r.cfg.LRS.Interval,
		MinInterval: r.cfg.LRSMinInterval(),
		OnClamped: func(asked time.Duration) {
			r.loads.clamped.Inc()
			clamped.Do(func() {
				r.log.Warn("the control plane asked for a load reporting interval below lrs.min_interval: clients are told lrs.min_interval, and the relay reports at it (later ones for the group are counted in xdsrelay_lrs_clamped_intervals_total, not logged)",
					"group", id, "asked", asked, "min_interval", r.cfg.LRSMinInterval())

			})
		},
		MaxPending:      r.cfg.LRS.MaxPending,
		MaxNames:        r.cfg.LRS.MaxNames,
		MaxPendingBytes: r.cfg.LRS.MaxPendingBytes,
		ByLocality:      byLocality,
		OnMixedZones:    func(a, b *corepb.Locality) { r.warnMixedZones(id, a, b) },
		OnIgnored:       func(n int) { r.loads.ignored.Add(int64(n)) },
		OnDropped:       func(n int) { r.loads.dropped.Add(int64(n)) },
		OnDroppedStats:  func(reason string, n int) { r.loads.droppedStats.With(reason).Add(int64(n)) },
		OnSaturated:     func(n int) { r.loads.saturated.Add(int64(n)) },
	})
}

// reporterDueLocked says whether g's reporter is to be started: none runs,
// and the group's Clusters have a control plane.
func (r *Relay) reporterDueLocked(g *group) bool {
	l := g.loads
	return l.reporter == nil && !l.noUpstream && r.ctx.Err() == nil
}

// startReporterLocked starts the group's reporter, to upstream route (and
// the server of name there: see loadRoute), unless one runs: one may have
// started since the route was read. Without a control plane for the
// group's Clusters (resource files), clients are told that nothing is
// asked for, and nothing is sent.
func (r *Relay) startReporterLocked(g *group, route int, name string) {
	l := g.loads
	if !r.reporterDueLocked(g) {
		return
	}
	server := func() (upstream.Server, bool) { return upstream.ServerOfName(g.feed, resourcev3.ClusterType, name) }
	if _, ok := server(); !ok {
		l.noUpstream = true
		l.store.Instruct(loadstats.Instructions{Interval: r.cfg.LRS.Interval})
		return
	}
	u := r.upstreamAt(route)
	lr, err := upstream.NewLoadReporter(upstream.LoadReporterOptions{Store: l.store, Node: g.nodes[route], Server: server,
		Group: g.id, Metrics: upstream.LoadMetrics{Streams: r.loads.upStreams, Reports: r.loads.upReports,
			Blocked: r.loads.droppedStats.With(loadstats.ReasonSendBlocked)},
		Logger: r.log, Backoff: reconnectBackoff(u), MaxRequestBytes: u.MaxRequestBytes, SendTimeout: r.cfg.LRS.SendTimeout, After: l.done})
	if err != nil {
		r.log.Error("load reports", "group", g.id, "error", err)
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	l.reporter, l.cancel, l.done = lr, cancel, done
	r.goRun(func() {
		defer close(done)
		lr.Run(ctx)
	})
	r.log.Info("load reports to the control plane started", "group", g.id, "upstream", u.Name)
}

// loadRoute is the upstream the group's load reports go to (its index in
// the routes) and the name of a Cluster it serves for the group (""
// names the type): the upstream that serves the Clusters the group wants,
// by their names, so that the load of xdstp Clusters goes to their
// authority's upstream (docs/control-planes.md, "Several control planes").
// When the group wants Clusters of several upstreams, or none yet, it is
// the one that serves the type: a group has one load reporter, which sends
// the load of every cluster to one control plane (docs/load-reports.md).
// It reads every Cluster name the group wants: call it without Relay.mu.
func (r *Relay) loadRoute(g *group) (int, string) {
	if r.routes == nil {
		return 0, ""
	}
	byType := r.routes.Of(resourcev3.ClusterType, "")
	route, name := upstream.Unroutable, ""
	for _, n := range g.cache.TypeInterest(resourcev3.ClusterType).Names {
		switch i := r.routes.Of(resourcev3.ClusterType, n); {
		case i == upstream.Unroutable:
		case route == upstream.Unroutable:
			route, name = i, n
		case i != route:
			r.log.Warn("the group's Clusters come from several upstreams: its load reports go to the one that serves the type",
				"group", g.id, "upstream", r.routes.Name(byType))
			return byType, ""
		}
	}
	if route == upstream.Unroutable {
		return byType, ""
	}
	return route, name
}

// upstreamAt is the configuration of upstream i of the routes: the default
// for 0, upstreams[i-1] otherwise.
func (r *Relay) upstreamAt(i int) UpstreamConfig {
	if i > 0 {
		return r.cfg.Upstreams[i-1]
	}
	return r.cfg.Upstream.UpstreamConfig
}

// sweepLoadsLocked stops the group's reporter once no client has reported
// for cache.retention (it sends what is left as it ends), and reports
// whether the group's load reports are over: none running or ending.
func (r *Relay) sweepLoadsLocked(g *group) (over bool) {
	l := g.loads
	if l == nil {
		return true
	}
	since, idle := l.store.Idle()
	if !idle {
		return false
	}
	if l.reporter != nil && time.Since(since) >= r.cfg.Cache.Retention {
		l.cancel()
		l.reporter, l.cancel = nil, nil
		r.log.Info("load reports to the control plane stopped: no client reported for cache.retention", "group", g.id)
	}
	if l.reporter != nil {
		return false
	}
	select {
	case <-l.done:
		return true
	default:
		return l.done == nil
	}
}

// endLoads drops what an ended group's store could not deliver, counted
// (OnDropped, called with no lock held). g is out of Relay.groups: its
// loads change no more.
func endLoads(g *group) {
	if g.loads != nil {
		g.loads.store.Discard()
	}
}

// warnMixedZones warns, once for the relay, that clients of one group
// report load from different zones while upstream.group_by holds no
// locality field: the control plane sees their load as the group node's.
func (r *Relay) warnMixedZones(id string, a, b *corepb.Locality) {
	r.loads.zones.Do(func() {
		r.warnings.warn(r.log, "upstream.group_by", "docs/load-reports.md", fmt.Sprintf(
			"clients of group %q report load from different zones (%s and %s) and upstream.group_by has no locality.* field: the control plane sees their load summed under one node, from one place",
			id, zoneName(a), zoneName(b)))
	})
}

func zoneName(l *corepb.Locality) string {
	return fmt.Sprintf("region %q zone %q", l.GetRegion(), l.GetZone())
}

// debugLoads is a group's load reports on /debug/groups.
type debugLoads struct {
	Clients             int        `json:"clients"`                        // streams reporting
	Interval            string     `json:"interval"`                       // what clients are told
	SendAllClusters     bool       `json:"send_all_clusters"`              // what clients are told
	Clusters            []string   `json:"clusters"`                       // what clients are told
	EndpointGranularity bool       `json:"endpoint_granularity,omitempty"` // what clients are told
	Answered            bool       `json:"control_plane_answered"`         // false: the relay's own instructions
	Pending             int        `json:"pending_reports"`                // the relay's reports not delivered
	PendingBytes        int        `json:"pending_bytes"`                  // their encoded size (lrs.max_pending_bytes)
	Stream              *debugLRS  `json:"upstream_stream"`                // nil: none (no reporting clients for cache.retention, or no control plane)
	LastReport          *time.Time `json:"last_report,omitempty"`
}

type debugLRS struct {
	Server    string `json:"server"`
	Connected bool   `json:"connected"`
	LastError string `json:"last_error,omitempty"`
}

// loadsOf is what /debug/groups shows of g's load reports; nil if none.
func (r *Relay) loadsOf(g *group) *debugLoads {
	r.mu.Lock()
	l := g.loads
	var lr *upstream.LoadReporter
	if l != nil {
		lr = l.reporter
	}
	r.mu.Unlock()
	if l == nil {
		return nil
	}
	st := l.store.Status()
	d := &debugLoads{Clients: st.Reporters, Interval: st.Instructions.Interval.String(), SendAllClusters: st.Instructions.SendAll,
		Clusters: append([]string{}, st.Instructions.Clusters...), EndpointGranularity: st.Instructions.EndpointGranularity,
		Answered: st.Answered, Pending: st.Pending, PendingBytes: st.PendingBytes}
	if lr != nil {
		ls := lr.Status()
		d.Stream = &debugLRS{Server: ls.Server, Connected: ls.Connected, LastError: ls.LastError}
		if !ls.LastReport.IsZero() {
			d.LastReport = &ls.LastReport
		}
	}
	return d
}

// lrsMinIntervalDefault is lrs.min_interval when it is not set (0), unless
// lrs.interval is shorter: a floor of 1s keeps a control plane from asking
// for reports at a rate no one needs, and a relay configured to tell its
// clients a shorter interval takes that one as the floor.
const lrsMinIntervalDefault = time.Second

// LRSMinInterval is lrs.min_interval as the relay uses it: as set, or, when
// 0, lrsMinIntervalDefault or lrs.interval, the shorter.
func (c *Config) LRSMinInterval() time.Duration {
	if c.LRS.MinInterval > 0 {
		return c.LRS.MinInterval
	}
	return min(lrsMinIntervalDefault, c.LRS.Interval)
}

// validateLRS checks the lrs.* keys.
func (c *Config) validateLRS(p *problems) {
	l := &c.LRS
	if l.Interval <= 0 {
		p.addf("lrs.interval: must be positive, got %s", l.Interval)
	}
	if l.MinInterval < 0 || l.Interval > 0 && l.MinInterval > l.Interval {
		p.addf("lrs.min_interval: must be at most lrs.interval (%s), or 0 for %s or lrs.interval if shorter; got %s", l.Interval, lrsMinIntervalDefault, l.MinInterval)
	}
	if l.MaxPending < 1 {
		p.addf("lrs.max_pending: must be at least 1, got %d", l.MaxPending)
	}
	if l.SendTimeout <= 0 {
		p.addf("lrs.send_timeout: must be positive, got %s", l.SendTimeout)
	}
	if l.MaxPendingBytes < 1 {
		p.addf("lrs.max_pending_bytes: must be at least 1, got %d", l.MaxPendingBytes)
	}
	if l.MaxNames < 1 {
		p.addf("lrs.max_names: must be at least 1, got %d", l.MaxNames)
	}
}

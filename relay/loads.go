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
	"github.com/xdsrelay/xdsrelay/internal/xds"
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
	zones                    *sync.Once // the mixed-zones warning, once for the relay
}

func newLoadReports(m *metrics.Registry) loadReports {
	streams := m.Gauge("xdsrelay_lrs_streams", "Open load report (LRS) streams, by side: downstream from clients, upstream to the control plane (one per group that has reporting clients).", "side")
	reports := m.Counter("xdsrelay_lrs_reports_total", "Load reports (LRS requests): received from clients (side downstream), sent to the control plane (side upstream).", "side")
	return loadReports{
		downStreams: streams.With("downstream"),
		upStreams:   streams.With("upstream"),
		downReports: reports.With("downstream"),
		upReports:   reports.With("upstream"),
		dropped: m.Counter("xdsrelay_lrs_dropped_reports_total",
			"The relay's load reports (one per group and interval) dropped undelivered: past lrs.max_pending while the control plane could not be reached, or left when a group ended.").With(),
		ignored: m.Counter("xdsrelay_lrs_ignored_stats_total",
			"Cluster stats in clients' load reports left out: for a cluster the client was not told to report, or that the control plane no longer asks for.").With(),
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
func (r *Relay) JoinLoads(node *corepb.Node) (*loadstats.Store, func(), error) {
	_, leave, err := r.Join(node)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	g := r.groups[GroupKey(node, r.cfg.Upstream.GroupBy)] // there while the client is in it
	if g.loads == nil {
		store, err := r.newLoadStore(g.key)
		if err != nil {
			r.mu.Unlock()
			leave()
			return nil, nil, err
		}
		g.loads = &groupLoads{store: store}
	}
	r.startReporterLocked(g)
	store := g.loads.store
	r.mu.Unlock()
	return store, leave, nil
}

// newLoadStore makes a group's store, its counts going to the relay's
// metrics.
func (r *Relay) newLoadStore(key string) (*loadstats.Store, error) {
	byLocality := slices.ContainsFunc(r.cfg.Upstream.GroupBy, func(f string) bool { return strings.HasPrefix(f, "locality.") })
	return loadstats.New(loadstats.Options{
		Interval:     r.cfg.LRS.Interval,
		MaxPending:   r.cfg.LRS.MaxPending,
		ByLocality:   byLocality,
		OnMixedZones: func(a, b *corepb.Locality) { r.warnMixedZones(key, a, b) },
		OnIgnored:    func(n int) { r.loads.ignored.Add(int64(n)) },
		OnDropped:    func(n int) { r.loads.dropped.Add(int64(n)) },
	})
}

// startReporterLocked starts the group's reporter unless one runs. Without
// a control plane for the group's Clusters (resource files), clients are
// told that nothing is asked for, and nothing is sent.
func (r *Relay) startReporterLocked(g *group) {
	l := g.loads
	if l.reporter != nil || l.noUpstream || r.ctx.Err() != nil {
		return
	}
	route, name := r.loadRoute(g)
	server := func() (upstream.Server, bool) { return upstream.ServerOfName(g.feed, resourcev3.ClusterType, name) }
	if _, ok := server(); !ok {
		l.noUpstream = true
		l.store.Instruct(loadstats.Instructions{Interval: r.cfg.LRS.Interval})
		return
	}
	u := r.upstreamAt(route)
	lr, err := upstream.NewLoadReporter(upstream.LoadReporterOptions{Store: l.store, Node: g.nodes[route], Server: server,
		Group: g.key, Metrics: upstream.LoadMetrics{Streams: r.loads.upStreams, Reports: r.loads.upReports},
		Logger: r.log, Backoff: reconnectBackoff(u), MaxRequestBytes: u.MaxRequestBytes, After: l.done})
	if err != nil {
		r.log.Error("load reports", "group", xds.Clip(g.key), "error", err)
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	l.reporter, l.cancel, l.done = lr, cancel, done
	r.goRun(func() {
		defer close(done)
		lr.Run(ctx)
	})
	r.log.Info("load reports to the control plane started", "group", xds.Clip(g.key), "upstream", u.Name)
}

// loadRoute is the upstream the group's load reports go to (its index in
// the routes) and the name of a Cluster it serves for the group (""
// names the type): the upstream that serves the Clusters the group wants,
// by their names, so that the load of xdstp Clusters goes to their
// authority's upstream (docs/control-planes.md, "Several control planes").
// When the group wants Clusters of several upstreams, or none yet, it is
// the one that serves the type: a group has one load reporter, which sends
// the load of every cluster to one control plane (docs/load-reports.md).
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
				"group", xds.Clip(g.key), "upstream", r.routes.Name(byType))
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
		r.log.Info("load reports to the control plane stopped: no client reported for cache.retention", "group", xds.Clip(g.key))
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
func (r *Relay) warnMixedZones(key string, a, b *corepb.Locality) {
	r.loads.zones.Do(func() {
		r.warnings.warn(r.log, "upstream.group_by", "docs/load-reports.md", fmt.Sprintf(
			"clients of group %q report load from different zones (%s and %s) and upstream.group_by has no locality.* field: the control plane sees their load summed under one node, from one place",
			xds.Clip(key), zoneName(a), zoneName(b)))
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
		Answered: st.Answered, Pending: st.Pending}
	if lr != nil {
		ls := lr.Status()
		d.Stream = &debugLRS{Server: ls.Server, Connected: ls.Connected, LastError: ls.LastError}
		if !ls.LastReport.IsZero() {
			d.LastReport = &ls.LastReport
		}
	}
	return d
}

// validateLRS checks the lrs.* keys.
func (c *Config) validateLRS() error {
	switch {
	case c.LRS.Interval <= 0:
		return fmt.Errorf("lrs.interval: must be positive, got %s", c.LRS.Interval)
	case c.LRS.MaxPending < 1:
		return fmt.Errorf("lrs.max_pending: must be at least 1, got %d", c.LRS.MaxPending)
	}
	return nil
}

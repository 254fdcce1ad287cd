package loadstats

import (
	"cmp"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strings"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// clusterKey is what a report's stats belong to: a cluster and its EDS
// service name (ClusterStats.cluster_name, cluster_service_name).
type clusterKey struct{ name, service string }

// localityKey is an endpoint group within a cluster: a locality and its
// priority (UpstreamLocalityStats.locality, priority).
type localityKey struct {
	region, zone, subZone string
	priority              uint32
}

func localityOf(s *endpointpb.UpstreamLocalityStats) localityKey {
	l := s.GetLocality()
	return localityKey{l.GetRegion(), l.GetZone(), l.GetSubZone(), s.GetPriority()}
}

func (k localityKey) compare(o localityKey) int {
	return cmp.Or(cmp.Compare(k.priority, o.priority), strings.Compare(k.region, o.region),
		strings.Compare(k.zone, o.zone), strings.Compare(k.subZone, o.subZone))
}

// endpointKey is an endpoint's address as a map key: its deterministic
// encoding.
func endpointKey(a *corepb.Address) string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a)
	return string(b)
}

// tally counts what summing did to a report's numbers, for the store's
// callbacks: names refused past the bound, metric values refused, sums
// held at their edge. Read and reset under the store's lock.
type tally struct {
	refused   int // stats left out past Options.MaxNames (ReasonMaxNames)
	invalid   int // load metrics refused: NaN, infinite or negative (ReasonInvalidValue)
	saturated int // sums held at their largest value instead of wrapping
}

// add returns a+b, or the largest uint64 (counted) where it would wrap: a
// client's 2^64-1 must not cancel the others' load.
func (t *tally) add(a, b uint64) uint64 {
	sum, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		t.saturated++
		return math.MaxUint64
	}
	return sum
}

// addFloat returns a+b, or the largest float64 (counted) where it would be
// infinite; a and b are finite and not negative (validMetric).
func (t *tally) addFloat(a, b float64) float64 {
	sum := a + b
	if math.IsInf(sum, 0) {
		t.saturated++
		return math.MaxFloat64
	}
	return sum
}

// metricSum is a load metric summed over reports: the requests that carried
// it and the total of its values (EndpointLoadMetricStats and
// UnnamedEndpointLoadMetricStats).
type metricSum struct {
	set   bool // some report carried it
	n     uint64
	total float64
}

type metricStats interface {
	GetNumRequestsFinishedWithMetric() uint64
	GetTotalMetricValue() float64
}

// validMetric reports whether a load metric can be summed: a NaN would
// erase the group's sum, an infinity or a negative total swamp or cancel
// it. One that cannot is refused and counted, and the rest of the report
// kept.
func (t *tally) validMetric(s metricStats) bool {
	if v := s.GetTotalMetricValue(); math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		t.invalid++
		return false
	}
	return true
}

func (m *metricSum) add(s metricStats, t *tally) {
	m.set = true
	m.n = t.add(m.n, s.GetNumRequestsFinishedWithMetric())
	m.total = t.addFloat(m.total, s.GetTotalMetricValue())
}

// addUnnamed adds one of a locality's utilizations, if it is there and
// valid.
func (m *metricSum) addUnnamed(u *endpointpb.UnnamedEndpointLoadMetricStats, t *tally) {
	if u != nil && t.validMetric(u) {
		m.add(u, t)
	}
}

func (m *metricSum) unnamed() *endpointpb.UnnamedEndpointLoadMetricStats {
	if !m.set {
		return nil
	}
	return &endpointpb.UnnamedEndpointLoadMetricStats{NumRequestsFinishedWithMetric: m.n, TotalMetricValue: m.total}
}

// namedMetrics are the load_metric_stats, by metric name.
type namedMetrics map[string]*metricSum

// addNamed adds load_metric_stats to nm: a name new to it takes one of the
// period's names (room).
func (s *sums) addNamed(nm *namedMetrics, stats []*endpointpb.EndpointLoadMetricStats) {
	for _, st := range stats {
		if !s.t.validMetric(st) {
			continue
		}
		m := (*nm)[st.GetMetricName()]
		if m == nil {
			if !s.room() {
				continue
			}
			if *nm == nil {
				*nm = namedMetrics{}
			}
			m = &metricSum{}
			(*nm)[st.GetMetricName()] = m
		}
		m.add(st, &s.t)
	}
}

func (nm namedMetrics) proto() []*endpointpb.EndpointLoadMetricStats {
	if len(nm) == 0 {
		return nil
	}
	out := make([]*endpointpb.EndpointLoadMetricStats, 0, len(nm))
	for _, name := range slices.Sorted(maps.Keys(nm)) {
		m := nm[name]
		out = append(out, &endpointpb.EndpointLoadMetricStats{MetricName: name, NumRequestsFinishedWithMetric: m.n, TotalMetricValue: m.total})
	}
	return out
}

// wide is a sum of gauges in 128 bits: it never wraps (it would take 2^64
// clients), so that taking a client's gauge out again is exact however
// large the others' were. It is held at 2^64-1, counted, only when built
// into a report.
type wide struct{ hi, lo uint64 }

func (w wide) plus(o wide) wide {
	lo, carry := bits.Add64(w.lo, o.lo, 0)
	hi, _ := bits.Add64(w.hi, o.hi, carry)
	return wide{hi, lo}
}

func (w wide) minus(o wide) wide {
	lo, borrow := bits.Sub64(w.lo, o.lo, 0)
	hi, _ := bits.Sub64(w.hi, o.hi, borrow)
	return wide{hi, lo}
}

// uint64 is w, or 2^64-1 (counted) if it is larger.
func (w wide) uint64(t *tally) uint64 {
	if w.hi != 0 {
		t.saturated++
		return math.MaxUint64
	}
	return w.lo
}

// gauge is what a report says of the present rather than of its interval:
// summed as each client's latest value, not over time.
type gauge struct {
	inProgress  wide // total_requests_in_progress
	activeConns wide // total_active_connections (localities only)
}

func (g gauge) zero() bool { return g == gauge{} }

func (g gauge) plus(o gauge) gauge {
	return gauge{g.inProgress.plus(o.inProgress), g.activeConns.plus(o.activeConns)}
}

func (g gauge) minus(o gauge) gauge {
	return gauge{g.inProgress.minus(o.inProgress), g.activeConns.minus(o.activeConns)}
}

// gaugeKey is where a gauge belongs: a locality's own, or one endpoint's
// in it.
type gaugeKey struct {
	cluster  clusterKey
	locality localityKey
	endpoint string // endpointKey; "" for the locality's own
}

// gaugeEntry is one gauge of a report. ep is the endpoint's stats it came
// from (their address and metadata), for an endpoint's.
type gaugeEntry struct {
	key gaugeKey
	g   gauge
	ep  *endpointpb.UpstreamEndpointStats
}

// gaugesOf appends the non-zero gauges of cs to out; those of endpoints
// only if endpoints.
func gaugesOf(out []gaugeEntry, cs *endpointpb.ClusterStats, endpoints bool) []gaugeEntry {
	ck := clusterKey{cs.GetClusterName(), cs.GetClusterServiceName()}
	for _, ls := range cs.GetUpstreamLocalityStats() {
		lk := localityOf(ls)
		if g := (gauge{wide{lo: ls.GetTotalRequestsInProgress()}, wide{lo: ls.GetTotalActiveConnections()}}); !g.zero() {
			out = append(out, gaugeEntry{key: gaugeKey{ck, lk, ""}, g: g})
		}
		if !endpoints {
			continue
		}
		for _, es := range ls.GetUpstreamEndpointStats() {
			if n := es.GetTotalRequestsInProgress(); n > 0 {
				out = append(out, gaugeEntry{key: gaugeKey{ck, lk, endpointKey(es.GetAddress())}, g: gauge{inProgress: wide{lo: n}}, ep: es})
			}
		}
	}
	return out
}

// sums are the counts of one period, per cluster; at the end of the period
// the gauges are folded in and the whole is built into ClusterStats.
//
// Every distinct name the period holds (a cluster, a locality, an
// endpoint, a named metric, a drop category) takes one of max: past it, a
// report's stats that would add a name are left out and counted
// (ReasonMaxNames), so that a period's memory is bounded whatever clients
// send. Names already held are still summed.
type sums struct {
	clusters map[clusterKey]*clusterSums
	names    int // distinct names held
	max      int // bound on names; 0 for none (merging held periods)
	t        tally
}

func newSums(max int) *sums { return &sums{clusters: map[clusterKey]*clusterSums{}, max: max} }

// room takes one name for a new key, and reports whether there was one
// (a refusal is counted).
func (s *sums) room() bool {
	if s.max > 0 && s.names >= s.max {
		s.t.refused++
		return false
	}
	s.names++
	return true
}

type clusterSums struct {
	drops      uint64            // total_dropped_requests
	byCategory map[string]uint64 // dropped_requests
	localities map[localityKey]*localitySums
}

type localitySums struct {
	succ, errs, issued  uint64
	newConns, failConns uint64
	cpu, mem, app       metricSum
	named               namedMetrics
	endpoints           map[string]*endpointSums // by endpointKey; with endpoint granularity
	gauge               gauge                    // folded in at the period's end
}

type endpointSums struct {
	ep                 *endpointpb.UpstreamEndpointStats // the first seen: its address and metadata
	succ, errs, issued uint64
	named              namedMetrics
	inProgress         wide // folded in at the period's end
}

// cluster returns k's sums, nil if k is new and there is no room for it.
func (s *sums) cluster(k clusterKey) *clusterSums {
	c := s.clusters[k]
	if c == nil && s.room() {
		c = &clusterSums{localities: map[localityKey]*localitySums{}}
		s.clusters[k] = c
	}
	return c
}

// locality returns k's sums in c, nil if k is new and there is no room.
func (s *sums) locality(c *clusterSums, k localityKey) *localitySums {
	l := c.localities[k]
	if l == nil && s.room() {
		l = &localitySums{}
		c.localities[k] = l
	}
	return l
}

// endpoint returns the sums of the endpoint keyed key in l, nil if it is
// new and there is no room.
func (s *sums) endpoint(l *localitySums, key string, es *endpointpb.UpstreamEndpointStats) *endpointSums {
	e := l.endpoints[key]
	if e == nil && s.room() {
		if l.endpoints == nil {
			l.endpoints = map[string]*endpointSums{}
		}
		e = &endpointSums{ep: es}
		l.endpoints[key] = e
	}
	return e
}

// has reports whether the gauge's place is in the sums: a gauge goes only
// where its report's counts were taken.
func (s *sums) has(k gaugeKey) bool {
	c := s.clusters[k.cluster]
	if c == nil {
		return false
	}
	l := c.localities[k.locality]
	if l == nil || k.endpoint == "" {
		return l != nil
	}
	_, ok := l.endpoints[k.endpoint]
	return ok
}

// add adds the counts of cs (not its gauges), and its endpoints' if
// endpoints.
func (s *sums) add(cs *endpointpb.ClusterStats, endpoints bool) {
	c := s.cluster(clusterKey{cs.GetClusterName(), cs.GetClusterServiceName()})
	if c == nil {
		return
	}
	c.drops = s.t.add(c.drops, cs.GetTotalDroppedRequests())
	for _, d := range cs.GetDroppedRequests() {
		n, ok := c.byCategory[d.GetCategory()]
		if !ok && !s.room() {
			continue
		}
		if c.byCategory == nil {
			c.byCategory = map[string]uint64{}
		}
		c.byCategory[d.GetCategory()] = s.t.add(n, d.GetDroppedCount())
	}
	for _, ls := range cs.GetUpstreamLocalityStats() {
		if l := s.locality(c, localityOf(ls)); l != nil {
			s.addLocality(l, ls, endpoints)
		}
	}
}

func (s *sums) addLocality(l *localitySums, ls *endpointpb.UpstreamLocalityStats, endpoints bool) {
	t := &s.t
	l.succ = t.add(l.succ, ls.GetTotalSuccessfulRequests())
	l.errs = t.add(l.errs, ls.GetTotalErrorRequests())
	l.issued = t.add(l.issued, ls.GetTotalIssuedRequests())
	l.newConns = t.add(l.newConns, ls.GetTotalNewConnections())
	l.failConns = t.add(l.failConns, ls.GetTotalFailConnections())
	l.cpu.addUnnamed(ls.GetCpuUtilization(), t)
	l.mem.addUnnamed(ls.GetMemUtilization(), t)
	l.app.addUnnamed(ls.GetApplicationUtilization(), t)
	s.addNamed(&l.named, ls.GetLoadMetricStats())
	if !endpoints {
		return
	}
	for _, es := range ls.GetUpstreamEndpointStats() {
		e := s.endpoint(l, endpointKey(es.GetAddress()), es)
		if e == nil {
			continue
		}
		e.succ = t.add(e.succ, es.GetTotalSuccessfulRequests())
		e.errs = t.add(e.errs, es.GetTotalErrorRequests())
		e.issued = t.add(e.issued, es.GetTotalIssuedRequests())
		s.addNamed(&e.named, es.GetLoadMetricStats())
	}
}

// fold adds a gauge to what the period's end reports; one whose place has
// no room is left out (counted).
func (s *sums) fold(e gaugeEntry) {
	c := s.cluster(e.key.cluster)
	if c == nil {
		return
	}
	l := s.locality(c, e.key.locality)
	if l == nil {
		return
	}
	if e.key.endpoint == "" {
		l.gauge = l.gauge.plus(e.g)
		return
	}
	if ep := s.endpoint(l, e.key.endpoint, e.ep); ep != nil {
		ep.inProgress = ep.inProgress.plus(e.g.inProgress)
	}
}

// build turns the sums into ClusterStats over interval, sorted by cluster
// and locality, keeping the clusters that wants accepts (all, if nil) and
// endpoints only if endpoints. It returns how many clusters it left out.
func (s *sums) build(wants func(string) bool, interval time.Duration, endpoints bool) (out []*endpointpb.ClusterStats, left int) {
	keys := slices.SortedFunc(maps.Keys(s.clusters), func(a, b clusterKey) int {
		return cmp.Or(strings.Compare(a.name, b.name), strings.Compare(a.service, b.service))
	})
	for _, k := range keys {
		if wants != nil && !wants(k.name) {
			left++
			continue
		}
		out = append(out, s.clusters[k].proto(k, interval, endpoints, &s.t))
	}
	return out, left
}

func (c *clusterSums) proto(k clusterKey, interval time.Duration, endpoints bool, t *tally) *endpointpb.ClusterStats {
	cs := &endpointpb.ClusterStats{ClusterName: k.name, ClusterServiceName: k.service,
		TotalDroppedRequests: c.drops, LoadReportInterval: durationpb.New(interval)}
	for _, cat := range slices.Sorted(maps.Keys(c.byCategory)) {
		cs.DroppedRequests = append(cs.DroppedRequests, &endpointpb.ClusterStats_DroppedRequests{Category: cat, DroppedCount: c.byCategory[cat]})
	}
	for _, lk := range slices.SortedFunc(maps.Keys(c.localities), localityKey.compare) {
		cs.UpstreamLocalityStats = append(cs.UpstreamLocalityStats, c.localities[lk].proto(lk, endpoints, t))
	}
	return cs
}

func (l *localitySums) proto(k localityKey, endpoints bool, t *tally) *endpointpb.UpstreamLocalityStats {
	ls := &endpointpb.UpstreamLocalityStats{
		Locality:                &corepb.Locality{Region: k.region, Zone: k.zone, SubZone: k.subZone},
		Priority:                k.priority,
		TotalSuccessfulRequests: l.succ,
		TotalErrorRequests:      l.errs,
		TotalIssuedRequests:     l.issued,
		TotalNewConnections:     l.newConns,
		TotalFailConnections:    l.failConns,
		TotalRequestsInProgress: l.gauge.inProgress.uint64(t),
		TotalActiveConnections:  l.gauge.activeConns.uint64(t),
		CpuUtilization:          l.cpu.unnamed(),
		MemUtilization:          l.mem.unnamed(),
		ApplicationUtilization:  l.app.unnamed(),
		LoadMetricStats:         l.named.proto(),
	}
	if !endpoints {
		return ls
	}
	for _, key := range slices.Sorted(maps.Keys(l.endpoints)) {
		e := l.endpoints[key]
		ls.UpstreamEndpointStats = append(ls.UpstreamEndpointStats, &endpointpb.UpstreamEndpointStats{
			Address:                 e.ep.GetAddress(),
			Metadata:                e.ep.GetMetadata(),
			TotalSuccessfulRequests: e.succ,
			TotalErrorRequests:      e.errs,
			TotalIssuedRequests:     e.issued,
			TotalRequestsInProgress: e.inProgress.uint64(t),
			LoadMetricStats:         e.named.proto(),
		})
	}
	return ls
}

package loadstats

import (
	"cmp"
	"maps"
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

func (m *metricSum) add(s metricStats) {
	m.set = true
	m.n += s.GetNumRequestsFinishedWithMetric()
	m.total += s.GetTotalMetricValue()
}

func (m *metricSum) unnamed() *endpointpb.UnnamedEndpointLoadMetricStats {
	if !m.set {
		return nil
	}
	return &endpointpb.UnnamedEndpointLoadMetricStats{NumRequestsFinishedWithMetric: m.n, TotalMetricValue: m.total}
}

// namedMetrics are the load_metric_stats, by metric name.
type namedMetrics map[string]*metricSum

func (nm *namedMetrics) add(stats []*endpointpb.EndpointLoadMetricStats) {
	for _, s := range stats {
		if *nm == nil {
			*nm = namedMetrics{}
		}
		m := (*nm)[s.GetMetricName()]
		if m == nil {
			m = &metricSum{}
			(*nm)[s.GetMetricName()] = m
		}
		m.add(s)
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

// gauge is what a report says of the present rather than of its interval:
// summed as each client's latest value, not over time.
type gauge struct {
	inProgress  uint64 // total_requests_in_progress
	activeConns uint64 // total_active_connections (localities only)
}

func (g gauge) zero() bool { return g == gauge{} }

func (g gauge) plus(o gauge) gauge {
	return gauge{g.inProgress + o.inProgress, g.activeConns + o.activeConns}
}

func (g gauge) minus(o gauge) gauge {
	return gauge{g.inProgress - o.inProgress, g.activeConns - o.activeConns}
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
		if g := (gauge{ls.GetTotalRequestsInProgress(), ls.GetTotalActiveConnections()}); !g.zero() {
			out = append(out, gaugeEntry{key: gaugeKey{ck, lk, ""}, g: g})
		}
		if !endpoints {
			continue
		}
		for _, es := range ls.GetUpstreamEndpointStats() {
			if n := es.GetTotalRequestsInProgress(); n > 0 {
				out = append(out, gaugeEntry{key: gaugeKey{ck, lk, endpointKey(es.GetAddress())}, g: gauge{inProgress: n}, ep: es})
			}
		}
	}
	return out
}

// sums are the counts of one period, per cluster; at the end of the period
// the gauges are folded in and the whole is built into ClusterStats.
type sums map[clusterKey]*clusterSums

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
	inProgress         uint64 // folded in at the period's end
}

func (s sums) cluster(k clusterKey) *clusterSums {
	c := s[k]
	if c == nil {
		c = &clusterSums{localities: map[localityKey]*localitySums{}}
		s[k] = c
	}
	return c
}

func (c *clusterSums) locality(k localityKey) *localitySums {
	l := c.localities[k]
	if l == nil {
		l = &localitySums{}
		c.localities[k] = l
	}
	return l
}

func (l *localitySums) endpoint(key string, es *endpointpb.UpstreamEndpointStats) *endpointSums {
	if l.endpoints == nil {
		l.endpoints = map[string]*endpointSums{}
	}
	e := l.endpoints[key]
	if e == nil {
		e = &endpointSums{ep: es}
		l.endpoints[key] = e
	}
	return e
}

// add adds the counts of cs (not its gauges), and its endpoints' if
// endpoints.
func (s sums) add(cs *endpointpb.ClusterStats, endpoints bool) {
	c := s.cluster(clusterKey{cs.GetClusterName(), cs.GetClusterServiceName()})
	c.drops += cs.GetTotalDroppedRequests()
	for _, d := range cs.GetDroppedRequests() {
		if c.byCategory == nil {
			c.byCategory = map[string]uint64{}
		}
		c.byCategory[d.GetCategory()] += d.GetDroppedCount()
	}
	for _, ls := range cs.GetUpstreamLocalityStats() {
		l := c.locality(localityOf(ls))
		l.succ += ls.GetTotalSuccessfulRequests()
		l.errs += ls.GetTotalErrorRequests()
		l.issued += ls.GetTotalIssuedRequests()
		l.newConns += ls.GetTotalNewConnections()
		l.failConns += ls.GetTotalFailConnections()
		if u := ls.GetCpuUtilization(); u != nil {
			l.cpu.add(u)
		}
		if u := ls.GetMemUtilization(); u != nil {
			l.mem.add(u)
		}
		if u := ls.GetApplicationUtilization(); u != nil {
			l.app.add(u)
		}
		l.named.add(ls.GetLoadMetricStats())
		if !endpoints {
			continue
		}
		for _, es := range ls.GetUpstreamEndpointStats() {
			e := l.endpoint(endpointKey(es.GetAddress()), es)
			e.succ += es.GetTotalSuccessfulRequests()
			e.errs += es.GetTotalErrorRequests()
			e.issued += es.GetTotalIssuedRequests()
			e.named.add(es.GetLoadMetricStats())
		}
	}
}

// fold adds a gauge to what the period's end reports.
func (s sums) fold(e gaugeEntry) {
	l := s.cluster(e.key.cluster).locality(e.key.locality)
	if e.key.endpoint == "" {
		l.gauge = l.gauge.plus(e.g)
		return
	}
	l.endpoint(e.key.endpoint, e.ep).inProgress += e.g.inProgress
}

// build turns the sums into ClusterStats over interval, sorted by cluster
// and locality, keeping the clusters that wants accepts (all, if nil) and
// endpoints only if endpoints. It returns how many clusters it left out.
func (s sums) build(wants func(string) bool, interval time.Duration, endpoints bool) (out []*endpointpb.ClusterStats, left int) {
	keys := slices.SortedFunc(maps.Keys(s), func(a, b clusterKey) int {
		return cmp.Or(strings.Compare(a.name, b.name), strings.Compare(a.service, b.service))
	})
	for _, k := range keys {
		if wants != nil && !wants(k.name) {
			left++
			continue
		}
		out = append(out, s[k].proto(k, interval, endpoints))
	}
	return out, left
}

func (c *clusterSums) proto(k clusterKey, interval time.Duration, endpoints bool) *endpointpb.ClusterStats {
	cs := &endpointpb.ClusterStats{ClusterName: k.name, ClusterServiceName: k.service,
		TotalDroppedRequests: c.drops, LoadReportInterval: durationpb.New(interval)}
	for _, cat := range slices.Sorted(maps.Keys(c.byCategory)) {
		cs.DroppedRequests = append(cs.DroppedRequests, &endpointpb.ClusterStats_DroppedRequests{Category: cat, DroppedCount: c.byCategory[cat]})
	}
	for _, lk := range slices.SortedFunc(maps.Keys(c.localities), localityKey.compare) {
		cs.UpstreamLocalityStats = append(cs.UpstreamLocalityStats, c.localities[lk].proto(lk, endpoints))
	}
	return cs
}

func (l *localitySums) proto(k localityKey, endpoints bool) *endpointpb.UpstreamLocalityStats {
	ls := &endpointpb.UpstreamLocalityStats{
		Locality:                &corepb.Locality{Region: k.region, Zone: k.zone, SubZone: k.subZone},
		Priority:                k.priority,
		TotalSuccessfulRequests: l.succ,
		TotalErrorRequests:      l.errs,
		TotalIssuedRequests:     l.issued,
		TotalNewConnections:     l.newConns,
		TotalFailConnections:    l.failConns,
		TotalRequestsInProgress: l.gauge.inProgress,
		TotalActiveConnections:  l.gauge.activeConns,
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
			TotalRequestsInProgress: e.inProgress,
			LoadMetricStats:         e.named.proto(),
		})
	}
	return ls
}

package upstream

import (
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
)

// statsOverhead is what a ClusterStats adds to a request beyond its own
// size: its field's tag and length.
const statsOverhead = 8

// cutStats cuts one cluster's stats larger than max bytes (with
// statsOverhead) into several stats of that cluster, each within max: its
// localities shared out, and a locality larger than max alone cut by its
// endpoints likewise (docs/architecture.md, invariant 9: no upstream request
// exceeds upstream.max_request_bytes). Each piece names the cluster, its
// service and the period's interval; the cluster's drops go in the first
// piece, and a locality's own counts in its first: the pieces sum to the
// whole. What cannot be cut further (one endpoint's stats past max) goes
// alone. Stats within max are returned as they are.
func cutStats(cs *endpointpb.ClusterStats, max int) []*endpointpb.ClusterStats {
	if proto.Size(cs)+statsOverhead <= max {
		return []*endpointpb.ClusterStats{cs}
	}
	head := &endpointpb.ClusterStats{ClusterName: cs.GetClusterName(), ClusterServiceName: cs.GetClusterServiceName(),
		LoadReportInterval: cs.GetLoadReportInterval()}
	first := proto.Clone(head).(*endpointpb.ClusterStats)
	first.TotalDroppedRequests, first.DroppedRequests = cs.GetTotalDroppedRequests(), cs.GetDroppedRequests()
	out := []*endpointpb.ClusterStats{first}
	room := max - statsOverhead - proto.Size(head)
	for _, ls := range cs.GetUpstreamLocalityStats() {
		for _, piece := range cutLocality(ls, room) {
			cur := out[len(out)-1]
			if len(cur.UpstreamLocalityStats) > 0 && proto.Size(cur)+proto.Size(piece)+statsOverhead+statsOverhead > max {
				cur = proto.Clone(head).(*endpointpb.ClusterStats)
				out = append(out, cur)
			}
			cur.UpstreamLocalityStats = append(cur.UpstreamLocalityStats, piece)
		}
	}
	return out
}

// cutLocality cuts a locality's stats larger than max bytes by its
// endpoints: the locality's own counts in the first piece, each piece
// naming the locality.
func cutLocality(ls *endpointpb.UpstreamLocalityStats, max int) []*endpointpb.UpstreamLocalityStats {
	if proto.Size(ls)+statsOverhead <= max || len(ls.GetUpstreamEndpointStats()) < 2 {
		return []*endpointpb.UpstreamLocalityStats{ls}
	}
	first := proto.Clone(ls).(*endpointpb.UpstreamLocalityStats)
	first.UpstreamEndpointStats = nil
	out := []*endpointpb.UpstreamLocalityStats{first}
	for _, es := range ls.GetUpstreamEndpointStats() {
		cur := out[len(out)-1]
		if len(cur.UpstreamEndpointStats) > 0 && proto.Size(cur)+proto.Size(es)+statsOverhead+statsOverhead > max {
			cur = &endpointpb.UpstreamLocalityStats{Locality: ls.GetLocality(), Priority: ls.GetPriority()}
			out = append(out, cur)
		}
		cur.UpstreamEndpointStats = append(cur.UpstreamEndpointStats, es)
	}
	return out
}

// cutEach is cutStats of each of stats.
func cutEach(stats []*endpointpb.ClusterStats, max int) [][]*endpointpb.ClusterStats {
	out := make([][]*endpointpb.ClusterStats, len(stats))
	for i, cs := range stats {
		out[i] = cutStats(cs, max)
	}
	return out
}

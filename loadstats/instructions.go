package loadstats

import (
	"slices"
	"time"

	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Instructions are what a control plane asks of load reporters: a
// LoadStatsResponse ("load_stats/v3/lrs.proto").
type Instructions struct {
	// SendAll asks for every cluster (send_all_clusters); Clusters is then
	// empty.
	SendAll bool
	// Clusters are the clusters to report on, sorted, without repeats.
	Clusters []string
	// Interval is load_reporting_interval: how often to report. Zero or
	// less takes the store's own (Options.Interval).
	Interval time.Duration
	// EndpointGranularity is report_endpoint_granularity: per-endpoint
	// stats as well as per-locality ones.
	EndpointGranularity bool
}

// FromResponse reads a control plane's response. A missing or invalid
// load_reporting_interval is zero: the store then keeps its own, since a
// client told a zero interval would report without pause (Envoy) or fail
// the stream (grpc-go).
func FromResponse(resp *lrspb.LoadStatsResponse) Instructions {
	in := Instructions{SendAll: resp.GetSendAllClusters(), EndpointGranularity: resp.GetReportEndpointGranularity()}
	if iv := resp.GetLoadReportingInterval(); iv.CheckValid() == nil {
		in.Interval = iv.AsDuration()
	}
	if !in.SendAll {
		in.Clusters = slices.Clone(resp.GetClusters())
	}
	return in
}

// normal returns in with its clusters sorted and without repeats (none
// with SendAll), def for an interval that is not positive, and floor for
// one below it; clamped tells the last.
func (in Instructions) normal(def, floor time.Duration) (_ Instructions, clamped bool) {
	switch {
	case in.Interval <= 0:
		in.Interval = def
	case in.Interval < floor:
		in.Interval, clamped = floor, true
	}
	if in.SendAll {
		in.Clusters = nil
		return in, clamped
	}
	in.Clusters = slices.Compact(slices.Sorted(slices.Values(in.Clusters)))
	return in, clamped
}

func (in Instructions) equal(o Instructions) bool {
	return in.SendAll == o.SendAll && in.Interval == o.Interval && in.EndpointGranularity == o.EndpointGranularity &&
		slices.Equal(in.Clusters, o.Clusters)
}

// Response is in as a LoadStatsResponse.
func (in Instructions) Response() *lrspb.LoadStatsResponse {
	return &lrspb.LoadStatsResponse{
		Clusters:                  slices.Clone(in.Clusters),
		SendAllClusters:           in.SendAll,
		LoadReportingInterval:     durationpb.New(in.Interval),
		ReportEndpointGranularity: in.EndpointGranularity,
	}
}

// told is one version of the instructions, as every client is told it:
// immutable once made, and shared.
type told struct {
	in      Instructions
	version uint64
	names   map[string]struct{} // the clusters asked for; nil with SendAll
	resp    *lrspb.LoadStatsResponse
}

func newTold(in Instructions, version uint64) *told {
	t := &told{in: in, version: version, resp: in.Response()}
	if !in.SendAll {
		t.names = make(map[string]struct{}, len(in.Clusters))
		for _, c := range in.Clusters {
			t.names[c] = struct{}{}
		}
	}
	return t
}

// wants reports whether cluster is asked for. A nil told asks for nothing.
func (t *told) wants(cluster string) bool {
	if t == nil || cluster == "" {
		return false
	}
	if t.in.SendAll {
		return true
	}
	_, ok := t.names[cluster]
	return ok
}

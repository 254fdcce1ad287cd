package downstream

import (
	"slices"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/loadstats"
)

// oneLoadGroup places every load reporting client in one store.
type oneLoadGroup struct{ s *loadstats.Store }

func (g oneLoadGroup) JoinLoads(*corepb.Node, Caller) (*loadstats.Store, func(), error) {
	return g.s, func() {}, nil
}

// A load report stream is admitted as an xDS stream is: one that sends no
// first request is ended at limits.first_request_timeout, one past
// limits.stream_rate is refused, each with RESOURCE_EXHAUSTED naming the
// key; one in between is told what to report.
func TestLoadReportsUnderStreamLimits(t *testing.T) {
	store, err := loadstats.New(loadstats.Options{Interval: time.Second, MinInterval: time.Millisecond, MaxPending: 1, MaxNames: 100, MaxPendingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	_, cc := serveOn(t, Options{Groups: oneGroup{cache.New(cache.Options{})}, Loads: LoadOptions{Groups: oneLoadGroup{store}},
		Limits: Limits{FirstRequestTimeout: 100 * time.Millisecond, StreamRate: 0.001, StreamBurst: 2}})
	open := lrspb.NewLoadReportingServiceClient(cc).StreamLoadStats
	refused := func(err error, key string) {
		t.Helper()
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), key) {
			t.Errorf("ended with %v, want RESOURCE_EXHAUSTED naming %s", err, key)
		}
	}

	silent := openStream(t, open)
	refused(silent.ended(), "limits.first_request_timeout")

	node := &corepb.Node{Id: "n1", Cluster: "c1"}
	served := openStream(t, open)
	served.send(&lrspb.LoadStatsRequest{Node: node})
	if told := served.recv(); !told.GetSendAllClusters() || told.GetLoadReportingInterval().AsDuration() != time.Second {
		t.Errorf("a stream within the limits was told %v", told)
	}

	late := openStream(t, open)
	late.send(&lrspb.LoadStatsRequest{Node: node})
	refused(late.ended(), "limits.stream_rate")
}

// A stream may be told what to report (its flush run by the send pool) as
// soon as it joins its group's store, before its handler goes on: here
// the control plane's instructions change while the second client joins
// (in the store's callback for clients of two zones, which holds the join
// open for a while), and that client's flush must still find its reporter.
func TestLoadReportsToldAsTheyJoin(t *testing.T) {
	var store *loadstats.Store
	store, err := loadstats.New(loadstats.Options{Interval: time.Second, MinInterval: time.Millisecond, MaxPending: 1, MaxNames: 100, MaxPendingBytes: 1 << 20,
		OnMixedZones: func(_, _ *corepb.Locality) {
			store.Instruct(loadstats.Instructions{Clusters: []string{"a"}, Interval: time.Second})
			time.Sleep(100 * time.Millisecond) // not an assertion: the send pool flushes meanwhile
		}})
	if err != nil {
		t.Fatal(err)
	}
	_, cc := serveOn(t, Options{Groups: oneGroup{cache.New(cache.Options{})}, Loads: LoadOptions{Groups: oneLoadGroup{store}}})
	open := lrspb.NewLoadReportingServiceClient(cc).StreamLoadStats
	for _, zone := range []string{"z1", "z2"} {
		st := openStream(t, open)
		st.send(&lrspb.LoadStatsRequest{Node: &corepb.Node{Id: zone, Locality: &corepb.Locality{Zone: zone}}})
		if zone == "z1" {
			st.recv()
			continue
		}
		if told := st.recv(); !slices.Equal(told.GetClusters(), []string{"a"}) {
			t.Errorf("the client that joined as the instructions changed was told %v", told)
		}
	}
}

package loadstats

import (
	"runtime"
	"testing"
	"weak"

	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
)

// A delivered period leaves memory when it is delivered, not at the next
// cut: nothing in the store still points at what it held.
func TestDeliveredPeriodIsReleased(t *testing.T) {
	s, _ := newStore(t)
	r := join(s, "")
	for _, failed := range []bool{false, true} {
		r.Report([]*endpointpb.ClusterStats{clusterStats("a", 1, locStats("z", 1, 0, 1, 0)), clusterStats("b", 1)})
		cut(t, s) // a period delivered before, whose array the store may reuse
		r.Report([]*endpointpb.ClusterStats{clusterStats("a", 1, locStats("z", 1, 0, 1, 0)), clusterStats("b", 1)})
		s.Cut(s.start.Add(1))
		stats, n := s.Pending()
		sent := weak.Make(&s.pending[0].encoded[0])
		if failed { // the last part failed: it stays, the first leaves
			s.Delivered(n, stats[1:])
		} else {
			s.Delivered(n, nil)
		}
		stats = nil
		runtime.GC()
		if sent.Value() != nil {
			t.Errorf("part failed %v: the delivered period is still held after delivery", failed)
		}
		if failed {
			s.Delivered(1, nil)
		}
	}
}

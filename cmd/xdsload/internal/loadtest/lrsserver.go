package loadtest

import (
	"errors"
	"io"
	"sync/atomic"
	"time"

	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// lrsServer is the control plane's load reporting server (LRS), on its
// port: it asks every stream for every cluster each interval, and counts
// streams, reports and the requests they tell of.
type lrsServer struct {
	lrspb.UnimplementedLoadReportingServiceServer
	interval time.Duration // read-only after newLRSServer

	// Atomic.
	opened    atomic.Int64 // streams, over the run
	live      atomic.Int64 // streams open now
	reports   atomic.Int64 // requests after a stream's first
	succeeded atomic.Int64 // total_successful_requests, summed over reports
}

func newLRSServer(interval time.Duration) *lrsServer {
	return &lrsServer{interval: interval}
}

// LRSStats is what a control plane's load reporting server has counted.
type LRSStats struct {
	Opened    int64 `json:"opened"`    // streams opened, over the run
	Live      int64 `json:"live"`      // streams open now
	Reports   int64 `json:"reports"`   // reports received
	Succeeded int64 `json:"succeeded"` // successful requests they told of
}

func (s *lrsServer) stats() LRSStats {
	return LRSStats{Opened: s.opened.Load(), Live: s.live.Load(), Reports: s.reports.Load(), Succeeded: s.succeeded.Load()}
}

// StreamLoadStats answers a stream's first request and counts its reports.
func (s *lrsServer) StreamLoadStats(st grpc.BidiStreamingServer[lrspb.LoadStatsRequest, lrspb.LoadStatsResponse]) error {
	if _, err := st.Recv(); err != nil {
		return err
	}
	s.opened.Add(1)
	s.live.Add(1)
	defer s.live.Add(-1)
	if err := st.Send(&lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(s.interval)}); err != nil {
		return err
	}
	req := new(lrspb.LoadStatsRequest)
	for {
		if err := st.RecvMsg(req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		s.reports.Add(1)
		var n uint64
		for _, cs := range req.GetClusterStats() {
			for _, ls := range cs.GetUpstreamLocalityStats() {
				n += ls.GetTotalSuccessfulRequests()
			}
		}
		s.succeeded.Add(int64(n))
	}
}

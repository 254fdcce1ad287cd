package testcp

import (
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// LRS is the control plane's load reporting server
// (envoy.service.load_stats.v3), on the same gRPC server and port as its
// ADS: it answers each stream's first request with what it asks for, and
// keeps every report it receives. It outlives the control plane's
// restarts: what it received before one is still counted after.
type LRS struct {
	lrspb.UnimplementedLoadReportingServiceServer

	mu      sync.Mutex
	resp    *lrspb.LoadStatsResponse                  // what streams are told; guarded by mu
	hold    bool                                      // guarded by mu: first requests wait for Answer
	deaf    bool                                      // guarded by mu: streams stop reading (NeverRead)
	streams []*LRSStream                              // guarded by mu: every stream, in the order opened
	live    map[*LRSStream]bool                       // guarded by mu
	onRecv  func(*LRSStream, *lrspb.LoadStatsRequest) // guarded by mu: OnReport's f
	changed chan struct{}                             // guarded by mu: closed at every report or stream, then replaced
}

// LRSStream is one load-report stream the server received.
type LRSStream struct {
	Node    *corepb.Node // of the first request
	st      grpc.BidiStreamingServer[lrspb.LoadStatsRequest, lrspb.LoadStatsResponse]
	sendMu  sync.Mutex
	reports []*lrspb.LoadStatsRequest // guarded by LRS.mu
}

// DefaultLRSInterval is what the server asks for until told otherwise:
// every cluster, every 100ms.
const DefaultLRSInterval = 100 * time.Millisecond

func newLRS() *LRS {
	return &LRS{live: map[*LRSStream]bool{}, changed: make(chan struct{}),
		resp: &lrspb.LoadStatsResponse{SendAllClusters: true, LoadReportingInterval: durationpb.New(DefaultLRSInterval)}}
}

// Hold makes the server leave new streams unanswered until Answer.
func (l *LRS) Hold() {
	l.mu.Lock()
	l.hold = true
	l.mu.Unlock()
}

// NeverRead makes the server stop reading its streams, as a control plane
// that is stuck: each answers its first request (unless held) and then
// reads nothing more until it ends, so that a client's sends block once
// the stream's flow-control window is full (start the control plane with
// a fixed window, grpc.InitialWindowSize, for that to come soon).
func (l *LRS) NeverRead() {
	l.mu.Lock()
	l.deaf = true
	l.mu.Unlock()
}

// ReadAgain undoes NeverRead for the streams opened from now on; those
// that stopped reading stay so until they end.
func (l *LRS) ReadAgain() {
	l.mu.Lock()
	l.deaf = false
	l.mu.Unlock()
}

// Answer sets what the server asks for and tells it to every open stream
// (a new period, for Envoy), those held included.
func (l *LRS) Answer(t testing.TB, resp *lrspb.LoadStatsResponse) {
	t.Helper()
	l.mu.Lock()
	l.resp, l.hold = resp, false
	live := make([]*LRSStream, 0, len(l.live))
	for s := range l.live {
		live = append(live, s)
	}
	l.mu.Unlock()
	for _, s := range live {
		_ = s.send(resp) // a stream that ended meanwhile is gone
	}
}

// OnReport sets f to run on every request after a stream's first, on the
// stream's goroutine, before it is recorded.
func (l *LRS) OnReport(f func(*LRSStream, *lrspb.LoadStatsRequest)) {
	l.mu.Lock()
	l.onRecv = f
	l.mu.Unlock()
}

func (s *LRSStream) send(resp *lrspb.LoadStatsResponse) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.st.Send(resp)
}

// StreamLoadStats implements the LRS service.
func (l *LRS) StreamLoadStats(st grpc.BidiStreamingServer[lrspb.LoadStatsRequest, lrspb.LoadStatsResponse]) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	s := &LRSStream{Node: first.GetNode(), st: st}
	l.mu.Lock()
	l.streams = append(l.streams, s)
	l.live[s] = true
	resp, hold := l.resp, l.hold
	l.notifyLocked()
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.live, s)
		l.mu.Unlock()
	}()
	if !hold {
		if err := s.send(resp); err != nil {
			return err
		}
	}
	l.record(s, first)
	deaf := false
	for {
		l.mu.Lock()
		deaf = deaf || l.deaf
		l.mu.Unlock()
		if deaf {
			<-st.Context().Done()
			return st.Context().Err()
		}
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		l.mu.Lock()
		f := l.onRecv
		l.mu.Unlock()
		if f != nil {
			f(s, req)
		}
		l.record(s, req)
	}
}

func (l *LRS) record(s *LRSStream, req *lrspb.LoadStatsRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.reports = append(s.reports, req)
	l.notifyLocked()
}

func (l *LRS) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Streams returns every stream received, in order, open or ended.
func (l *LRS) Streams() []*LRSStream {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*LRSStream(nil), l.streams...)
}

// Reports returns the stream's requests, its first included.
func (l *LRS) Reports(s *LRSStream) []*lrspb.LoadStatsRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*lrspb.LoadStatsRequest(nil), s.reports...)
}

// Load is what a server was told of a cluster's load, summed over reports.
type Load struct {
	Succeeded, Errors, Issued, Dropped uint64
	InProgress                         uint64 // of the latest report that named the cluster
	Reports                            int    // requests that carried the cluster
}

// Load sums, over every stream and report, what was reported of cluster.
func (l *LRS) Load(cluster string) Load {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out Load
	for _, s := range l.streams {
		for _, req := range s.reports {
			for _, cs := range req.GetClusterStats() {
				if cs.GetClusterName() == cluster {
					out.add(cs)
				}
			}
		}
	}
	return out
}

func (ld *Load) add(cs *endpointpb.ClusterStats) {
	ld.Reports++
	ld.Dropped += cs.GetTotalDroppedRequests()
	ld.InProgress = 0
	for _, ls := range cs.GetUpstreamLocalityStats() {
		ld.Succeeded += ls.GetTotalSuccessfulRequests()
		ld.Errors += ls.GetTotalErrorRequests()
		ld.Issued += ls.GetTotalIssuedRequests()
		ld.InProgress += ls.GetTotalRequestsInProgress()
	}
}

// Wait waits, up to bound, until cond holds of the server; it is checked
// at once and after every stream and report. It reports whether cond held.
func (l *LRS) Wait(bound time.Duration, cond func(*LRS) bool) bool {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if cond(l) {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return cond(l)
		}
	}
}

// ClusterStats returns the stats of cluster in req, nil if none.
func ClusterStats(req *lrspb.LoadStatsRequest, cluster string) *endpointpb.ClusterStats {
	for _, cs := range req.GetClusterStats() {
		if cs.GetClusterName() == cluster {
			return proto.Clone(cs).(*endpointpb.ClusterStats)
		}
	}
	return nil
}

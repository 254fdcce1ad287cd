package loadtest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// lrsRequestsPerReport is what each report tells of: this many requests
// issued and succeeded to the one cluster, one in progress.
const lrsRequestsPerReport = 10

// lrsClients are load-reporting clients as gRPC's and Envoy's are: each
// opens one LRS stream on its connection, sends its node, and reports on
// the interval the first response names, one cluster in one locality.
type lrsClients struct {
	// Read-only after newLRSClients.
	cfg  *Config
	pool *connPool

	bytes byteCounter

	// Atomic.
	told      atomic.Int64 // clients that got their first response
	reports   atomic.Int64 // reports sent
	succeeded atomic.Int64 // requests they told of
	failed    atomic.Int64

	mu       sync.Mutex
	firstErr error // guarded by mu
}

func newLRSClients(cfg *Config) *lrsClients {
	c := &lrsClients{cfg: cfg}
	c.pool = newConnPool(cfg.Target, cfg.Clients, cfg.StreamsPerConn, &c.bytes)
	return c
}

func (c *lrsClients) fail(err error) {
	c.failed.Add(1)
	c.mu.Lock()
	if c.firstErr == nil {
		c.firstErr = err
	}
	c.mu.Unlock()
}

// run runs client i until ctx ends; then it closes its side and waits
// (lrsFinish at most) for the server to end the stream, so that its last
// reports are read.
func (c *lrsClients) run(ctx context.Context, i int) error {
	conn, err := c.pool.acquire(i)
	if err != nil {
		return err
	}
	defer c.pool.release(i)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	st, err := lrspb.NewLoadReportingServiceClient(conn).StreamLoadStats(sctx)
	if err != nil {
		return fmt.Errorf("client %d: open: %w", i, err)
	}
	node := &corepb.Node{Id: "xdsload-" + strconv.Itoa(i), Cluster: c.cfg.NodeCluster,
		Locality: &corepb.Locality{Region: "load", Zone: "zone-0"}, ClientFeatures: []string{"envoy.lrs.supports_send_all_clusters"}}
	if err := st.Send(&lrspb.LoadStatsRequest{Node: node}); err != nil {
		return fmt.Errorf("client %d: first request: %w", i, err)
	}
	resp, err := st.Recv()
	if err != nil {
		return fmt.Errorf("client %d: first response: %w", i, err)
	}
	c.told.Add(1)
	interval := resp.GetLoadReportingInterval().AsDuration()
	if interval <= 0 {
		return fmt.Errorf("client %d: told to report every %v", i, interval)
	}
	ended := make(chan struct{})
	go func() { // later responses are read and set aside
		defer close(ended)
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
		}
	}()
	defer func() {
		cancel() // ends the stream, and so the reading
		<-ended
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	report := &lrspb.LoadStatsRequest{ClusterStats: []*endpointpb.ClusterStats{{
		ClusterName: "lrs-0", LoadReportInterval: durationpb.New(interval),
		UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{{Locality: &corepb.Locality{Region: "load", Zone: "backends"},
			TotalSuccessfulRequests: lrsRequestsPerReport, TotalIssuedRequests: lrsRequestsPerReport, TotalRequestsInProgress: 1}},
	}}}
	for {
		select {
		case <-t.C:
			if err := st.Send(report); err != nil {
				return fmt.Errorf("client %d: report: %w", i, err)
			}
			c.reports.Add(1)
			c.succeeded.Add(lrsRequestsPerReport)
		case <-ended:
			return fmt.Errorf("client %d: the server ended the stream", i)
		case <-ctx.Done():
			_ = st.CloseSend()
			select {
			case <-ended:
			case <-time.After(lrsFinish):
			}
			return nil
		}
	}
}

// lrsFinish bounds a client's wait for the server to end its stream.
const lrsFinish = 2 * time.Second

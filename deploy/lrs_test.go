package deploy

import (
	"context"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	lrspb "github.com/envoyproxy/go-control-plane/envoy/service/load_stats/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// reportLoad has a client of group nodeCluster report load to the relay at
// addr once the relay has told it what to report; its stream stays open
// until the test ends.
func reportLoad(t *testing.T, addr, nodeCluster string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	st, err := lrspb.NewLoadReportingServiceClient(conn).StreamLoadStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&lrspb.LoadStatsRequest{Node: &corepb.Node{Id: "reporter", Cluster: nodeCluster}}); err != nil {
		t.Fatal(err)
	}
	told := make(chan error, 1)
	go func() {
		_, err := st.Recv()
		told <- err
	}()
	select {
	case err := <-told:
		if err != nil {
			t.Fatalf("load reports: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("the relay told the load reporter nothing")
	}
	err = st.Send(&lrspb.LoadStatsRequest{ClusterStats: []*endpointpb.ClusterStats{{ClusterName: "c0",
		UpstreamLocalityStats: []*endpointpb.UpstreamLocalityStats{{TotalSuccessfulRequests: 1, TotalIssuedRequests: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
}

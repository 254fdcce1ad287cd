package envoysim

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait of these tests.
const wait = 10 * time.Second

var variants = []struct {
	name           string
	delta, perType bool
}{
	{"sotw-ads", false, false},
	{"sotw-per-type", false, true},
	{"delta-ads", true, false},
	{"delta-per-type", true, true},
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func node() *corepb.Node { return &corepb.Node{Id: "envoy-1", Cluster: "c1"} }

// waitFor waits, bounded, until cond holds of sim's clusters.
func waitFor(t *testing.T, sim *Client, cond func(map[string]Cluster) bool) {
	t.Helper()
	waitState(t, sim, "clusters", func(s State) bool { return cond(s.Clusters) })
}

// A changed cluster warms until its endpoints come again, in every
// variant; OnCluster tells of each step and may read the client while
// it does.
func TestChangedClusterWarmsUntilItsEndpoints(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			cp := testcp.StartLinear(t)
			cp.Clusters.UpdateResource("a", testcp.Cluster("a"))
			cp.Endpoints.UpdateResource("a", testcp.Endpoints("a", "127.0.0.1:1"))
			var self atomic.Pointer[Client]
			var told, read, blocked atomic.Int64
			sim, err := Start(context.Background(), Options{Conn: dial(t, cp.Addr), Node: node(), Delta: v.delta, PerType: v.perType,
				OnCluster: func(Cluster) {
					told.Add(1)
					c := self.Load()
					if c == nil {
						return
					}
					done := make(chan struct{})
					go func() { c.Clusters(); close(done) }()
					select {
					case <-done:
						read.Add(1)
					case <-time.After(time.Second):
						blocked.Add(1)
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			self.Store(sim)
			waitFor(t, sim, Usable("a"))

			changed := testcp.Cluster("a")
			changed.ConnectTimeout = durationpb.New(2 * time.Second)
			before := time.Now()
			cp.Clusters.UpdateResource("a", changed)
			waitFor(t, sim, func(cs map[string]Cluster) bool { return cs["a"].Updated.After(before) })
			if cl := sim.Clusters()["a"]; !cl.Warming || !cl.Usable.IsZero() {
				t.Fatalf("the changed cluster did not warm: %+v", cl)
			}
			cp.Endpoints.UpdateResource("a", testcp.Endpoints("a", "127.0.0.1:2"))
			waitFor(t, sim, Usable("a"))
			cl := sim.Clusters()["a"]
			if port := cl.Endpoints.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 2 || cl.Usable.Before(cl.Updated) {
				t.Errorf("warmed on port %d, usable at %v, updated at %v", port, cl.Usable, cl.Updated)
			}
			if told.Load() < 3 || read.Load() < 2 || blocked.Load() > 0 {
				t.Errorf("OnCluster: told %d times, read the client %d, blocked reading it %d", told.Load(), read.Load(), blocked.Load())
			}
		})
	}
}

// When the server ends, the client's streams end with it: Done is closed
// and Err says why; Close returns it.
func TestStreamsEndWithTheServer(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			cp, err := testcp.ServeLinear("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer cp.Stop()
			cp.Clusters.UpdateResource("a", testcp.Cluster("a"))
			cp.Endpoints.UpdateResource("a", testcp.Endpoints("a", "127.0.0.1:1"))
			sim, err := Start(context.Background(), Options{Conn: dial(t, cp.Addr), Node: node(), Delta: v.delta, PerType: v.perType})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, sim, Usable("a"))
			cp.Stop()
			select {
			case <-sim.Done():
			case <-time.After(wait):
				t.Fatal("the streams outlived the server")
			}
			if sim.Err() == nil || sim.Close() == nil {
				t.Errorf("ended without an error: %v", sim.Err())
			}
		})
	}
}

// With per-type streams, the one that fails ends the other: a server
// without EDS refuses the endpoints' stream, and the clusters' stream,
// which it serves (a cluster that needs no endpoints: nothing is sent on
// the refused stream), ends too.
func TestPerTypeStreamFailureEndsTheOther(t *testing.T) {
	clusters := cachev3.NewLinearCache(resourcev3.ClusterType)
	clusters.UpdateResource("s", &clusterpb.Cluster{Name: "s", ConnectTimeout: durationpb.New(time.Second)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := grpc.NewServer(grpc.WaitForHandlers(true))
	clustersvc.RegisterClusterDiscoveryServiceServer(g, serverv3.NewServer(ctx, clusters, nil))
	addr := serve(t, g)
	for _, delta := range []bool{false, true} {
		sim, err := Start(context.Background(), Options{Conn: dial(t, addr), Node: node(), Delta: delta, PerType: true})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-sim.Done():
		case <-time.After(wait):
			sim.Close()
			t.Fatalf("delta %v: the clusters' stream outlived the endpoints' refused one", delta)
		}
		if err := sim.Err(); err == nil || !strings.Contains(err.Error(), "Unimplemented") {
			t.Errorf("delta %v: ended with %v, want the endpoints' stream refused", delta, err)
		}
	}
}

// serve runs g on 127.0.0.1:0 until the test ends.
func serve(t *testing.T, g *grpc.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(ln)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return ln.Addr().String()
}

func TestStartNeedsConnAndNode(t *testing.T) {
	if _, err := Start(context.Background(), Options{Node: node()}); err == nil {
		t.Error("started without a connection")
	}
	if _, err := Start(context.Background(), Options{Conn: dial(t, "127.0.0.1:1")}); err == nil {
		t.Error("started without a node")
	}
}

package upstream

import (
	"context"
	"sync"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// switchPath is a path to cp: an ADS source over a connection of its own,
// with a fast reconnect.
func switchPath(t *testing.T, name string, cp *testcp.ControlPlane, m *Metrics) Path {
	t.Helper()
	conn, err := grpc.NewClient(cp.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewADS(Options{Servers: []Server{{Name: cp.Addr, Conn: conn}}, Metrics: m,
		Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return Path{Name: name, Source: src}
}

// runSwitch runs a switch over the group of cluster "c" until the test ends.
func runSwitch(t *testing.T, c *cache.Cache, opts SwitchOptions, first *Path) *Switch {
	t.Helper()
	sw, err := NewSwitch(Group{ID: "c", Node: &corepb.Node{Id: "relay", Cluster: "c"}, Cache: c}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if first != nil {
		sw.Want(*first)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); sw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Error("the switch did not stop")
		}
	})
	return sw
}

func servingName(sw *Switch) string {
	p, _, _ := sw.Serving()
	return p.Name
}

func twoPlanes(t *testing.T) (*testcp.ControlPlane, *testcp.ControlPlane) {
	cp1, cp2 := testcp.Start(t), testcp.Start(t)
	for _, cp := range []*testcp.ControlPlane{cp1, cp2} {
		cp.Set(t, "c", "1", testcp.Cluster("a"), testcp.Cluster("b"))
	}
	return cp1, cp2
}

// A path wanted next is opened beside the one that serves and takes over
// once it answers, then the old one is closed: each control plane holds
// its stream only while it serves, nothing the clients hold changes, and
// nothing is marked for them (the new path's resources are the same bytes).
func TestSwitchMovesMakeBeforeBreakWithoutTouchingClients(t *testing.T) {
	cp1, cp2 := twoPlanes(t)
	m := NewMetrics(&metrics.Registry{})
	p1, p2 := switchPath(t, "one", cp1, m), switchPath(t, "two", cp2, m)
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.Watch(w, resourcev3.ClusterType, "a", "b")
	var (
		movesMu sync.Mutex
		moves   []string
	)
	sw := runSwitch(t, c, SwitchOptions{Fallback: p1, Metrics: m, Recheck: 20 * time.Second, // past the wait: the new path must answer
		OnMove: func(from, to Path) {
			movesMu.Lock()
			defer movesMu.Unlock()
			moves = append(moves, from.Name+">"+to.Name)
		}}, nil)
	eventually(t, "both clusters cached", func() bool {
		got := c.Get(resourcev3.ClusterType, []string{"a", "b"})
		return got[0].Resource != nil && got[1].Resource != nil
	})
	versions := c.Versions(resourcev3.ClusterType)
	w.Take() // what the first fetch marked

	sw.Want(p2)
	eventually(t, "the second path to serve", func() bool { return servingName(sw) == "two" })
	eventually(t, "the first control plane's stream to close", func() bool {
		return cp1.Open()["c"] == 0 && cp2.Open()["c"] == 1
	})
	if d := w.Take(); d.Of(resourcev3.ClusterType) != nil {
		t.Fatalf("the move marked the clients' watch: %v", d)
	}
	if got := c.Versions(resourcev3.ClusterType); got["a"] != versions["a"] || got["b"] != versions["b"] {
		t.Fatalf("versions %v became %v", versions, got)
	}
	// OnMove is told after the new path serves: wait for it.
	eventually(t, "the move told", func() bool {
		movesMu.Lock()
		defer movesMu.Unlock()
		return len(moves) > 0
	})
	movesMu.Lock()
	if len(moves) != 1 || moves[0] != "one>two" {
		t.Fatalf("moves %v", moves)
	}
	movesMu.Unlock()
	// A change now comes from the new path.
	cp2.Set(t, "c", "2", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("new"))
	c.Watch(w, resourcev3.ClusterType, "new")
	eventually(t, "the new cluster from the second path", func() bool {
		return c.Get(resourcev3.ClusterType, []string{"new"})[0].Resource != nil
	})
}

// While the path wanted cannot be reached and the group lacks what it
// wants, the fallback serves (gRFC A71); once the wanted path answers
// again, it takes back over, make-before-break, and the fallback's stream
// closes.
func TestSwitchFallsBackWhileTheWantedPathIsDown(t *testing.T) {
	cp1, cp2 := twoPlanes(t)
	cp2.Stop()
	m := NewMetrics(&metrics.Registry{})
	p1, p2 := switchPath(t, "direct", cp1, m), switchPath(t, "peer", cp2, m)
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Watch(cache.NewWatch(), resourcev3.ClusterType, "a", "b")
	sw := runSwitch(t, c, SwitchOptions{Fallback: p1, Metrics: m, Recheck: 300 * time.Millisecond}, &p2)
	eventually(t, "the fallback to serve what is wanted", func() bool {
		p, fallback, _ := sw.Serving()
		return p.Name == "direct" && fallback && c.Get(resourcev3.ClusterType, []string{"a"})[0].Resource != nil
	})
	cp2.Restart()
	eventually(t, "the wanted path to take back over", func() bool {
		p, fallback, _ := sw.Serving()
		return p.Name == "peer" && !fallback
	})
	eventually(t, "the fallback's stream to close", func() bool { return cp1.Open()["c"] == 0 && cp2.Open()["c"] == 1 })
}

// A wanted path that goes down while the cache holds everything wanted is
// not left (gRFC A71): the fallback opens no stream; a name the cache
// lacks then moves the group to it.
func TestSwitchStaysWhileNothingIsMissing(t *testing.T) {
	cp1, cp2 := twoPlanes(t)
	m := NewMetrics(&metrics.Registry{})
	p1, p2 := switchPath(t, "direct", cp1, m), switchPath(t, "peer", cp2, m)
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.Watch(w, resourcev3.ClusterType, "a", "b")
	sw := runSwitch(t, c, SwitchOptions{Fallback: p1, Metrics: m, Recheck: 300 * time.Millisecond}, &p2)
	eventually(t, "the peer path to serve", func() bool {
		return servingName(sw) == "peer" && c.Get(resourcev3.ClusterType, []string{"b"})[0].Resource != nil
	})
	cp2.Stop()
	eventually(t, "the peer path to be down", func() bool { return !sw.Status().Connected })
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := cp1.DeltaStreams.Load(); n != 0 {
			t.Fatalf("the fallback opened %d streams with nothing missing", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cp1.Set(t, "c", "2", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("more"))
	c.Watch(w, resourcev3.ClusterType, "more")
	eventually(t, "the fallback to serve the name missing", func() bool {
		return servingName(sw) == "direct" && c.Get(resourcev3.ClusterType, []string{"more"})[0].Resource != nil
	})
	if got := c.Get(resourcev3.ClusterType, []string{"a", "b"}); got[0].Resource == nil || got[1].Resource == nil {
		t.Fatal("what was cached was lost")
	}
}

// A wildcard moves as a named interest does: the new path takes over at
// its first answer (its resume leaves a cached name out, for a server
// that would otherwise send nothing), not after the wait for a server
// with nothing to send, and the clients' watch is not marked.
func TestSwitchMovesAWildcardAtItsFirstAnswer(t *testing.T) {
	cp1, cp2 := twoPlanes(t)
	m := NewMetrics(&metrics.Registry{})
	p1, p2 := switchPath(t, "one", cp1, m), switchPath(t, "two", cp2, m)
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.WatchWildcard(w, resourcev3.ClusterType)
	sw := runSwitch(t, c, SwitchOptions{Fallback: p1, Metrics: m, Recheck: 20 * time.Second}, nil) // past the wait
	eventually(t, "both clusters cached", func() bool { return c.Synced(resourcev3.ClusterType) && c.Len() == 2 })
	w.Take()
	sw.Want(p2)
	eventually(t, "the second path to serve", func() bool { return servingName(sw) == "two" })
	if d := w.Take(); d.Of(resourcev3.ClusterType) != nil {
		t.Fatalf("the move marked the wildcard's watch: %v", d)
	}
}

// A path that asks it subscribes without initial_resource_versions: its
// server sends all it has, which the cache drops unchanged.
func TestSwitchFreshPathSubscribesWithoutVersions(t *testing.T) {
	cp1, cp2 := twoPlanes(t)
	m := NewMetrics(&metrics.Registry{})
	p1, p2 := switchPath(t, "one", cp1, m), switchPath(t, "two", cp2, m)
	p2.Fresh = true
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.Watch(w, resourcev3.ClusterType, "a", "b")
	sw := runSwitch(t, c, SwitchOptions{Fallback: p1, Metrics: m, Recheck: 20 * time.Second}, nil)
	eventually(t, "both clusters cached", func() bool {
		got := c.Get(resourcev3.ClusterType, []string{"a", "b"})
		return got[0].Resource != nil && got[1].Resource != nil
	})
	w.Take()
	sw.Want(p2)
	eventually(t, "the fresh path to serve", func() bool { return servingName(sw) == "two" })
	for _, r := range cp2.Requests() {
		if len(r.GetInitialResourceVersions()) > 0 {
			t.Fatalf("the fresh path resumed with %v", r.GetInitialResourceVersions())
		}
	}
	if d := w.Take(); d.Of(resourcev3.ClusterType) != nil {
		t.Fatalf("what the fresh path sent again marked the watch: %v", d)
	}
}

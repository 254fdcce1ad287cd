package relay

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Warm restart: a relay restarted while the control plane is down configures
// its clients from cache.persist_dir; files that do not load are reported and
// ignored; when the control plane returns the clients converge.
func TestWarmRestart(t *testing.T) {
	dir := t.TempDir()
	persist := func(c *Config) {
		c.Cache.PersistDir = dir
		c.Cache.PersistInterval = 20 * time.Millisecond
		fastReconnect(c)
	}
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"), testcp.Cluster("y"), testcp.Endpoints("a", "10.0.0.1:80"))

	first := startRelay(t, cp.Addr, persist)
	s := openDelta(t, first.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: []string{"a"}})
	if got := collectDelta(s, 3); !slices.Equal(got, []string{"a", "x", "y"}) {
		t.Fatalf("before the restart: %v", got)
	}
	s.close()
	shutdown(t, first)
	cp.Stop()

	// Garbage and a damaged copy beside the real file.
	files, _ := filepath.Glob(filepath.Join(dir, "group-*.cache"))
	if len(files) != 1 {
		t.Fatalf("%d cache files written, want 1", len(files))
	}
	good, _ := os.ReadFile(files[0])
	damaged := slices.Clone(good)
	damaged[len(damaged)/2] ^= 0xff
	os.WriteFile(filepath.Join(dir, "group-0000000000000000.cache"), damaged, 0o600)
	os.WriteFile(filepath.Join(dir, "group-1111111111111111.cache"), []byte("hello"), 0o600)

	second := startRelay(t, cp.Addr, persist)
	if n := len(second.snapshotGroups()); n != 1 {
		t.Fatalf("%d groups restored, want 1 (the damaged files ignored)", n)
	}
	d := openDelta(t, second.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := deltaNames(d.recv()); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("from the saved cache: %v", got)
	}
	o := openSotW(t, second.Addr())
	o.send(&discoverypb.DiscoveryRequest{Node: node("n3", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"a"}})
	if n := len(o.recv().GetResources()); n != 1 {
		t.Fatalf("EDS from the saved cache: %d resources", n)
	}

	// The control plane returns without y.
	cp.Set(t, "c1", "2", testcp.Cluster("x"), testcp.Endpoints("a", "10.0.0.1:80"))
	cp.Restart()
	if resp := d.recv(); !slices.Equal(resp.GetRemovedResources(), []string{"y"}) || len(resp.GetResources()) != 0 {
		t.Fatalf("after the control plane returned: sent %v removed %v", deltaNames(resp), resp.GetRemovedResources())
	}
}

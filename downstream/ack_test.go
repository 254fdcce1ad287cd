package downstream

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// mallocs counts the heap allocations f makes, each time after prepare:
// the least of five runs, in case something else allocated meanwhile.
func mallocs(prepare, f func()) uint64 {
	least := ^uint64(0)
	for range 5 {
		prepare()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.Mallocs-before.Mallocs)
	}
	return least
}

// An ACK that accepts what was sent allocates nothing, on a stream of one
// name or of many, delta or SotW (whose ACK names every name again), and
// the client is counted as having accepted the change.
func TestAckAllocatesNothing(t *testing.T) {
	const typeURL = resourcev3.EndpointType
	for _, variant := range []string{"delta", "sotw"} {
		for _, k := range []int{1, 100} {
			t.Run(variant+"/names="+strconv.Itoa(k), func(t *testing.T) {
				c := cache.New(cache.Options{})
				var names []string
				var rs []*cache.Resource
				for i := range k {
					names = append(names, "cla-"+strconv.Itoa(i))
					rs = append(rs, encoded(t, typeURL, names[i], "v0", 64))
				}
				w := cache.NewWatch()
				c.WatchWildcard(w, typeURL)
				c.Apply(typeURL, cache.Change{Upserts: rs, Synced: true})
				c.Release(w)
				node := &corepb.Node{Id: "n", Cluster: "c"}
				base := benchServer(t).newStreamBase(codecSend, "", variant+"-ads", c, node)
				var flush func() error
				var ack func() error
				if variant == "delta" {
					ds := &deltaStream{streamBase: base}
					if err := ds.handle(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNamesSubscribe: names}); err != nil {
						t.Fatal(err)
					}
					req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: strings.Clone(typeURL)}
					flush = func() error {
						err := ds.flush()
						req.ResponseNonce = strconv.FormatUint(uint64(ds.nonces), 10)
						return err
					}
					ack = func() error { return ds.handle(req) }
				} else {
					ss := &sotwStream{streamBase: base}
					if err := ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNames: names}); err != nil {
						t.Fatal(err)
					}
					req := &discoverypb.DiscoveryRequest{TypeUrl: strings.Clone(typeURL), ResourceNames: names}
					flush = func() error {
						err := ss.flush()
						req.ResponseNonce = ss.types.get(typeURL).nonce
						req.VersionInfo = req.ResponseNonce
						return err
					}
					ack = func() error { return ss.handle(req) }
				}
				if err := flush(); err != nil {
					t.Fatal(err)
				}
				if err := ack(); err != nil {
					t.Fatal(err)
				}
				version := 0
				change := func() {
					version++
					c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{encoded(t, typeURL, "cla-0", "v"+strconv.Itoa(version), 64)}})
					if err := flush(); err != nil {
						t.Fatal(err)
					}
				}
				answer := func() {
					if err := ack(); err != nil {
						t.Fatal(err)
					}
				}
				if n := mallocs(change, answer); n != 0 {
					t.Errorf("an ACK allocated %d times", n)
				}
				if n := acceptedOf(c, typeURL, "cla-0"); n != 1 {
					t.Fatalf("cla-0 accepted by %d clients, want 1", n)
				}
			})
		}
	}
}

// A SotW request that names the subscription as it stands changes
// nothing; one that gives a name twice in place of another drops the
// other, though it names as many names ("How the client specifies what
// resources to return": the request's names are the subscription).
func TestSotWRequestGivingANameTwiceIsAChange(t *testing.T) {
	const typeURL = resourcev3.EndpointType
	c := cache.New(cache.Options{})
	w := cache.NewWatch()
	c.WatchWildcard(w, typeURL)
	c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{encoded(t, typeURL, "a", "v0", 64), encoded(t, typeURL, "b", "v0", 64)}, Synced: true})
	c.Release(w)
	node := &corepb.Node{Id: "n", Cluster: "c"}
	ss := &sotwStream{streamBase: benchServer(t).newStreamBase(codecSend, "", "sotw-ads", c, node)}
	request := func(names ...string) {
		t.Helper()
		nonce := ""
		if tt := ss.types.get(typeURL); tt != nil {
			nonce = tt.nonce
		}
		if err := ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNames: names, ResponseNonce: nonce}); err != nil {
			t.Fatal(err)
		}
		if err := ss.flush(); err != nil {
			t.Fatal(err)
		}
	}
	subscribed := func() []string {
		tt := ss.types.get(typeURL)
		return sortedKeys(tt.names.appendKeys(nil))
	}
	request("a", "b")
	request("b", "a") // an ACK, in another order
	if got := subscribed(); strings.Join(got, ",") != "a,b" {
		t.Fatalf("after an ACK naming a and b: subscribed to %v", got)
	}
	request("a", "a")
	if got := subscribed(); strings.Join(got, ",") != "a" {
		t.Errorf("after a request naming a twice: subscribed to %v, want a alone", got)
	}
	for _, r := range c.Convergence([]string{typeURL}, []string{"b"}) {
		if r.Subscribed != 0 {
			t.Errorf("b is still watched by %d clients", r.Subscribed)
		}
	}
}

func sortedKeys(names []string) []string {
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			if names[j] < names[i] {
				names[i], names[j] = names[j], names[i]
			}
		}
	}
	return names
}

// An ADS stream that asks for Clusters and nothing that points at them
// keeps no hold behind a new Cluster (warmorder.go): there is nothing to
// hold back. One that asks for Listeners too holds them.
func TestNoWarmHoldWithoutListenersOrRoutes(t *testing.T) {
	const typeURL = resourcev3.ClusterType
	for _, withListeners := range []bool{false, true} {
		c := cache.New(cache.Options{})
		w := cache.NewWatch()
		c.WatchWildcard(w, typeURL)
		c.WatchWildcard(w, resourcev3.ListenerType)
		c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{edsCluster(t, "cluster-0", "v0")}, Synced: true})
		c.Apply(resourcev3.ListenerType, cache.Change{Synced: true})
		c.Release(w)
		node := &corepb.Node{Id: "n", Cluster: "c"}
		ds := &deltaStream{streamBase: benchServer(t).newStreamBase(codecSend, "", "delta-ads", c, node)}
		types := []string{typeURL}
		if withListeners {
			types = append(types, resourcev3.ListenerType)
		}
		for _, tu := range types {
			if err := ds.handle(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: strings.Clone(tu)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := ds.flush(); err != nil {
			t.Fatal(err)
		}
		if held := ds.hold != nil && ds.hold.on; held != withListeners {
			t.Errorf("asking for Listeners %v: Listeners held behind the new Cluster %v", withListeners, held)
		}
		if !withListeners && ds.hold != nil {
			t.Errorf("a stream of Clusters alone made a warm hold")
		}
		ds.endHold()
	}
}

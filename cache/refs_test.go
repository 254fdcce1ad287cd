package cache

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

const (
	rds = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
)

// route is a RouteConfiguration pointing at clusters.
func route(name, version string, clusters ...string) *Resource {
	r := res(name, version)
	for _, c := range clusters {
		r.Refs = append(r.Refs, xds.Ref{TypeURL: cds, Name: c})
	}
	return r
}

// consistent is a cache with Consistency on (MaxWait 5s), its clock at
// time.Unix(1000, 0), and the reference events it tells.
func consistent() (*Cache, *clock, *[]ReferenceEvent) {
	clk := &clock{t: time.Unix(1000, 0)}
	events := new([]ReferenceEvent)
	c := New(Options{Retention: time.Minute, Now: clk.now, Consistency: Consistency{MaxWait: 5 * time.Second},
		OnReference: func(ev ReferenceEvent) { *events = append(*events, ev) }})
	return c, clk, events
}

// consistentRollout is consistent with a rollout (one canary, a bake of a
// minute) and two clients that watch the Route r and the Clusters
// clusters: the canary (rank 1) and another (rank 2).
func consistentRollout(clusters ...string) (c *Cache, clk *clock, canary, other *Watch) {
	clk = &clock{t: time.Unix(1000, 0)}
	c = New(Options{Retention: time.Minute, Now: clk.now, Consistency: Consistency{MaxWait: 5 * time.Second},
		Rollout: Rollout{Canary: 1, Bake: time.Minute}})
	canary, other = NewWatch(), NewWatch()
	canary.SetRank(1)
	other.SetRank(2)
	for _, w := range []*Watch{canary, other} {
		c.Watch(w, rds, "r")
		c.Watch(w, cds, clusters...)
	}
	return c, clk, canary, other
}

func present(c *Cache, typeURL, name string) string {
	l := c.Read(typeURL, []string{name}, false).Lookups[0]
	if l.Resource == nil {
		return ""
	}
	return l.Resource.Version
}

func TestReferencesAreFetchedWhileReferenced(t *testing.T) {
	c, clk, events := consistent()
	w := NewWatch()
	c.Watch(w, rds, "r")
	signalled(c)
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	if !signalled(c) {
		t.Error("a referenced name did not change the interest")
	}
	if got := c.Interest()[cds].Names; !slices.Equal(got, []string{"x"}) {
		t.Fatalf("cluster interest = %v, want [x]", got)
	}
	changes, _ := c.InterestChanges()
	if !changes[cds]["x"] {
		t.Errorf("interest log: %v", changes)
	}
	// The Route waits for x: not there for the client yet.
	if got := present(c, rds, "r"); got != "" {
		t.Errorf("the route was released before its cluster: version %q", got)
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
	if got := present(c, rds, "r"); got != "1" {
		t.Errorf("the route is not released once its cluster came: %q", got)
	}
	if got := taken(w); !slices.Equal(got[rds], []string{"r"}) {
		t.Errorf("the route's watcher was not marked: %v", got)
	}
	if len(*events) != 1 || (*events)[0].Outcome != WaitResolved || (*events)[0].Name != "r" {
		t.Errorf("events = %+v", *events)
	}
	// The route moves to y: x stays for the retention period, then goes.
	c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}}) // nobody asked for y yet: ignored
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}})
	if got := c.Interest()[cds].Names; !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("cluster interest = %v, want [x y]", got)
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}})
	if got := present(c, rds, "r"); got != "2" {
		t.Fatalf("route = %q, want 2", got)
	}
	clk.t = clk.t.Add(2 * time.Minute)
	c.Sweep()
	if got := c.Interest()[cds].Names; !slices.Equal(got, []string{"y"}) {
		t.Errorf("after retention, cluster interest = %v, want [y]", got)
	}
}

func TestReferenceWaitIsBounded(t *testing.T) {
	c, clk, events := consistent()
	w := NewWatch()
	c.Watch(w, rds, "r")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	if got := c.References(); len(got.Waiting) != 1 || got.Waiting[0].Name != "r" || !slices.Equal(got.Waiting[0].Missing, []xds.Ref{{TypeURL: cds, Name: "x"}}) {
		t.Errorf("References = %+v", got)
	}
	clk.t = clk.t.Add(4 * time.Second)
	c.Sweep()
	if got := present(c, rds, "r"); got != "" {
		t.Fatal("released before max_wait")
	}
	clk.t = clk.t.Add(time.Second)
	c.Sweep()
	if got := present(c, rds, "r"); got != "1" {
		t.Fatal("not released after max_wait")
	}
	if got := taken(w); !slices.Equal(got[rds], []string{"r"}) {
		t.Errorf("the route's watcher was not marked: %v", got)
	}
	if len(*events) != 1 || (*events)[0].Outcome != WaitTimeout || !slices.Equal((*events)[0].Missing, []xds.Ref{{TypeURL: cds, Name: "x"}}) {
		t.Errorf("events = %+v", *events)
	}
	refs := c.References()
	if len(refs.Waiting) != 0 || len(refs.Dangling) != 1 || refs.Dangling[0].Name != "x" ||
		!slices.Equal(refs.Dangling[0].From, []xds.Ref{{TypeURL: rds, Name: "r"}}) {
		t.Errorf("References = %+v", refs)
	}
	if got := c.DanglingReferences(); got[cds] != 1 {
		t.Errorf("DanglingReferences = %v", got)
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
	if got := c.DanglingReferences(); got[cds] != 0 {
		t.Errorf("DanglingReferences once x came = %v", got)
	}
}

func TestRemovalWaitsWhileReferenced(t *testing.T) {
	c, clk, events := consistent()
	wr, wc := NewWatch(), NewWatch()
	c.Watch(wr, rds, "r")
	c.Watch(wc, cds, "x", "y")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1"), res("y", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	taken(wr)
	taken(wc)
	// The control plane removes x before it moves the route.
	c.Apply(cds, Change{Removed: []string{"x"}})
	if got := present(c, cds, "x"); got != "1" {
		t.Fatal("x removed while the route points at it")
	}
	if got := taken(wc); len(got) != 0 {
		t.Errorf("x's watcher was marked: %v", got)
	}
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}})
	if got := present(c, cds, "x"); got != "" {
		t.Fatal("x not removed once nothing points at it")
	}
	if got := present(c, rds, "r"); got != "2" {
		t.Fatal("route not moved")
	}
	if got := taken(wc); !slices.Equal(got[cds], []string{"x"}) {
		t.Errorf("x's watcher: %v", got)
	}
	if len(*events) != 1 || !(*events)[0].Removal || (*events)[0].Outcome != WaitResolved {
		t.Errorf("events = %+v", *events)
	}

	// A removal that nothing resolves is applied after max_wait.
	c.Apply(cds, Change{Removed: []string{"y"}})
	clk.t = clk.t.Add(5 * time.Second)
	c.Sweep()
	if got := present(c, cds, "y"); got != "" {
		t.Fatal("y not removed after max_wait")
	}
	if ev := (*events)[len(*events)-1]; ev.Outcome != WaitTimeout || !slices.Equal(ev.Missing, []xds.Ref{{TypeURL: rds, Name: "r"}}) {
		t.Errorf("event = %+v", ev)
	}
}

func TestReferencesWeightedAndBothOrders(t *testing.T) {
	// The route to y and z (weighted) and the clusters come in one order or
	// the other, x going: no read ever sees the route with a cluster missing.
	for _, routeFirst := range []bool{true, false} {
		c, _, _ := consistent()
		c.Watch(NewWatch(), rds, "r")
		c.Watch(NewWatch(), cds, "x", "y", "z")
		c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
		c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
		check := func(when string) {
			r := c.Read(rds, []string{"r"}, false).Lookups[0].Resource
			if r == nil {
				t.Fatalf("%s: the route is gone", when)
			}
			for _, ref := range r.Refs {
				if present(c, cds, ref.Name) == "" {
					t.Errorf("routeFirst=%v %s: route %s points at %s, which clients lack", routeFirst, when, r.Version, ref.Name)
				}
			}
		}
		steps := []func(){
			func() { c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y", "z")}}) },
			func() { c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}}) },
			func() { c.Apply(cds, Change{Upserts: []*Resource{res("z", "1")}, Removed: []string{"x"}}) },
		}
		if !routeFirst {
			steps[0], steps[1], steps[2] = steps[1], steps[2], steps[0]
		}
		for i, s := range steps {
			s()
			check("step " + string(rune('1'+i)))
		}
		if got := present(c, rds, "r"); got != "2" {
			t.Errorf("routeFirst=%v: route = %q, want 2", routeFirst, got)
		}
		if got := present(c, cds, "x"); got != "" {
			t.Errorf("routeFirst=%v: x still present", routeFirst)
		}
	}
}

func TestConsistencyOffChangesNothing(t *testing.T) {
	c := New(Options{Retention: time.Minute})
	c.Watch(NewWatch(), rds, "r")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	if got := present(c, rds, "r"); got != "1" {
		t.Error("the route waited with consistency off")
	}
	if got := c.Interest()[cds].Names; len(got) != 0 {
		t.Errorf("cluster interest with consistency off = %v", got)
	}
}

func TestReferenceWaitWithRollout(t *testing.T) {
	c, clk, canary, other := consistentRollout("x", "y")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	// r moves to y before y exists: it waits, then goes to the canary first.
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}})
	if got := versionOf(c, canary, rds, "r"); got != "1" {
		t.Fatalf("canary read r %q while y is missing", got)
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}})
	if got := versionOf(c, canary, rds, "r"); got != "2" {
		t.Errorf("canary reads r %q once y came, want 2", got)
	}
	if got := versionOf(c, other, rds, "r"); got != "1" {
		t.Errorf("non-canary reads r %q before the bake, want 1", got)
	}
	clk.t = clk.t.Add(2 * time.Minute)
	c.Sweep()
	if got := versionOf(c, other, rds, "r"); got != "2" {
		t.Errorf("non-canary reads r %q after the bake, want 2", got)
	}
}

// A removal that a change ends reaches clients after that change: in a
// later op, whose sequence number orders it after the change for every
// stream, whatever the types' rank.
func TestRemovalReleasedAfterWhatEndedIt(t *testing.T) {
	c, _, _ := consistent()
	w := NewWatch()
	c.Watch(w, rds, "r")
	c.Watch(w, cds, "x", "y")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1"), res("y", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	c.Apply(cds, Change{Removed: []string{"x"}})
	w.Take()
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}})
	seq := map[string]uint64{}
	for _, d := range w.Take() {
		seq[d.TypeURL] = d.Seq
	}
	if seq[rds] == 0 || seq[cds] <= seq[rds] {
		t.Errorf("the route's change at %d, x's removal at %d: the removal must come after", seq[rds], seq[cds])
	}
}

// A Cluster does not wait for its endpoints (the spec's order sends them
// after it, and clients warm it), but they are fetched, and their removal
// waits while the Cluster points at them.
func TestClusterWaitsNotForItsEndpoints(t *testing.T) {
	c, _, _ := consistent()
	c.Watch(NewWatch(), cds, "x")
	x := res("x", "1")
	x.Refs = []xds.Ref{{TypeURL: eds, Name: "x"}}
	c.Apply(cds, Change{Upserts: []*Resource{x}})
	if got := present(c, cds, "x"); got != "1" {
		t.Fatal("the cluster waited for its endpoints")
	}
	if got := c.Interest()[eds].Names; !slices.Equal(got, []string{"x"}) {
		t.Fatalf("endpoint interest = %v, want [x]", got)
	}
	if l := c.Get(eds, []string{"x"})[0]; !l.Referenced {
		t.Error("the endpoints are not marked as wanted only by reference")
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}})
	c.Apply(eds, Change{Removed: []string{"x"}})
	if got := present(c, eds, "x"); got != "1" {
		t.Error("endpoints removed while their cluster points at them")
	}
	c.Apply(cds, Change{Removed: []string{"x"}})
	if present(c, cds, "x") != "" || present(c, eds, "x") != "" {
		t.Error("the cluster and its endpoints are not removed once nothing points at them")
	}
}

// A Route waits for its Clusters' endpoints too, so that a client reading
// it finds everything it needs cached; a name upstream said does not exist
// is not waited for.
func TestRouteWaitsForItsClustersEndpoints(t *testing.T) {
	c, _, _ := consistent()
	c.Watch(NewWatch(), rds, "r", "s")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	x := res("x", "1")
	x.Refs = []xds.Ref{{TypeURL: eds, Name: "x"}}
	c.Apply(cds, Change{Upserts: []*Resource{x}})
	if got := present(c, rds, "r"); got != "" {
		t.Fatal("the route was released before its cluster's endpoints")
	}
	if got := c.References().Waiting; len(got) != 1 || !slices.Equal(got[0].Missing, []xds.Ref{{TypeURL: eds, Name: "x"}}) {
		t.Errorf("waiting = %+v, want r missing x's endpoints", got)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}})
	if got := present(c, rds, "r"); got != "1" {
		t.Fatal("the route is not released once its cluster's endpoints came")
	}
	// s points at y, which upstream says does not exist: no wait.
	c.Apply(rds, Change{Upserts: []*Resource{route("s", "1", "y")}})
	c.Apply(cds, Change{Removed: []string{"y"}})
	if got := present(c, rds, "s"); got != "1" {
		t.Error("a route waits for a cluster the control plane says does not exist")
	}
}

// A name whose first version waits is answered: Get says so, for the
// does-not-exist timer.
func TestWaitingIsAnswered(t *testing.T) {
	c, _, _ := consistent()
	c.Watch(NewWatch(), rds, "r")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	if l := c.Get(rds, []string{"r"})[0]; l.Resource != nil || !l.Waiting {
		t.Errorf("lookup of a waiting route = %+v, want no resource and Waiting", l)
	}
}

// A name held only because a resource pointed at it goes with that
// resource when it is retired, not a retention period later; one a client
// watched is retained on its own.
func TestReferencedGoWithWhatPointedAtThem(t *testing.T) {
	c, clk, _ := consistent()
	w, wy := NewWatch(), NewWatch()
	c.Watch(w, rds, "r")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x", "y")}})
	x, y := res("x", "1"), res("y", "1")
	x.Refs = []xds.Ref{{TypeURL: eds, Name: "x"}}
	c.Apply(cds, Change{Upserts: []*Resource{x, y}})
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}})
	c.Watch(wy, cds, "y")
	c.Release(w)
	clk.t = clk.t.Add(30 * time.Second)
	c.Release(wy)
	clk.t = clk.t.Add(31 * time.Second) // r's retention is over, y's not yet
	c.Sweep()
	in := c.Interest()
	if len(in[rds].Names) != 0 || len(in[eds].Names) != 0 || !slices.Equal(in[cds].Names, []string{"y"}) {
		t.Errorf("interest after r retired = %v, want only y (retained on its own)", in)
	}
	if present(c, cds, "x") != "" || present(c, eds, "x") != "" {
		t.Error("x and its endpoints outlived the route that alone held them")
	}
}

// A waiting resource sent again (a SotW control plane re-sends its whole
// list) keeps when its wait began, and what it points at stays fetched
// without a break: neither unsubscribed nor turned into a retained name.
func TestWaitingResentKeepsItsWait(t *testing.T) {
	c, clk, _ := consistent()
	c.Watch(NewWatch(), rds, "r")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	c.InterestChanges()
	clk.t = clk.t.Add(3 * time.Second)
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	if changes, all := c.InterestChanges(); all || len(changes) != 0 {
		t.Errorf("the interest changed when the waiting route came again: %v", changes)
	}
	if got := c.References().Waiting; len(got) != 1 || !got[0].Since.Equal(time.Unix(1000, 0)) {
		t.Errorf("waiting = %+v, want since the first arrival", got)
	}
	if e := c.types[cds].entries["x"]; e == nil || e.wanted {
		t.Errorf("x became a retained name: %+v", e)
	}
	clk.t = clk.t.Add(2 * time.Second)
	c.Sweep()
	if got := present(c, rds, "r"); got != "1" {
		t.Error("the wait is not bounded from the first arrival")
	}
}

// A change released by the bound (Sweep) goes through the rollout like
// any other: the canaries first, the rest after the bake.
func TestReferenceTimeoutWithRollout(t *testing.T) {
	c, clk, canary, other := consistentRollout("x")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}}) // y never comes
	clk.t = clk.t.Add(5 * time.Second)
	c.Sweep()
	if got := versionOf(c, canary, rds, "r"); got != "2" {
		t.Errorf("canary reads r %q after max_wait, want 2", got)
	}
	if got := versionOf(c, other, rds, "r"); got != "1" {
		t.Errorf("non-canary reads r %q before the bake, want 1", got)
	}
	clk.t = clk.t.Add(2 * time.Minute)
	c.Sweep()
	if got := versionOf(c, other, rds, "r"); got != "2" {
		t.Errorf("non-canary reads r %q after the bake, want 2", got)
	}
}

// A removal that waits ends when upstream sends the name again with the
// bytes the cache holds (a SotW full state that lists it once more,
// Change.Resent), as it does when the name is upserted: the name is not
// removed once nothing points at it.
func TestResentEndsAWaitingRemoval(t *testing.T) {
	c, _, events := consistent()
	w := NewWatch()
	c.Watch(w, rds, "r")
	c.Watch(w, cds, "x", "y")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1"), res("y", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	c.Apply(cds, Change{Removed: []string{"x"}})
	if got := c.References().Waiting; len(got) != 1 || !got[0].Removal {
		t.Fatalf("waiting = %+v, want x's removal", got)
	}
	c.Apply(cds, Change{Resent: []string{"x", "y"}})
	if got := c.References().Waiting; len(got) != 0 {
		t.Errorf("waiting after x was resent = %+v, want none", got)
	}
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}})
	if got := present(c, cds, "x"); got != "1" {
		t.Errorf("x = %q once the route moved, want 1: upstream sent it again", got)
	}
	if len(*events) != 0 {
		t.Errorf("events = %+v, want none", *events)
	}
}

// A resource that points at a missing Cluster waits unless nobody asked
// for it (it is not stored, so nothing is fetched for it) or it is what
// the cache holds already (a resource let through after max_wait, sent
// again): each unless on its own.
func TestReferenceWaitUnless(t *testing.T) {
	t.Run("nobody asked", func(t *testing.T) {
		c, _, _ := consistent()
		c.Watch(NewWatch(), rds, "r")
		c.Apply(rds, Change{Upserts: []*Resource{route("q", "1", "z")}})
		if got := c.References().Waiting; len(got) != 0 {
			t.Errorf("waiting = %+v, want none: nobody asked for q", got)
		}
		if got := c.Interest()[cds].Names; len(got) != 0 {
			t.Errorf("cluster interest = %v, want none", got)
		}
	})
	t.Run("nothing changes", func(t *testing.T) {
		c, clk, events := consistent()
		c.Watch(NewWatch(), rds, "r")
		c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
		clk.t = clk.t.Add(5 * time.Second)
		c.Sweep()
		if got := present(c, rds, "r"); got != "1" || len(*events) != 1 {
			t.Fatalf("r = %q, events = %+v: want r let through after max_wait", got, *events)
		}
		c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
		if got := c.References().Waiting; len(got) != 0 {
			t.Errorf("waiting = %+v, want none: r is what the cache holds", got)
		}
		if l := c.Get(rds, []string{"r"})[0]; l.Waiting {
			t.Error("the lookup of r says it waits")
		}
	})
}

// A resource waiting for its Cluster has no entry while it waits (a
// wildcard's): when the wildcard goes, the type stays until the wait ends,
// and then what the resource pointed at goes too; the cache empties.
func TestWaitOutlivesItsWildcard(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(Options{Retention: time.Second, Now: clk.now, Consistency: Consistency{MaxWait: 5 * time.Second}})
	w := NewWatch()
	c.WatchWildcard(w, rds)
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	c.UnwatchWildcard(w, rds)
	clk.t = clk.t.Add(2 * time.Second)
	if c.Sweep() || c.Empty() {
		t.Fatal("the cache says it is empty while r waits, fetching x")
	}
	for range 3 { // the wait ends; x is retained a second, then dropped
		clk.t = clk.t.Add(5 * time.Second)
		c.Sweep()
	}
	if got := c.References().Waiting; len(got) != 0 {
		t.Errorf("waiting = %+v, want none after max_wait", got)
	}
	if in := c.Interest(); len(in) != 0 {
		t.Errorf("interest = %v, want none", in)
	}
	if !c.Sweep() || !c.Empty() {
		t.Error("the cache is not empty once the wait ended")
	}
}

// A removal whose wait a change ends goes through the rollout like the
// change: the canaries lose the name first, the rest after the bake.
func TestWaitingRemovalWithRollout(t *testing.T) {
	c, clk, canary, other := consistentRollout("x", "y")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1"), res("y", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	clk.t = clk.t.Add(2 * time.Minute)
	c.Sweep()
	c.Apply(cds, Change{Removed: []string{"x"}})
	if got := versionOf(c, canary, cds, "x"); got != "1" {
		t.Fatalf("canary lost x while the route points at it: %q", got)
	}
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}})
	if got := versionOf(c, canary, cds, "x"); got != "" {
		t.Errorf("canary reads x %q once the route moved, want it removed", got)
	}
	if got := versionOf(c, other, cds, "x"); got != "1" {
		t.Errorf("non-canary reads x %q before the bake, want 1", got)
	}
	clk.t = clk.t.Add(2 * time.Minute)
	c.Sweep()
	if got := versionOf(c, other, cds, "x"); got != "" {
		t.Errorf("non-canary reads x %q after the bake, want it removed", got)
	}
}

// The names resources point at count against MaxNames with the names the
// group wants: past it they are not fetched, the refusal is told (once
// marked first), and what waits for them is released by MaxWait.
func TestReferencedNamesCountAgainstMaxNames(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var refused []RefusedReferences
	var events []ReferenceEvent
	c := New(Options{Retention: time.Minute, Now: clk.now, MaxNames: 3, Consistency: Consistency{MaxWait: 5 * time.Second},
		OnReference: func(ev ReferenceEvent) { events = append(events, ev) },
		OnRefused:   func(r RefusedReferences) { refused = append(refused, r) }})
	c.Watch(NewWatch(), rds, "r", "s")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "a", "b", "c", "d")}})
	if got := c.Interest()[cds].Names; !slices.Equal(got, []string{"a"}) {
		t.Errorf("cluster interest = %v, want [a]: 2 names wanted, MaxNames 3", got)
	}
	want := RefusedReferences{Count: 3, ByType: map[string]int{cds: 3}, First: true, Example: xds.Ref{TypeURL: cds, Name: "b"}, Max: 3}
	if len(refused) != 1 || !reflect.DeepEqual(refused[0], want) {
		t.Errorf("refused = %+v, want %+v", refused, want)
	}
	c.Apply(rds, Change{Upserts: []*Resource{route("s", "1", "e")}})
	if len(refused) != 2 || refused[1].First || refused[1].Count != 1 {
		t.Errorf("second refusal = %+v, want one, not first", refused[1:])
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("a", "1")}})
	clk.t = clk.t.Add(5 * time.Second)
	c.Sweep()
	if got := present(c, rds, "r"); got != "1" {
		t.Fatal("a route waiting for a refused name is not released by MaxWait")
	}
	if len(events) != 2 || events[0].Outcome != WaitTimeout || events[1].Outcome != WaitTimeout {
		t.Errorf("events = %+v, want two timeouts", events)
	}
	// Once r points at nothing refused, the names it let go are no longer
	// held: a is retained, b, c and d were never fetched.
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "a")}})
	if got := c.Interest()[cds].Names; !slices.Equal(got, []string{"a"}) {
		t.Errorf("cluster interest = %v, want [a]", got)
	}
	for _, n := range []string{"b", "c", "d"} {
		if e := c.types[cds].entries[n]; e != nil {
			t.Errorf("refused %s kept an entry: %+v", n, e)
		}
	}
}

// The first wait of each type is told once for the life of the cache,
// with what it waits for: a resource's lacking Cluster, or what still
// points at a name whose removal waits.
func TestFirstWaitOfATypeIsToldOnce(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var told []UnsafeOrder
	c := New(Options{Retention: time.Minute, Now: clk.now, Consistency: Consistency{MaxWait: 5 * time.Second},
		OnUnsafeOrder: func(u UnsafeOrder) { told = append(told, u) }})
	c.Watch(NewWatch(), rds, "r", "s")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("s", "1", "y")}})
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1"), res("y", "1")}})
	c.Apply(cds, Change{Removed: []string{"x"}})
	c.Apply(cds, Change{Removed: []string{"y"}})
	want := []UnsafeOrder{
		{TypeURL: rds, Name: "r", Refs: []xds.Ref{{TypeURL: cds, Name: "x"}}},
		{TypeURL: cds, Name: "x", Removal: true, Refs: []xds.Ref{{TypeURL: rds, Name: "r"}}},
	}
	if !reflect.DeepEqual(told, want) {
		t.Errorf("told = %+v, want %+v", told, want)
	}
}

// A removal waits for what present resources point at, not for waiting
// ones: once the last present one moves, it goes at once, though a
// waiting Route still names the Cluster.
func TestRemovalGoesOncePresentPointersMove(t *testing.T) {
	c, _, events := consistent()
	c.Watch(NewWatch(), rds, "r", "s")
	c.Watch(NewWatch(), cds, "x", "z")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1"), res("z", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("s", "1", "x", "y")}}) // waits for y
	c.Apply(cds, Change{Removed: []string{"x"}})
	if present(c, cds, "x") == "" {
		t.Fatal("x was removed while r points at it")
	}
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "z")}})
	if present(c, cds, "x") != "" {
		t.Error("x's removal still waits once no present resource points at it")
	}
	var removal []ReferenceEvent
	for _, ev := range *events {
		if ev.Removal {
			removal = append(removal, ev)
		}
	}
	if len(removal) != 1 || removal[0].Name != "x" || removal[0].Outcome != WaitResolved {
		t.Errorf("removal events = %+v, want x resolved", removal)
	}
}

// marked reports whether w holds a mark of name of typeURL, not yet taken.
func marked(w *Watch, typeURL, name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.dirty.Of(typeURL)
	return d != nil && d.Names.Has(name)
}

// A Route released because its Cluster came is readable only once the
// Cluster's mark is on every watch: a flush that reads the Route finds the
// Cluster marked and sends it first (docs/architecture.md, invariant 18
// "Make before break, whatever the order upstream"). Each watch looks, as
// it is marked, at what a reader finds.
func TestReleasedRouteReadableOnlyOnceItsClusterIsMarked(t *testing.T) {
	c, _, _ := consistent()
	client, other := NewWatch(), NewWatch()
	c.Watch(client, rds, "r")
	c.Watch(client, cds, "y")
	c.Watch(other, cds, "y")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "y")}})
	if got := present(c, rds, "r"); got != "" {
		t.Fatalf("the route was released before its cluster: version %q", got)
	}
	client.Take()
	other.Take()
	var early []string
	seen := 0
	look := func(who string) func() {
		return func() {
			if present(c, rds, "r") == "" {
				return
			}
			seen++
			for name, w := range map[string]*Watch{"client": client, "other": other} {
				if !marked(w, cds, "y") {
					early = append(early, who+" marked: the route is readable and "+name+" lacks y's mark")
				}
			}
		}
	}
	client.OnReady(look("client"))
	other.OnReady(look("other"))
	c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}})
	for _, e := range early {
		t.Error(e)
	}
	if seen == 0 {
		t.Fatal("no watch was marked once the route was readable")
	}
	seq := map[string]uint64{}
	for _, d := range client.Take() {
		seq[d.TypeURL] = d.Seq
	}
	if seq[cds] == 0 || seq[rds] <= seq[cds] {
		t.Errorf("y's change at %d, the route's release at %d: the release must come after", seq[cds], seq[rds])
	}
}

// An op's marks are all on before any of its watches is woken, and the
// next op is made only once they are (invariant 7 "Order is kept"): the
// first watch that y's arrival wakes finds y marked on every watch, and a
// Route moved to y by another upstream stream, applied from that wake-up,
// is made then, with no lock of the cache held (docs/architecture.md,
// "Locks": OnReady is a callback).
func TestApplyWaitsForTheMarksOfTheOneBefore(t *testing.T) {
	c, _, _ := consistent()
	var ws []*Watch
	for range 64 {
		w := NewWatch()
		c.Watch(w, rds, "r")
		c.Watch(w, cds, "x", "y")
		ws = append(ws, w)
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	for _, w := range ws {
		w.Take()
	}
	woken, unmarked := 0, -1
	done := make(chan struct{})
	for _, w := range ws {
		w.OnReady(func() {
			if woken++; woken > 1 {
				return
			}
			unmarked = 0
			for _, o := range ws {
				o.mu.Lock()
				if d := o.dirty.Of(cds); d == nil || !d.Names.Has("y") {
					unmarked++
				}
				o.mu.Unlock()
			}
			go func() {
				defer close(done)
				c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}})
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("the Route's Apply, from a wake-up, did not return: a lock of the cache is held across OnReady")
			}
		})
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}})
	if woken == 0 {
		t.Fatal("y's change woke no watch")
	}
	if unmarked != 0 {
		t.Errorf("the first watch woken found %d of %d watches without y's mark", unmarked, len(ws))
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the Route's Apply did not return")
	}
	if got := present(c, rds, "r"); got != "2" {
		t.Errorf("route = %q, want 2", got)
	}
}

// A removal that a released Route ended is readable only once the Route's
// release is marked on every watch, as the Route's is once its Cluster's
// is: the client holds the change that left the name before it can read
// the name gone.
func TestRemovalReadableOnlyOnceTheReleaseThatEndedItIsMarked(t *testing.T) {
	c, _, _ := consistent()
	client, other := NewWatch(), NewWatch()
	c.Watch(client, rds, "r")
	c.Watch(client, cds, "x", "y")
	c.Watch(other, rds, "r")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	c.Apply(cds, Change{Removed: []string{"x"}})                     // waits: r points at x
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "y")}}) // waits for y
	if present(c, cds, "x") != "1" || present(c, rds, "r") != "1" {
		t.Fatalf("x = %q, r = %q before y came", present(c, cds, "x"), present(c, rds, "r"))
	}
	client.Take()
	other.Take()
	var early []string
	seen := 0
	look := func(who string) func() {
		return func() {
			if present(c, cds, "x") != "" {
				return
			}
			seen++
			for name, w := range map[string]*Watch{"client": client, "other": other} {
				if !marked(w, rds, "r") {
					early = append(early, who+" marked: x is gone and "+name+" lacks the route's mark")
				}
			}
		}
	}
	client.OnReady(look("client"))
	other.OnReady(look("other"))
	c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}})
	for _, e := range early {
		t.Error(e)
	}
	if seen == 0 {
		t.Fatal("no watch was marked once x was gone")
	}
	if got := present(c, rds, "r"); got != "2" {
		t.Errorf("route = %q, want 2", got)
	}
}

// A restored cache tells what its restore refused as a live change tells
// it: the names restored Routes point at count against MaxNames too.
func TestImportTellsRefusedReferences(t *testing.T) {
	var refused []RefusedReferences
	c := New(Options{Retention: time.Minute, MaxNames: 2, Consistency: Consistency{MaxWait: 5 * time.Second},
		OnRefused: func(r RefusedReferences) { refused = append(refused, r) }})
	c.Import([]TypeState{{TypeURL: rds, Resources: []*Resource{route("r", "1", "a", "b", "c")}}})
	if len(refused) != 1 || !refused[0].First || refused[0].Count != 2 {
		t.Errorf("refused = %+v, want b and c, first", refused)
	}
}

// The index of waits keeps nothing of a wait that ended, however it
// ended: resolved, replaced by a newer version, removed upstream, past
// MaxWait, or a removal's wait ended by a resend.
func TestEndedWaitsLeaveNothingIndexed(t *testing.T) {
	c, clk, _ := consistent()
	c.Watch(NewWatch(), rds, "r", "s", "q")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x"), route("s", "1", "y"), route("q", "1", "z")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2", "w")}}) // replaced: waits for w now
	c.Apply(rds, Change{Removed: []string{"s"}})                     // removed while it waits
	c.Apply(cds, Change{Upserts: []*Resource{res("w", "1")}})        // r resolved
	c.Apply(rds, Change{Upserts: []*Resource{route("s", "2", "a")}})
	c.Apply(cds, Change{Removed: []string{"w"}}) // r points at it: the removal waits
	c.Apply(cds, Change{Resent: []string{"w"}})  // and ends
	clk.t = clk.t.Add(5 * time.Second)
	c.Sweep() // q and s past MaxWait
	if c.waits != 0 || len(c.waitOn) != 0 || len(c.waitQ) != 0 || len(c.wokenRes) != 0 || len(c.wokenRm) != 0 {
		t.Errorf("waits %d, waitOn %v, waitQ %v, woken %v %v: want nothing once every wait ended",
			c.waits, c.waitOn, c.waitQ, c.wokenRes, c.wokenRm)
	}
	for _, n := range []string{"r", "s", "q"} {
		if present(c, rds, n) == "" {
			t.Errorf("%s not applied", n)
		}
	}
}

// A name a wait ran out on dangles: later versions that point at it are
// applied at once, until it exists; then what points at a new missing name
// waits again. Only the wait that ran out is told.
func TestDanglingNameIsNotWaitedForAgain(t *testing.T) {
	c, clk, events := consistent()
	w := NewWatch()
	c.Watch(w, rds, "r")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	clk.t = clk.t.Add(5 * time.Second)
	c.Sweep()
	if got := present(c, rds, "r"); got != "1" || len(*events) != 1 || (*events)[0].Outcome != WaitTimeout {
		t.Fatalf("after max_wait: route %q, events %+v", got, *events)
	}

	// Later versions that point at x go at once, as do new names beside
	// it that are present.
	c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}})
	c.Watch(w, cds, "y")
	c.Apply(cds, Change{Upserts: []*Resource{res("y", "1")}})
	for _, r := range []*Resource{route("r", "2", "x"), route("r", "3", "x", "y")} {
		c.Apply(rds, Change{Upserts: []*Resource{r}})
		if got := present(c, rds, "r"); got != r.Version {
			t.Fatalf("version %s of the route, pointing at dangling x, waits: present is %q", r.Version, got)
		}
	}
	if len(*events) != 1 || len(c.References().Waiting) != 0 {
		t.Errorf("a version that did not wait was told: events %+v, references %+v", *events, c.References())
	}

	// x comes: it exists, and a version pointing at a new missing name
	// waits for it as ever.
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "4", "x", "z")}})
	if got := present(c, rds, "r"); got != "3" {
		t.Fatalf("the route to z was applied before z came: %q", got)
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("z", "1")}})
	if got := present(c, rds, "r"); got != "4" {
		t.Fatalf("the route to z is not released once z came: %q", got)
	}

	// x goes, and its removal is then taken back (judged on a stream that
	// proved dead): missing, not known not to exist, and no longer
	// dangling, since it existed. What points at it waits again.
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "5", "z")}})
	c.Apply(cds, Change{Removed: []string{"x"}})
	c.Apply(cds, Change{Unknown: []string{"x"}})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "6", "z", "x")}})
	if got := present(c, rds, "r"); got != "5" {
		t.Fatalf("a route to x, missing again after it existed, does not wait: present is %q", got)
	}
}

// A resource that waits for a name when another wait on that name runs out
// goes at once: nothing waits for a dangling name. Its wait ends as a
// timeout, what it lacks named.
func TestWaitOnANameThatDanglesEnds(t *testing.T) {
	c, clk, events := consistent()
	w := NewWatch()
	c.Watch(w, rds, "r", "s")
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	clk.t = clk.t.Add(3 * time.Second)
	c.Apply(rds, Change{Upserts: []*Resource{route("s", "1", "x")}})
	clk.t = clk.t.Add(2 * time.Second)
	c.Sweep()
	if got := present(c, rds, "s"); got != "1" {
		t.Fatalf("s still waits for x, on which r's wait ran out: %q", got)
	}
	want := []ReferenceEvent{
		{TypeURL: rds, Name: "r", Outcome: WaitTimeout, Waited: 5 * time.Second, Missing: []xds.Ref{{TypeURL: cds, Name: "x"}}},
		{TypeURL: rds, Name: "s", Outcome: WaitTimeout, Waited: 2 * time.Second, Missing: []xds.Ref{{TypeURL: cds, Name: "x"}}},
	}
	if !reflect.DeepEqual(*events, want) {
		t.Errorf("events %+v, want %+v", *events, want)
	}
	if got := taken(w); !slices.Equal(got[rds], []string{"r", "s"}) {
		t.Errorf("marked %v, want r and s", got)
	}
}

// A type is held while a resource of it waits (View.Held, Cache.Held), for
// a wildcard's first answer. A wait that ends with nothing applied (the
// resource removed upstream) marks the type's wildcard watchers, whose
// first answer waited for it.
func TestHeldWhileAResourceWaits(t *testing.T) {
	c, _, _ := consistent()
	w := NewWatch()
	c.WatchWildcard(w, rds)
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}, Synced: true})
	if v := c.Read(rds, nil, true); !v.Synced || !v.Held || !c.Held(rds) {
		t.Fatalf("synced %v, held %v (%v), want both while r waits", v.Synced, v.Held, c.Held(rds))
	}
	taken(w)
	c.Apply(rds, Change{Removed: []string{"r"}})
	if v := c.Read(rds, nil, true); v.Held || c.Held(rds) {
		t.Error("held once r's wait ended")
	}
	if got := taken(w); len(got) != 1 {
		t.Errorf("the wildcard watcher was not marked when the last wait ended: %v", got)
	}
}

// A change that goes ahead of what points at it (Change.Ahead: resource
// files, in the spec's order) is kept though nobody asked for it yet: the
// Route that points at it, applied next, waits for nothing and is
// released at once; an ahead resource nothing comes to point at is
// dropped by the next sweep.
func TestAheadOfWhatPointsAtIt(t *testing.T) {
	c, _, events := consistent()
	var unsafe []UnsafeOrder
	c.onUnsafeOrder = func(u UnsafeOrder) { unsafe = append(unsafe, u) }
	w := NewWatch()
	c.Watch(w, rds, "r")
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1"), res("stray", "1")}, Ahead: true})
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "x")}})
	if got := present(c, rds, "r"); got != "1" {
		t.Errorf("the route waits though its cluster went ahead of it: version %q", got)
	}
	if len(*events) != 0 || len(unsafe) != 0 {
		t.Errorf("reference events %+v, unsafe orders %+v; want none", *events, unsafe)
	}
	c.Sweep()
	if got := present(c, cds, "x"); got != "1" {
		t.Errorf("the cluster the route points at was dropped: %q", got)
	}
	if got := present(c, cds, "stray"); got != "" {
		t.Errorf("a cluster nothing points at outlived the sweep: %q", got)
	}
}

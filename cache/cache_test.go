package cache

import (
	"slices"
	"testing"
	"time"
)

const eds = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func res(name, version string) *Resource {
	return &Resource{Name: name, Version: version, Any: []byte(name + version), Wire: []byte(name + version)}
}

func interest(c *Cache) Interest { return c.Interest()[eds] }

func taken(w *Watch) map[string][]string {
	out := map[string][]string{}
	for _, d := range w.Take() {
		names := d.Names.AppendTo(nil)
		slices.Sort(names)
		out[d.TypeURL] = names
	}
	return out
}

func signalled(c *Cache) bool {
	select {
	case <-c.InterestChanged():
		return true
	default:
		return false
	}
}

func TestWatchersAreMarkedForWhatTheyWatch(t *testing.T) {
	c := New(Options{Retention: time.Minute})
	a, b, wc := NewWatch(), NewWatch(), NewWatch()
	c.Watch(a, eds, "x")
	c.Watch(b, eds, "y")
	c.WatchWildcard(wc, eds)
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}})

	if got := taken(a); !slices.Equal(got[eds], []string{"x"}) {
		t.Errorf("watcher of x: %v", got)
	}
	if got := taken(b); len(got) != 0 {
		t.Errorf("watcher of y was marked: %v", got)
	}
	if got := taken(wc); !slices.Equal(got[eds], []string{"x"}) {
		t.Errorf("wildcard watcher: %v", got)
	}
	// The same version again is not a change.
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}})
	if got := taken(a); len(got) != 0 {
		t.Errorf("an unchanged resource marked its watcher: %v", got)
	}
	c.Apply(eds, Change{Removed: []string{"x"}})
	if got := c.Get(eds, []string{"x"}); got[0].Resource != nil || !got[0].Absent {
		t.Errorf("after removal: %+v", got[0])
	}
}

func TestUnionOfInterestsAndRetention(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(Options{Retention: time.Minute, Now: clk.now})
	a, b := NewWatch(), NewWatch()
	c.Watch(a, eds, "x", "y")
	c.Watch(b, eds, "y", "z")
	if !signalled(c) {
		t.Fatal("new names did not signal an interest change")
	}
	if got := interest(c).Names; !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("union: %v", got)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}})

	c.Release(a)
	if signalled(c) {
		t.Fatal("releasing a watcher changed the interest before retention ended")
	}
	clk.t = clk.t.Add(30 * time.Second)
	c.Sweep()
	if got := interest(c).Names; !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("within retention: %v", got)
	}
	// A client coming back within retention finds x at once.
	if got := c.Get(eds, []string{"x"}); got[0].Resource == nil {
		t.Fatal("x was dropped within retention")
	}
	clk.t = clk.t.Add(31 * time.Second)
	if empty := c.Sweep(); empty {
		t.Fatal("cache reported empty while b still watches")
	}
	if !signalled(c) {
		t.Fatal("end of retention did not signal an interest change")
	}
	if got := interest(c).Names; !slices.Equal(got, []string{"y", "z"}) {
		t.Fatalf("after retention: %v", got)
	}
	if got := c.Get(eds, []string{"x"}); got[0].Resource != nil {
		t.Fatal("x still cached after retention")
	}
	c.Release(b)
	clk.t = clk.t.Add(2 * time.Minute)
	if !c.Sweep() {
		t.Fatal("cache not empty after every retention ended")
	}
}

func TestWildcardRetention(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(Options{Retention: time.Second, Now: clk.now})
	w := NewWatch()
	c.WatchWildcard(w, eds)
	if !interest(c).Wildcard {
		t.Fatal("wildcard not in the interest")
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1"), res("y", "1")}, Synced: true})
	if all, synced := c.All(eds); len(all) != 2 || !synced {
		t.Fatalf("All: %d resources, synced %v", len(all), synced)
	}
	c.UnwatchWildcard(w, eds)
	clk.t = clk.t.Add(2 * time.Second)
	c.Sweep()
	if _, ok := c.Interest()[eds]; ok {
		t.Fatal("wildcard still wanted after retention")
	}
	if all, synced := c.All(eds); len(all) != 0 || synced {
		t.Fatalf("after retention: %d resources, synced %v", len(all), synced)
	}
}

func TestUpdateIgnoresUnwantedResources(t *testing.T) {
	c := New(Options{Retention: time.Minute})
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}})
	if got := c.Get(eds, []string{"x"}); got[0].Resource != nil {
		t.Fatal("a resource nobody wants was cached")
	}
}

func TestWatchCoalesces(t *testing.T) {
	w := NewWatch()
	w.Mark(eds, 5, "a")
	w.Mark(eds, 3, "b")
	w.Mark(eds, 9, "a")
	select {
	case <-w.Ready():
	default:
		t.Fatal("not woken")
	}
	d := w.Take().Of(eds)
	if d.Seq != 3 || d.Names.Len() != 2 {
		t.Fatalf("dirty: seq %d names %v", d.Seq, d.Names)
	}
	if w.Take() != nil {
		t.Fatal("Take did not clear")
	}
}

// The bound evicts the least recently used resources nobody watches, never a
// watched one, and takes them out of the interest.
func TestMaxResourcesEvictsIdleLRU(t *testing.T) {
	c := New(Options{Retention: time.Hour, MaxResources: 2})
	a, b := NewWatch(), NewWatch()
	c.Watch(a, eds, "x", "y")
	c.Watch(b, eds, "z")
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1"), res("y", "1"), res("z", "1")}})
	if c.Len() != 3 || c.Evictions() != 0 {
		t.Fatalf("watched resources were evicted: len %d, evictions %d", c.Len(), c.Evictions())
	}
	signalled(c)
	c.Unwatch(a, eds, "x")
	c.Unwatch(a, eds, "y")
	c.Apply(eds, Change{Upserts: []*Resource{res("z", "2")}}) // any update applies the bound
	if got := interest(c).Names; !slices.Equal(got, []string{"y", "z"}) {
		t.Fatalf("after eviction the interest is %v, want [y z] (x was idle longest)", got)
	}
	if !signalled(c) || c.Len() != 2 || c.Evictions() != 1 {
		t.Fatalf("len %d, evictions %d", c.Len(), c.Evictions())
	}
	// Watching y again protects it; z's watcher leaving makes z the only
	// candidate.
	c.Watch(a, eds, "y")
	c.Watch(a, eds, "w")
	c.Apply(eds, Change{Upserts: []*Resource{res("w", "1")}})
	if got := c.Get(eds, []string{"w", "y", "z"}); got[0].Resource == nil || got[1].Resource == nil || got[2].Resource == nil {
		t.Fatalf("watched resources evicted: %+v", got)
	}
	c.Release(b)
	c.Apply(eds, Change{Upserts: []*Resource{res("w", "2")}})
	if got := c.Get(eds, []string{"z"}); got[0].Resource != nil {
		t.Fatal("z, idle and over the bound, was kept")
	}
}

// The sweep retires what nobody watches oldest first and each at its own
// time: a name left later is kept until its own retention ends, and a name
// watched again is not retired at all.
func TestSweepRetiresEachAtItsTime(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(Options{Retention: time.Minute, Now: clk.now})
	a, b, d := NewWatch(), NewWatch(), NewWatch()
	c.Watch(a, eds, "early", "back")
	c.Watch(b, eds, "late")
	c.Apply(eds, Change{Upserts: []*Resource{res("early", "1"), res("late", "1"), res("back", "1")}})
	c.Release(a)
	clk.t = clk.t.Add(30 * time.Second)
	c.Release(b)
	c.Watch(d, eds, "back") // watched again within retention
	clk.t = clk.t.Add(31 * time.Second)
	c.Sweep()
	if got := interest(c).Names; !slices.Equal(got, []string{"back", "late"}) {
		t.Fatalf("61s after the first left: %v, want back and late", got)
	}
	clk.t = clk.t.Add(30 * time.Second)
	c.Sweep()
	if got := interest(c).Names; !slices.Equal(got, []string{"back"}) {
		t.Fatalf("after late's retention: %v, want back", got)
	}
	if got := c.Get(eds, []string{"early", "late", "back"}); got[0].Resource != nil || got[1].Resource != nil || got[2].Resource == nil {
		t.Fatalf("cached after the sweeps: %+v", got)
	}
}

// A resource held only because a client wanted its alias goes when the
// alias's retention ends.
func TestSweepDropsWhatOnlyAnAliasHeld(t *testing.T) {
	const vhds = "type.googleapis.com/envoy.config.route.v3.VirtualHost"
	clk := &clock{t: time.Unix(1000, 0)}
	c := New(Options{Retention: time.Minute, Now: clk.now})
	w := NewWatch()
	c.Watch(w, vhds, "alias")
	r := res("vh", "1")
	r.Aliases = []string{"alias"}
	c.Apply(vhds, Change{Upserts: []*Resource{r}})
	if c.Get(vhds, []string{"alias"})[0].Resource != r {
		t.Fatal("the alias does not resolve")
	}
	c.Release(w)
	clk.t = clk.t.Add(2 * time.Minute)
	if !c.Sweep() {
		t.Fatal("the cache is not empty after the alias's retention")
	}
	if c.Len() != 0 {
		t.Fatalf("%d resources left", c.Len())
	}
}

// A wildcard upstream cannot answer is said so while it is wanted and not
// answered: its watchers are marked to learn it, and it is cleared by
// anything upstream sends of the type and by WildcardReachable; a type
// answered already is never said so.
func TestWildcardUnavailable(t *testing.T) {
	c := New(Options{Retention: time.Minute})
	w := NewWatch()
	c.WatchWildcard(w, eds)
	w.Take()
	c.Apply(eds, Change{WildcardUnavailable: "down"})
	if got := c.WildcardUnavailable(eds); got != "down" {
		t.Fatalf("WildcardUnavailable = %q, want down", got)
	}
	if _, marked := taken(w)[eds]; !marked {
		t.Fatal("the wildcard's watcher was not marked")
	}
	c.WildcardReachable(eds)
	if got := c.WildcardUnavailable(eds); got != "" {
		t.Fatalf("after WildcardReachable: %q", got)
	}
	c.Apply(eds, Change{WildcardUnavailable: "down"})
	c.Apply(eds, Change{Upserts: []*Resource{res("a", "1")}})
	if got := c.WildcardUnavailable(eds); got != "" {
		t.Fatalf("after a resource arrived: %q", got)
	}
	c.Apply(eds, Change{Synced: true})
	c.Apply(eds, Change{WildcardUnavailable: "down"})
	if got := c.WildcardUnavailable(eds); got != "" {
		t.Fatalf("an answered wildcard said unavailable: %q", got)
	}
}

package cache

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// guarded returns a cache with the guard on and a wildcard watcher of n
// present EDS resources, and the events it reports.
func guarded(t *testing.T, n int, g Guard, clk *clock) (*Cache, *Watch, *[]GuardEvent) {
	t.Helper()
	var events []GuardEvent
	c := New(Options{Retention: time.Minute, Guard: g, Now: clk.now, OnGuard: func(ev GuardEvent) { events = append(events, ev) }})
	w := NewWatch()
	c.WatchWildcard(w, eds)
	var rs []*Resource
	for i := range n {
		rs = append(rs, res(fmt.Sprintf("r%03d", i), "1"))
	}
	c.Apply(eds, Change{Upserts: rs, Synced: true})
	w.Take()
	return c, w, &events
}

func names(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("r%03d", i))
	}
	return out
}

var defaultGuard = Guard{MaxRemovedFraction: 0.5, MinResources: 10, Window: 10 * time.Second}

// Upstream clearing a type is held: the resources stay, nobody is marked
// with a removal, additions still flow; releasing applies the removals.
func TestGuardHoldsAMassRemoval(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c, w, events := guarded(t, 100, defaultGuard, clk)
	c.Apply(eds, Change{Removed: names(100), Upserts: []*Resource{res("new", "1")}})
	if _, synced := c.All(eds); len(c.State(eds).Resources) != 101 || !synced {
		t.Fatalf("after a held removal the type has %d resources, want 101", len(c.State(eds).Resources))
	}
	if got := taken(w)[eds]; !slices.Equal(got, []string{"new"}) {
		t.Fatalf("watcher marked with %v, want only the addition", got)
	}
	holds := c.Holds()
	if len(holds) != 1 || len(holds[0].Names) != 100 || holds[0].TypeURL != eds {
		t.Fatalf("holds %+v", holds)
	}
	if len(*events) != 1 || (*events)[0].End != "" || (*events)[0].Held != 100 || (*events)[0].Base != 101 { // the addition is applied first
		t.Fatalf("events %+v", *events)
	}
	released := c.ReleaseHolds("")
	if len(released) != 1 || len(released[0].Names) != 100 {
		t.Fatalf("released %+v", released)
	}
	if got := taken(w)[eds]; len(got) != 100 {
		t.Fatalf("after release the watcher is marked with %d names, want 100", len(got))
	}
	if n := len(c.State(eds).Resources); n != 1 {
		t.Fatalf("after release %d resources, want 1", n)
	}
	if ev := (*events)[1]; ev.End != EndReleased || len(ev.Applied) != 100 {
		t.Fatalf("end event %+v", ev)
	}
	if len(c.Holds()) != 0 {
		t.Fatal("a hold is left after release")
	}
}

func TestGuardLetsSmallRemovalsThrough(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources int
		remove    []int // removals in turn, each its own response
		held      int   // names held at the end
	}{
		{"below min_resources", 9, []int{9}, 0},
		{"below the fraction", 100, []int{50}, 0},
		{"past the fraction over the window", 100, []int{40, 20}, 20},
		{"one past the fraction", 100, []int{51}, 51},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t: time.Unix(1000, 0)}
			c, _, _ := guarded(t, tc.resources, defaultGuard, clk)
			next := 0
			for _, n := range tc.remove {
				c.Apply(eds, Change{Removed: names(tc.resources)[next : next+n]})
				next += n
				clk.t = clk.t.Add(time.Second)
			}
			held := 0
			for _, h := range c.Holds() {
				held += len(h.Names)
			}
			if held != tc.held {
				t.Fatalf("%d held, want %d", held, tc.held)
			}
			if want := tc.resources - next + tc.held; len(c.State(eds).Resources) != want {
				t.Fatalf("%d resources left, want %d", len(c.State(eds).Resources), want)
			}
		})
	}
}

// Removals older than the window no longer count.
func TestGuardWindowSlides(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c, _, _ := guarded(t, 100, defaultGuard, clk)
	c.Apply(eds, Change{Removed: names(100)[:40]})
	clk.t = clk.t.Add(11 * time.Second)
	c.Apply(eds, Change{Removed: names(100)[40:60]}) // 20 of 60: a third
	if len(c.Holds()) != 0 {
		t.Fatalf("held after the window passed: %+v", c.Holds())
	}
}

// A hold ends when upstream sends every held resource again, and when
// Guard.Hold passes (at a sweep).
func TestGuardHoldEnds(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	g := defaultGuard
	g.Hold = time.Minute
	c, _, events := guarded(t, 20, g, clk)
	c.Apply(eds, Change{Removed: names(20)})
	var again []*Resource
	for _, n := range names(20) {
		again = append(again, res(n, "2"))
	}
	c.Apply(eds, Change{Upserts: again})
	if len(c.Holds()) != 0 || (*events)[len(*events)-1].End != EndResent {
		t.Fatalf("holds %+v events %+v", c.Holds(), *events)
	}

	c.Apply(eds, Change{Removed: names(20)})
	clk.t = clk.t.Add(59 * time.Second)
	c.Sweep()
	if len(c.Holds()) != 1 {
		t.Fatal("the hold ended before guard.hold")
	}
	clk.t = clk.t.Add(time.Second)
	c.Sweep()
	if len(c.Holds()) != 0 || len(c.State(eds).Resources) != 0 || (*events)[len(*events)-1].End != EndExpired {
		t.Fatalf("after guard.hold: holds %+v, %d resources, events %+v", c.Holds(), len(c.State(eds).Resources), *events)
	}
}

// Names that are not present (the does-not-exist timer, unroutable names)
// are never held, and the guard off holds nothing.
func TestGuardIgnoresAbsentNamesAndOff(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c, _, _ := guarded(t, 20, defaultGuard, clk)
	w := NewWatch()
	var missing []string
	for i := range 30 {
		missing = append(missing, fmt.Sprintf("missing-%d", i))
	}
	if err := c.Watch(w, eds, missing...); err != nil {
		t.Fatal(err)
	}
	c.Apply(eds, Change{Removed: missing})
	if len(c.Holds()) != 0 {
		t.Fatalf("absent names held: %+v", c.Holds())
	}
	off, _, _ := guarded(t, 100, Guard{}, clk)
	off.Apply(eds, Change{Removed: names(100)})
	if len(off.Holds()) != 0 || len(off.State(eds).Resources) != 0 {
		t.Fatal("the zero Guard held removals")
	}
}

// The removal of every resource of a type is held for Guard.WipeHold at
// any size, below guard.min_resources and with the mass guard off too:
// clients keep the resources, the hold ends when they come back, and
// once WipeHold has passed the removal is applied. A removal that leaves
// something is not a wipe.
func TestGuardHoldsAWipe(t *testing.T) {
	for _, tc := range []struct {
		name  string
		guard Guard
	}{
		{"below min_resources", Guard{MaxRemovedFraction: 0.5, MinResources: 10, Window: 10 * time.Second, Hold: time.Hour, WipeHold: 2 * time.Second}},
		{"mass guard off", Guard{WipeHold: 2 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t: time.Unix(1000, 0)}
			c, w, events := guarded(t, 2, tc.guard, clk)
			c.Apply(eds, Change{Removed: names(2)})
			if n := len(c.State(eds).Resources); n != 2 || len(taken(w)[eds]) != 0 {
				t.Fatalf("after a wipe: %d resources, watcher marked %v; want both kept, nobody marked", n, taken(w))
			}
			if len(*events) != 1 || !(*events)[0].Wipe || (*events)[0].Held != 2 {
				t.Fatalf("events %+v", *events)
			}
			c.Apply(eds, Change{Upserts: []*Resource{res("r000", "1"), res("r001", "1")}})
			if len(c.Holds()) != 0 || len(*events) != 2 || (*events)[1].End != EndResent || !(*events)[1].Wipe {
				t.Fatalf("after the resources came back: holds %+v, events %+v", c.Holds(), *events)
			}

			c.Apply(eds, Change{Removed: names(2)})
			clk.t = clk.t.Add(time.Second)
			c.Sweep()
			if n := len(c.State(eds).Resources); n != 2 {
				t.Fatalf("%d resources before WipeHold passed, want 2", n)
			}
			clk.t = clk.t.Add(time.Second)
			c.Sweep()
			if n := len(c.State(eds).Resources); n != 0 || len(taken(w)[eds]) != 2 {
				t.Fatalf("%d resources after WipeHold, want 0 with both removals marked", n)
			}
			if ev := (*events)[len(*events)-1]; ev.End != EndExpired || !ev.Wipe || len(ev.Applied) != 2 {
				t.Fatalf("end event %+v", ev)
			}
		})
	}
	clk := &clock{t: time.Unix(1000, 0)}
	c, _, events := guarded(t, 2, Guard{WipeHold: 2 * time.Second}, clk)
	c.Apply(eds, Change{Removed: names(1)})
	if n := len(c.State(eds).Resources); n != 1 || len(*events) != 0 {
		t.Fatalf("a removal of one of two: %d resources left, events %+v; want 1, none", n, *events)
	}
}

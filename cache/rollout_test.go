package cache

import (
	"slices"
	"testing"
	"time"
)

const cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster"

// rolling returns a cache with the rollout on (2 canaries, a minute's bake)
// and n watches of x ranked 1..n, x at version 1.
func rolling(t *testing.T, n int, clk *clock, events *[]RolloutEvent) (*Cache, []*Watch) {
	t.Helper()
	c := New(Options{Retention: time.Minute, Now: clk.now, Rollout: Rollout{Canary: 2, Bake: time.Minute},
		OnRollout: func(ev RolloutEvent) { *events = append(*events, ev) }})
	var ws []*Watch
	for i := range n {
		w := NewWatch()
		w.SetRank(uint64(i + 1))
		if err := c.Watch(w, eds, "x"); err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "1")}}) // nothing pending: released at once
	for _, w := range ws {
		w.Take()
	}
	return c, ws
}

func versionOf(c *Cache, w *Watch, typeURL, name string) string {
	l := c.ReadFor(w, typeURL, []string{name}, false).Lookups[0]
	if l.Resource == nil {
		return ""
	}
	return l.Resource.Version
}

func TestRolloutCanariesFirstThenAll(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, ws := rolling(t, 5, clk, &events)
	if got := versionOf(c, ws[4], eds, "x"); got != "1" {
		t.Fatalf("before the change: %q", got)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "2")}})
	for i, w := range ws {
		marked := len(taken(w)[eds]) > 0
		if canary := i < 2; marked != canary {
			t.Errorf("watch %d: marked %v, canary %v", i, marked, canary)
		}
	}
	if got := versionOf(c, ws[0], eds, "x"); got != "2" {
		t.Errorf("canary reads %q, want the candidate 2", got)
	}
	if got := versionOf(c, ws[3], eds, "x"); got != "1" {
		t.Errorf("non-canary reads %q, want the released 1", got)
	}
	if got := versionOf(c, nil, eds, "x"); got != "1" {
		t.Errorf("a poll reads %q, want the released 1", got)
	}
	if got := c.Get(eds, []string{"x"})[0].Resource.Version; got != "2" {
		t.Errorf("Get (upstream's side) reads %q, want the candidate 2", got)
	}
	v := c.ReadFor(ws[0], eds, []string{"x"}, false).Version
	c.Verdict(ws[0], eds, v, false, "n0", "")
	if len(taken(ws[3])[eds]) > 0 {
		t.Fatal("released after one of two canaries ACKed")
	}
	c.Verdict(ws[1], eds, v, false, "n1", "")
	if got := taken(ws[3])[eds]; !slices.Equal(got, []string{"x"}) {
		t.Fatalf("after both ACKs the group is marked with %v", got)
	}
	if got := versionOf(c, ws[3], eds, "x"); got != "2" {
		t.Errorf("after release the group reads %q", got)
	}
	if last := events[len(events)-1]; last.Kind != RolloutReleased || last.Baked {
		t.Errorf("last event %+v", last)
	}
	if len(c.Rollouts()) != 0 {
		t.Errorf("pending after release: %+v", c.Rollouts())
	}
}

// A canary's NACK holds the change past the bake; the next change of the
// same resource supersedes it and rolls out again.
func TestRolloutNACKHolds(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, ws := rolling(t, 5, clk, &events)
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "bad")}})
	v := c.ReadFor(ws[0], eds, []string{"x"}, false).Version
	c.Verdict(ws[0], eds, v, true, "n0", "unknown field")
	clk.t = clk.t.Add(3 * time.Minute)
	c.Sweep()
	if got := versionOf(c, ws[4], eds, "x"); got != "1" {
		t.Fatalf("held change reached the group: %q", got)
	}
	rs := c.Rollouts()
	if len(rs) != 1 || !rs[0].Held || rs[0].Detail != "unknown field" || rs[0].Who != "n0" {
		t.Fatalf("rollouts %+v", rs)
	}
	if !slices.ContainsFunc(events, func(ev RolloutEvent) bool { return ev.Kind == RolloutHalted && ev.Detail == "unknown field" }) {
		t.Fatalf("no halt event: %+v", events)
	}
	for _, w := range ws {
		w.Take()
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "3")}})
	if got := versionOf(c, ws[0], eds, "x"); got != "3" {
		t.Fatalf("canary reads %q after the superseding change", got)
	}
	clk.t = clk.t.Add(time.Minute)
	c.Sweep() // the canaries did not answer: baked
	if got := versionOf(c, ws[4], eds, "x"); got != "3" {
		t.Fatalf("after bake the group reads %q, want 3", got)
	}
	if len(c.Rollouts()) != 0 {
		t.Fatalf("pending: %+v", c.Rollouts())
	}
}

// Changes are released in the order they came: a later change that is
// ready waits for an earlier one that is not.
func TestRolloutKeepsOrder(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, ws := rolling(t, 3, clk, &events)
	for _, w := range ws {
		if err := c.Watch(w, cds, "x"); err != nil {
			t.Fatal(err)
		}
	}
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "1")}})
	c.Apply(cds, Change{Upserts: []*Resource{res("x", "2")}}) // first
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "2")}}) // second
	ve := c.ReadFor(ws[0], eds, []string{"x"}, false).Version
	c.Verdict(ws[0], eds, ve, false, "n0", "")
	c.Verdict(ws[1], eds, ve, false, "n1", "")
	if got := versionOf(c, ws[2], eds, "x"); got != "1" {
		t.Fatalf("EDS released before the CDS change before it: %q", got)
	}
	vc := c.ReadFor(ws[0], cds, []string{"x"}, false).Version
	c.Verdict(ws[0], cds, vc, false, "n0", "")
	c.Verdict(ws[1], cds, vc, false, "n1", "")
	if versionOf(c, ws[2], cds, "x") != "2" || versionOf(c, ws[2], eds, "x") != "2" {
		t.Fatal("both changes not released once the first was ACKed")
	}
}

// A change nobody watches is released at once; a watched change no canary
// was sent is released after the bake.
func TestRolloutUnwatchedAndNoCanary(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, _ := rolling(t, 3, clk, &events)
	w := NewWatch()
	w.SetRank(99) // never a canary
	if err := c.Watch(w, eds, "y"); err != nil {
		t.Fatal(err)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("y", "1")}})
	if got := versionOf(c, w, eds, "y"); got != "1" {
		t.Fatalf("a first configuration is not held: the group reads %q", got)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("y", "2")}})
	if got := versionOf(c, w, eds, "y"); got != "1" {
		t.Fatalf("no canary watches y: before the bake the group reads %q", got)
	}
	clk.t = clk.t.Add(time.Minute)
	c.Sweep()
	if got := versionOf(c, w, eds, "y"); got != "2" {
		t.Fatalf("after the bake %q", got)
	}
	if last := events[len(events)-1]; last.Kind != RolloutReleased || !last.Baked {
		t.Fatalf("last event %+v", last)
	}
	// A name still wanted (retained) that nobody watches: its change goes
	// to no one, so it is released at once.
	r := NewWatch()
	r.SetRank(100)
	if err := c.Watch(r, eds, "kept"); err != nil {
		t.Fatal(err)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("kept", "1")}})
	c.Unwatch(r, eds, "kept")
	c.Apply(eds, Change{Upserts: []*Resource{res("kept", "2")}})
	if len(c.Rollouts()) != 0 || versionOf(c, nil, eds, "kept") != "2" {
		t.Fatalf("an unwatched change waits: %+v, the group reads %q", c.Rollouts(), versionOf(c, nil, eds, "kept"))
	}
}

// A canary that leaves and comes back (same rank) is a canary again.
func TestRolloutCanaryIsStable(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, ws := rolling(t, 4, clk, &events)
	c.Release(ws[0])
	again := NewWatch()
	again.SetRank(1)
	if err := c.Watch(again, eds, "x"); err != nil {
		t.Fatal(err)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "2")}})
	if got := versionOf(c, again, eds, "x"); got != "2" {
		t.Fatalf("the returning canary reads %q", got)
	}
	if got := versionOf(c, ws[2], eds, "x"); got != "1" {
		t.Fatalf("a non-canary reads %q", got)
	}
}

// A warm restart saves what the group was released, not a change that
// waits: a held change is not released by a restart.
func TestRolloutExportsTheReleased(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, ws := rolling(t, 3, clk, &events)
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "bad")}})
	c.Verdict(ws[0], eds, c.ReadFor(ws[0], eds, []string{"x"}, false).Version, true, "n0", "no")
	states, _ := c.Export()
	if len(states) != 1 || len(states[0].Resources) != 1 || states[0].Resources[0].Version != "1" {
		t.Fatalf("exported %+v", states)
	}
}

// An operator's release overrides a canary's NACK: the held change reaches
// the whole group, once, and is told as released by an operator. A filter
// by another type releases nothing.
func TestRolloutReleaseHeld(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, ws := rolling(t, 5, clk, &events)
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "bad")}})
	v := c.ReadFor(ws[0], eds, []string{"x"}, false).Version
	c.Verdict(ws[0], eds, v, true, "n0", "unknown field")
	for _, w := range ws {
		w.Take()
	}
	if got := c.ReleaseHeld(cds); len(got) != 0 {
		t.Fatalf("released by another type: %+v", got)
	}
	if got := versionOf(c, ws[4], eds, "x"); got != "1" {
		t.Fatalf("held change reached the group: %q", got)
	}
	got := c.ReleaseHeld(eds)
	if len(got) != 1 || !got[0].Held || got[0].Who != "n0" || got[0].Detail != "unknown field" || !slices.Equal(got[0].Types, []string{eds}) {
		t.Fatalf("ReleaseHeld: %+v", got)
	}
	if got := taken(ws[4])[eds]; !slices.Equal(got, []string{"x"}) {
		t.Fatalf("after the release the group is marked with %v", got)
	}
	if got := versionOf(c, ws[4], eds, "x"); got != "bad" {
		t.Errorf("after the release the group reads %q", got)
	}
	if rs := c.Rollouts(); len(rs) != 0 {
		t.Errorf("pending after the release: %+v", rs)
	}
	if last := events[len(events)-1]; last.Kind != RolloutReleased || !last.Released || last.Baked {
		t.Errorf("last event %+v, want released by an operator", last)
	}
	if again := c.ReleaseHeld(""); len(again) != 0 {
		t.Errorf("released twice: %+v", again)
	}
}

package cache

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// A watch that is marked, taken and recycled over and over reuses its sets:
// nothing of an earlier change shows in a later one, and a mark allocates
// nothing.
func TestWatchRecycleReusesSets(t *testing.T) {
	w := NewWatch()
	w.OnReady(func() {})
	w.Mark("t", 1, "a", "b")
	d := w.Take()
	w.Recycle(d)
	w.Mark("t", 2, "c")
	got := w.Take()
	if len(got) != 1 || got.Of("t").Names.Len() != 1 || got.Of("t").Seq != 2 {
		t.Fatalf("after recycling: %+v", got.Of("t"))
	}
	if !got.Of("t").Names.Has("c") {
		t.Fatalf("names %v, want c alone", got.Of("t").Names.AppendTo(nil))
	}
	w.Recycle(got)
	allocs := testing.AllocsPerRun(100, func() {
		w.Mark("t", 3, "x")
		w.Recycle(w.Take())
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per mark, take and recycle", allocs)
	}
}

// A large change's maps are not kept for reuse: a watch does not hold on to
// the memory of its largest change.
func TestWatchRecycleDropsLargeSets(t *testing.T) {
	w := NewWatch()
	w.OnReady(func() {})
	names := make([]string, recycleMax+1)
	for i := range names {
		names[i] = string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	w.Mark("t", 1, names...)
	w.Recycle(w.Take())
	w.mu.Lock()
	for _, d := range w.free {
		if d.Names.more != nil {
			t.Errorf("a map of %d names kept after a change of %d names", len(d.Names.more), len(names))
		}
	}
	w.mu.Unlock()
	w.Mark("t", 2, "x")
	if d := w.Take().Of("t"); d.Names.Len() != 1 {
		t.Fatalf("after a large change, the next one marks %v", d.Names.AppendTo(nil))
	}

	// A record Recycle has no room to keep is emptied all the same: it may
	// be one of the watch's own, which stays as long as the watch.
	w = NewWatch()
	w.OnReady(func() {})
	w.Mark("t", 1, names...)
	d := w.Take()
	w.mu.Lock()
	for len(w.free) < maxFree {
		w.free = append(w.free, &Dirty{})
	}
	w.mu.Unlock()
	w.Recycle(d)
	if own := &w.own[0]; own.Names.Len() != 0 || own.Names.more != nil {
		t.Errorf("a record not kept still holds %d names and a map: %v", own.Names.Len(), own.Names.more != nil)
	}
}

// A NameSet holds a few names in itself and more in a map, and reads the
// same either way: duplicates count once, and a reset empties it.
func TestNameSet(t *testing.T) {
	var nilSet *NameSet
	if nilSet.Has("a") || nilSet.Len() != 0 || len(nilSet.AppendTo(nil)) != 0 {
		t.Fatal("a nil set is not empty")
	}
	for _, n := range []int{1, fewNames, fewNames + 1, 3 * fewNames} {
		var s NameSet
		want := map[string]bool{}
		for i := range n {
			name := string(rune('a' + i))
			s.Add(name)
			s.Add(name) // counted once
			want[name] = true
		}
		if s.Len() != n {
			t.Fatalf("%d names added, Len %d", n, s.Len())
		}
		got := s.AppendTo(nil)
		seen := map[string]bool{}
		for name := range s.All() {
			seen[name] = true
		}
		if len(got) != n || len(seen) != n {
			t.Fatalf("%d names added: AppendTo %v, All %v", n, got, seen)
		}
		for _, name := range got {
			if !want[name] || !seen[name] || !s.Has(name) {
				t.Fatalf("%d names added: %q read back but not added, or not found", n, name)
			}
		}
		if s.Has("zz") {
			t.Fatalf("%d names added: Has a name never added", n)
		}
		s.reset()
		if s.Len() != 0 || s.Has("a") || len(s.AppendTo(nil)) != 0 {
			t.Fatalf("%d names added: not empty after reset", n)
		}
		s.Add("x")
		if s.Len() != 1 || !s.Has("x") {
			t.Fatalf("%d names added: after reset, one added reads %v", n, s.AppendTo(nil))
		}
	}
}

// TakeBelow takes what changed of the types that go before a rank and
// leaves the others marked; looking when nothing is below allocates
// nothing, and its records are reused once given back.
func TestWatchTakeBelow(t *testing.T) {
	w := NewWatch()
	w.OnReady(func() {})
	cds, lds, rds := resourcev3.ClusterType, resourcev3.ListenerType, resourcev3.RouteType
	w.Mark(rds, 1, "r")
	w.Mark(lds, 2, "l")
	var buf [2]*Dirty
	if got := w.TakeBelow(xds.Rank(rds), buf[:0]); len(got) != 1 || got[0].TypeURL != lds {
		t.Fatalf("below RDS with LDS and RDS marked: %+v", got)
	} else {
		w.RecycleRecords(got)
	}
	if got := w.TakeBelow(xds.Rank(rds), buf[:0]); len(got) != 0 {
		t.Fatalf("below RDS after taking LDS: %+v", got)
	}
	w.Mark(cds, 3, "y")
	got := w.TakeBelow(xds.Rank(lds), buf[:0])
	if len(got) != 1 || got[0].TypeURL != cds || !got[0].Names.Has("y") {
		t.Fatalf("below LDS with CDS marked: %+v", got)
	}
	w.RecycleRecords(got)
	rest := w.Take()
	if len(rest) != 1 || rest[0].TypeURL != rds || !rest[0].Names.Has("r") {
		t.Fatalf("left marked: %+v", rest)
	}
	w.Recycle(rest)
	allocs := testing.AllocsPerRun(100, func() {
		w.Mark(rds, 4, "r")
		w.TakeBelow(xds.Rank(rds), buf[:0])
		w.Recycle(w.Take())
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per mark, look below and take", allocs)
	}
}

// A watch set first (a relay below) is woken before the others of each
// change it is marked in, whatever the order the cache holds them in.
func TestFirstWatchIsWokenFirst(t *testing.T) {
	c := New(Options{})
	var mu sync.Mutex
	var order []*Watch
	watch := func(first bool) *Watch {
		w := NewWatch()
		w.SetFirst(first)
		w.OnReady(func() {
			mu.Lock()
			order = append(order, w)
			mu.Unlock()
		})
		return w
	}
	var others []*Watch
	for range 50 {
		w := watch(false)
		c.Watch(w, "type.googleapis.com/envoy.config.cluster.v3.Cluster", "a")
		others = append(others, w)
	}
	first := watch(true)
	c.Watch(first, "type.googleapis.com/envoy.config.cluster.v3.Cluster", "a")
	wild := watch(true)
	c.WatchWildcard(wild, "type.googleapis.com/envoy.config.cluster.v3.Cluster")
	for round := range 5 {
		mu.Lock()
		order = order[:0]
		mu.Unlock()
		c.Apply("type.googleapis.com/envoy.config.cluster.v3.Cluster", Change{Upserts: []*Resource{res("a", fmt.Sprint(round))}})
		mu.Lock()
		got := slices.Clone(order)
		mu.Unlock()
		if len(got) != 52 {
			t.Fatalf("round %d: %d watches woken, want 52", round, len(got))
		}
		if !(got[0] == first && got[1] == wild || got[0] == wild && got[1] == first) {
			t.Fatalf("round %d: the watches set first were woken at %d and %d", round, slices.Index(got, first), slices.Index(got, wild))
		}
	}
}

// A watch's OnReady runs with no lock of the cache held
// (docs/architecture.md, "Locks": no lock is held across a callback): not
// Cache.mu, and not Cache.wakeMu, under which the marks are made. Each op
// that marks is tried: an upstream change (Apply), a canary's ACK that
// releases a change to the others (Verdict), a bake that passes (Sweep).
func TestOnReadyRunsWithNoLockHeld(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, ws := rolling(t, 3, clk, &events)
	woken, held := 0, 0
	for _, w := range ws {
		w.OnReady(func() {
			woken++
			for _, mu := range []interface {
				TryLock() bool
				Unlock()
			}{&c.wakeMu, &c.mu} {
				if !mu.TryLock() {
					held++
					continue
				}
				mu.Unlock()
			}
		})
	}
	step := func(what string, f func()) {
		t.Helper()
		before := woken
		f()
		if woken == before {
			t.Fatalf("%s woke no watch", what)
		}
		if held > 0 {
			t.Fatalf("%s: %d wake-ups ran under a lock of the cache", what, held)
		}
	}
	step("Apply", func() { c.Apply(eds, Change{Upserts: []*Resource{res("x", "2")}}) })
	version := c.ReadFor(ws[0], eds, []string{"x"}, false).Version
	step("Verdict", func() {
		c.Verdict(ws[0], eds, version, false, "a", "")
		c.Verdict(ws[1], eds, version, false, "b", "")
	})
	step("Apply again", func() { c.Apply(eds, Change{Upserts: []*Resource{res("x", "3")}}) })
	clk.t = clk.t.Add(2 * time.Minute)
	step("Sweep", func() { c.Sweep() })
}

package cache

import "testing"

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
	if len(got) != 1 || len(got.Of("t").Names) != 1 || got.Of("t").Seq != 2 {
		t.Fatalf("after recycling: %+v", got.Of("t"))
	}
	if _, ok := got.Of("t").Names["c"]; !ok {
		t.Fatalf("names %v, want c alone", got.Of("t").Names)
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

// A large change's sets are not kept for reuse: a watch does not hold on to
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
	kept := len(w.free)
	w.mu.Unlock()
	if kept != 0 {
		t.Fatalf("%d sets kept after a change of %d names", kept, len(names))
	}
	w.Mark("t", 2, "x")
	if d := w.Take().Of("t"); len(d.Names) != 1 {
		t.Fatalf("after a large change, the next one marks %v", d.Names)
	}
}

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
	if len(got) != 1 || len(got["t"].Names) != 1 || got["t"].Seq != 2 {
		t.Fatalf("after recycling: %+v", got["t"])
	}
	if _, ok := got["t"].Names["c"]; !ok {
		t.Fatalf("names %v, want c alone", got["t"].Names)
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

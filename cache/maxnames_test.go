package cache

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// MaxNames bounds the names a group wants: a watch that would pass it
// registers nothing, and names leave the count when their retention ends.
func TestWatchRefusesPastMaxNames(t *testing.T) {
	clk := &clock{t: time.Unix(0, 0)}
	c := New(Options{Retention: time.Minute, MaxNames: 3, Now: clk.now})
	a, b := NewWatch(), NewWatch()
	if err := c.Watch(a, eds, "x", "y"); err != nil {
		t.Fatal(err)
	}
	// Names already wanted cost nothing; duplicates count once.
	if err := c.Watch(b, eds, "x", "y", "z", "z"); err != nil {
		t.Fatalf("a watch within the bound: %v", err)
	}
	var me *MaxNamesError
	if err := c.Watch(b, eds, "v", "w"); !errors.As(err, &me) || me.Max != 3 || me.Wanted != 3 || me.Adding != 2 {
		t.Fatalf("a watch past the bound: %v", err)
	}
	if got := interest(c).Names; !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("after the refusal the interest is %v, want x y z", got)
	}
	// Unwatched names are retained and still count, until retention ends.
	c.Release(a)
	c.Release(b)
	if err := c.Watch(a, eds, "v"); err == nil {
		t.Fatal("a retained name did not count")
	}
	clk.t = clk.t.Add(2 * time.Minute)
	c.Sweep()
	if err := c.Watch(a, eds, "u", "v", "w"); err != nil {
		t.Fatalf("after retention: %v", err)
	}
}

// Names only referenced count against MaxNames where a watch is checked,
// as a watch's names count where references are admitted: a group never
// fetches more than MaxNames names, whichever came first. Wanting a name
// already fetched as a reference adds nothing.
func TestWatchCountsReferencedNames(t *testing.T) {
	clk := &clock{t: time.Unix(0, 0)}
	c := New(Options{Retention: time.Minute, MaxNames: 4, Now: clk.now, Consistency: Consistency{MaxWait: 5 * time.Second}})
	w := NewWatch()
	if err := c.Watch(w, rds, "r"); err != nil {
		t.Fatal(err)
	}
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "1", "a", "b", "c")}}) // r, and a b c referenced: 4
	var me *MaxNamesError
	if err := c.Watch(w, eds, "x"); !errors.As(err, &me) || me.Wanted != 4 || me.Adding != 1 {
		t.Fatalf("a watch past the bound, counting referenced names: %v", err)
	}
	if err := c.Watch(w, cds, "a", "b"); err != nil {
		t.Fatalf("a watch of names already referenced: %v", err)
	}
	fetched := 0
	for _, in := range c.Interest() {
		fetched += len(in.Names)
	}
	if fetched != 4 {
		t.Errorf("the group fetches %d names, want 4 (MaxNames)", fetched)
	}
	// Once r points elsewhere, its old references are retained names: they
	// still count until their retention ends.
	c.Apply(rds, Change{Upserts: []*Resource{route("r", "2")}})
	if err := c.Watch(w, eds, "x"); err == nil {
		t.Fatal("a retained reference did not count")
	}
	clk.t = clk.t.Add(2 * time.Minute)
	c.Sweep()
	if err := c.Watch(w, eds, "x"); err != nil {
		t.Fatalf("after retention: %v", err)
	}
}

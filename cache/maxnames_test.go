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

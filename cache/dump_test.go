package cache

import (
	"slices"
	"testing"
	"time"
)

// AtVersions finds a resource at the version a client was sent: the
// candidate a canary was sent and the released one the rest hold, while
// the rollout holds the change; a version the cache no longer holds, or a
// name it lacks, is nil.
func TestAtVersions(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, _ := rolling(t, 5, clk, &events)
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "2")}}) // to the canaries first
	got := c.AtVersions(eds, []string{"x", "x", "x", "nope"}, []string{"2", "1", "0", "1"})
	var versions []string
	for _, r := range got {
		v := "nil"
		if r != nil {
			v = r.Name + "@" + r.Version
		}
		versions = append(versions, v)
	}
	if want := []string{"x@2", "x@1", "nil", "nil"}; !slices.Equal(versions, want) {
		t.Fatalf("AtVersions: %v, want %v", versions, want)
	}
	if got := c.AtVersions(cds, []string{"x"}, []string{"2"}); got[0] != nil {
		t.Errorf("a type the cache never held: %v", got[0])
	}
}

// Sizes counts each type's present resources, and lists a type wanted
// with none yet.
func TestSizes(t *testing.T) {
	c := New(Options{Retention: time.Minute})
	w := NewWatch()
	for _, n := range []string{"a", "b"} {
		if err := c.Watch(w, eds, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Watch(w, cds, "c"); err != nil {
		t.Fatal(err)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("a", "1"), res("b", "1")}})
	got := c.Sizes()
	if len(got) != 2 || got[0].TypeURL != cds || got[0].Resources != 0 || got[1].TypeURL != eds || got[1].Resources != 2 || got[1].Version == 0 {
		t.Fatalf("Sizes: %+v", got)
	}
}

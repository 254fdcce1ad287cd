package cache

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// Move counts each client where it stands, keeps a bounded sample of who
// rejected, times an ACK only of a version that arrived after the
// client's last one, and forgets a name nobody holds.
func TestMoveCounts(t *testing.T) {
	const typ = "T"
	c := New(Options{})
	t0 := time.Unix(1000, 0)
	pending := Standing{Version: "2", Answer: Pending}
	for i := range MaxRejectedBy + 2 {
		c.Move(typ, "x", Standing{}, pending, t0, t0, Mover{})
		took := c.Move(typ, "x", pending, Standing{Version: "2", Answer: Rejected}, time.Time{}, t0.Add(time.Second), Mover{Node: fmt.Sprint("n", i), Error: fmt.Sprint("bad ", i)})
		if took != 0 {
			t.Fatalf("a NACK timed: %v", took)
		}
	}
	v := c.Convergence([]string{typ}, []string{"x"})[0].Versions[0]
	if v.Rejected != MaxRejectedBy+2 || len(v.RejectedBy) != MaxRejectedBy || v.FirstError != "bad 0" {
		t.Fatalf("after %d NACKs: %+v", MaxRejectedBy+2, v)
	}
	c.Move(typ, "x", Standing{Version: "2", Answer: Rejected}, pending, t0, t0, Mover{Node: "n0"})
	if took := c.Move(typ, "x", pending, Standing{Version: "2", Answer: Accepted}, time.Time{}, t0.Add(3*time.Second), Mover{Since: t0.Add(-time.Second)}); took != 3*time.Second {
		t.Errorf("an ACK of a version that arrived after the client's last: timed %v, want 3s", took)
	}
	v = c.Convergence([]string{typ}, []string{"x"})[0].Versions[0]
	if v.Accepted != 1 || slices.Contains(v.RejectedBy, "n0") || v.Acks != 1 || v.Max != 3*time.Second {
		t.Errorf("after n0 accepted: %+v", v)
	}
	if took := c.Move(typ, "x", Standing{Version: "2", Answer: Accepted}, Standing{Version: "2", Answer: Accepted}, time.Time{}, t0, Mover{}); took != 0 {
		t.Errorf("no move timed %v", took)
	}
	c.Move(typ, "x", Standing{Version: "2", Answer: Accepted}, pending, t0, t0, Mover{})
	if took := c.Move(typ, "x", pending, Standing{Version: "2", Answer: Accepted}, time.Time{}, t0.Add(time.Hour), Mover{Since: t0.Add(time.Minute)}); took != 0 {
		t.Errorf("an ACK of a version sent again, unchanged: timed %v", took)
	}
	c.Move(typ, "x", Standing{Version: "2", Answer: Accepted}, Standing{}, time.Time{}, t0, Mover{})
	for i := range MaxRejectedBy + 1 {
		c.Move(typ, "x", Standing{Version: "2", Answer: Rejected}, Standing{}, time.Time{}, t0, Mover{Node: fmt.Sprint("n", i+1)})
	}
	if rs := c.Convergence(nil, nil); len(rs) != 0 {
		t.Fatalf("every client gone, the counters hold %+v", rs)
	}
}

// MoveAll moves a complete state by name: what left it, what came, and
// what changed or was answered, once each.
func TestMoveAllMergesByName(t *testing.T) {
	const typ = "T"
	c := New(Options{})
	res := func(name, version string) *Resource { return &Resource{Name: name, Version: version} }
	a1, b1, c1, b2, d1 := res("a", "1"), res("b", "1"), res("c", "1"), res("b", "2"), res("d", "1")
	now := time.Unix(1000, 0)
	c.MoveAll(typ, nil, Unsent, []*Resource{a1, b1, c1}, Pending, now, now, Mover{}, nil)
	c.MoveAll(typ, []*Resource{a1, b1, c1}, Pending, []*Resource{a1, b1, c1}, Accepted, time.Time{}, now, Mover{}, nil)
	c.MoveAll(typ, []*Resource{a1, b1, c1}, Accepted, []*Resource{a1, b2, d1}, Pending, now, now, Mover{}, nil)
	got := map[string]string{}
	for _, r := range c.Convergence([]string{typ}, nil) {
		for _, v := range r.Versions {
			got[r.Name+"@"+v.Version] = fmt.Sprintf("p%d a%d", v.Pending, v.Accepted)
		}
	}
	want := map[string]string{"a@1": "p1 a0", "b@2": "p1 a0", "d@1": "p1 a0"}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %q, want %q (all: %v)", k, got[k], w, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("counted %v, want only %v", got, want)
	}
}

// MoveAll tells observe each time to accept with the counters' lock let
// go: observe may read them, or take a lock of its own.
func TestMoveAllObservesUnlocked(t *testing.T) {
	c := New(Options{})
	a, b := &Resource{Name: "a", Version: "1"}, &Resource{Name: "b", Version: "1"}
	received := time.Unix(1000, 0)
	c.MoveAll("T", nil, Unsent, []*Resource{a, b}, Pending, received, received, Mover{}, nil)
	var took []time.Duration
	c.MoveAll("T", []*Resource{a, b}, Pending, []*Resource{a, b}, Accepted, time.Time{}, received.Add(time.Second), Mover{Since: received.Add(-time.Second)},
		func(d time.Duration) {
			if !c.conv.mu.TryLock() {
				t.Error("observe called with the counters locked")
				return
			}
			c.conv.mu.Unlock()
			took = append(took, d)
		})
	if len(took) != 2 || took[0] != time.Second || took[1] != time.Second {
		t.Errorf("observed %v, want 1s for each of a and b", took)
	}
}

// OnRejected is told when a version's count of rejecting clients leaves
// zero, by Move and by MoveAll, with the clients that stand with it, and
// once the counters' lock is released (it reads them); not for a second
// rejection of the version, nor for a pending or accepted move.
func TestOnRejectedAtTheFirstRejection(t *testing.T) {
	const typ = "T"
	var c *Cache
	var got []Rejection
	c = New(Options{OnRejected: func(r Rejection) {
		c.Convergence([]string{typ}, nil) // deadlocks if called under the counters' lock
		got = append(got, r)
	}})
	now := time.Unix(1000, 0)
	pending, rejected := Standing{Version: "1", Answer: Pending}, Standing{Version: "1", Answer: Rejected}
	accepted := Standing{Version: "1", Answer: Accepted}
	for range 3 {
		c.Move(typ, "x", Standing{}, pending, now, now, Mover{})
	}
	c.Move(typ, "x", pending, accepted, time.Time{}, now, Mover{})
	if len(got) != 0 {
		t.Fatalf("told %+v before any rejection", got)
	}
	c.Move(typ, "x", pending, rejected, time.Time{}, now, Mover{Node: "n1", Error: "bad"})
	c.Move(typ, "x", pending, rejected, time.Time{}, now, Mover{Node: "n2", Error: "worse"})
	want := Rejection{Type: typ, Name: "x", Version: "1", Node: "n1", Error: "bad", Clients: 3}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("told %+v, want once: %+v", got, want)
	}

	// A shared state answered whole: its first rejection of y, not of x again.
	got = nil
	x, y := &Resource{Name: "x", Version: "1"}, &Resource{Name: "y", Version: "1"}
	c.MoveAll(typ, nil, Unsent, []*Resource{x, y}, Pending, now, now, Mover{}, nil)
	c.MoveAll(typ, []*Resource{x, y}, Pending, []*Resource{x, y}, Rejected, time.Time{}, now, Mover{Node: "n3", Error: "no"}, nil)
	want = Rejection{Type: typ, Name: "y", Version: "1", Node: "n3", Error: "no", Clients: 1}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("MoveAll told %+v, want %+v", got, want)
	}
}

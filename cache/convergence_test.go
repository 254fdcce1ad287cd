package cache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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
	if rs := c.Convergence([]string{typ, typ}, []string{"x", "x"}); len(rs) != 1 {
		t.Fatalf("x asked for twice, of a type asked for twice: %d reports, want 1", len(rs))
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
// zero, by Move, MoveAll and MoveShared, with the clients that stand with it, and
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

	// The same by MoveShared: the rejecting client, counted with the
	// state until it NACKs it, is counted once.
	got = nil
	z := &Resource{Name: "z", Version: "1"}
	st := &State{Resources: []*Resource{x, z}}
	c.MoveShared(typ, nil, Unsent, st, Pending, now, now, Mover{}, nil)
	c.MoveShared(typ, st, Pending, st, Rejected, time.Time{}, now, Mover{Node: "n4", Error: "nope"}, nil)
	want = Rejection{Type: typ, Name: "z", Version: "1", Node: "n4", Error: "nope", Clients: 1}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("MoveShared told %+v, want %+v", got, want)
	}
}

// MoveShared counts a client of a complete state once per state, and
// Unshare turns it into counts by name: through any sequence of sends,
// ACKs, NACKs, unsharing and leaving, what Convergence reports is what
// MoveAll, one count per resource, reports, time to accept included.
// Only the oldest pending time may differ: a state's is when its own
// pending count rose from zero.
func TestMoveSharedCountsAsMoveAll(t *testing.T) {
	const typ = "T"
	res := func(name, version string) *Resource { return &Resource{Name: name, Version: version} }
	a1, b1, c1, b2, d1, b3 := res("a", "1"), res("b", "1"), res("c", "1"), res("b", "2"), res("d", "1"), res("b", "3")
	t0 := time.Unix(1000, 0)
	states := []*State{
		{Received: t0, Resources: []*Resource{a1, b1, c1}},
		{Received: t0.Add(time.Second), Resources: []*Resource{a1, b2, c1}},
		{Received: t0.Add(2 * time.Second), Resources: []*Resource{a1, b2, d1}},
		{Received: t0.Add(3 * time.Second), Resources: []*Resource{b3}},
	}
	type client struct {
		st      *State
		a       Answer
		byName  bool // in shared: counted by name since Unshare
		since   time.Time
		node    string
		nackMsg string
	}
	for seed := range uint64(50) {
		rnd := rand.New(rand.NewPCG(seed, 1))
		perName, shared := New(Options{}), New(Options{})
		clients := make([]client, 6)
		for i := range clients {
			clients[i].node = fmt.Sprint("n", i)
			clients[i].since = t0.Add(-time.Hour)
		}
		now := t0
		var tookAll, tookShared []time.Duration
		for step := range 60 {
			now = now.Add(time.Duration(rnd.IntN(2000)) * time.Millisecond)
			i := rnd.IntN(len(clients))
			c := &clients[i]
			from, fa := c.st, c.a
			var to *State
			var ta Answer
			received := time.Time{}
			switch op := rnd.IntN(5); {
			case op == 0 || c.st == nil: // sent a state
				to, ta = states[rnd.IntN(len(states))], Pending
				received = to.Received
			case op == 1: // ACK
				to, ta = c.st, Accepted
			case op == 2: // NACK
				to, ta = c.st, Rejected
				c.nackMsg = fmt.Sprint("bad ", step)
			case op == 3: // the record turns per name
				if !c.byName {
					shared.Unshare(typ, c.st, c.a)
					c.byName = true
				}
				continue
			default: // gone
			}
			m := Mover{Node: c.node, Error: c.nackMsg, Since: c.since}
			resources := func(s *State) []*Resource {
				if s == nil {
					return nil
				}
				return s.Resources
			}
			perName.MoveAll(typ, resources(from), fa, resources(to), ta, received, now, m, func(d time.Duration) { tookAll = append(tookAll, d) })
			observe := func(d time.Duration) { tookShared = append(tookShared, d) }
			if c.byName {
				shared.MoveAll(typ, resources(from), fa, resources(to), ta, received, now, m, observe)
			} else {
				shared.MoveShared(typ, from, fa, to, ta, received, now, m, observe)
			}
			c.st, c.a = to, ta
			if to == nil {
				*c = client{node: c.node, since: c.since}
			}
			if ta == Accepted {
				c.since = now
			}
			want, got := reported(perName.Convergence(nil, nil)), reported(shared.Convergence(nil, nil))
			slices.Sort(tookAll) // observed into a histogram: their order is free
			slices.Sort(tookShared)
			if want != got || !slices.Equal(tookAll, tookShared) {
				t.Fatalf("seed %d, step %d: by name\n%s\nby state\n%s\ntimes %v, %v", seed, step, want, got, tookAll, tookShared)
			}
		}
		for i := range clients {
			c := &clients[i]
			if c.st == nil {
				continue
			}
			m := Mover{Node: c.node}
			if c.byName {
				shared.MoveAll(typ, c.st.Resources, c.a, nil, Unsent, time.Time{}, now, m, nil)
			} else {
				shared.MoveShared(typ, c.st, c.a, nil, Unsent, time.Time{}, now, m, nil)
			}
		}
		if rs := shared.Convergence(nil, nil); len(rs) != 0 || len(shared.conv.shared) != 0 {
			t.Fatalf("seed %d: every client gone, the counters hold %+v and %d states", seed, rs, len(shared.conv.shared))
		}
	}
}

// reported is what Convergence says, but for the oldest pending time,
// of which it says only whether there is one.
func reported(rs []ResourceConvergence) string {
	var b strings.Builder
	for _, r := range rs {
		for _, v := range r.Versions {
			rejectedBy := slices.Sorted(slices.Values(v.RejectedBy))
			fmt.Fprintf(&b, "%s@%s: p%d a%d r%d since %v received %v error %q by %v acks %d p50 %v p99 %v max %v\n",
				r.Name, v.Version, v.Pending, v.Accepted, v.Rejected, !v.PendingSince.IsZero(), v.Received.Unix(),
				v.FirstError, rejectedBy, v.Acks, v.P50, v.P99, v.Max)
		}
	}
	return b.String()
}

// A client is one subscriber of a name however it watches it, by name,
// with the wildcard or both, through any order of watching, unwatching
// and leaving: the count is kept as watches come and go, never walked.
func TestSubscribedCountsEachClientOnce(t *testing.T) {
	const typ = "T"
	names := []string{"a", "b", "c"}
	for seed := range uint64(20) {
		rnd := rand.New(rand.NewPCG(seed, 3))
		c := New(Options{})
		var rs []*Resource
		for _, n := range names {
			rs = append(rs, &Resource{Name: n, Version: "1"})
		}
		watches := make([]*Watch, 4)
		wild := make([]bool, len(watches))
		named := make([]map[string]bool, len(watches))
		for i := range watches {
			watches[i], named[i] = NewWatch(), map[string]bool{}
		}
		c.WatchWildcard(watches[0], typ)
		wild[0] = true
		c.Apply(typ, Change{Upserts: rs, Synced: true})
		for step := range 200 {
			i, n := rnd.IntN(len(watches)), names[rnd.IntN(len(names))]
			w := watches[i]
			switch rnd.IntN(5) {
			case 0:
				if err := c.Watch(w, typ, n); err != nil {
					t.Fatal(err)
				}
				named[i][n] = true
			case 1:
				c.Unwatch(w, typ, n)
				delete(named[i], n)
			case 2:
				c.WatchWildcard(w, typ)
				wild[i] = true
			case 3:
				c.UnwatchWildcard(w, typ)
				wild[i] = false
			case 4:
				c.Release(w)
				wild[i], named[i] = false, map[string]bool{}
			}
			want := map[string]int{}
			for _, n := range names {
				for j := range watches {
					if wild[j] || named[j][n] {
						want[n]++
					}
				}
			}
			got := map[string]int{}
			for _, r := range c.Convergence([]string{typ}, names) {
				got[r.Name] = r.Subscribed
			}
			for _, n := range names {
				if got[n] != want[n] {
					t.Fatalf("seed %d, step %d: %s has %d subscribers, want %d", seed, step, n, got[n], want[n])
				}
			}
		}
	}
}

package cache

import (
	"testing"
	"time"
)

// Each client is counted once per type, in the first class that applies
// (rejected, behind, pending, accepted, waiting), however many resources
// it holds; its marks and takes, its registration and its leaving move it.
func TestClientSummaryCountsClients(t *testing.T) {
	const typ = "T"
	c := New(Options{Retention: time.Minute})
	names := []string{"a", "b", "c", "d", "e"}
	a, b := NewWatch(), NewWatch()
	for _, w := range []*Watch{a, b} {
		if err := c.Watch(w, typ, names...); err != nil {
			t.Fatal(err)
		}
	}
	want := func(step string, w ClientCounts) {
		t.Helper()
		w.Type = typ
		var got ClientCounts
		if s := c.ClientSummary(); len(s) == 1 {
			got = s[0]
		} else if len(s) > 1 {
			t.Fatalf("%s: %+v", step, s)
		}
		if got != w {
			t.Errorf("%s: %+v, want %+v", step, got, w)
		}
	}
	want("registered, nothing sent", ClientCounts{Subscribed: 2, Waiting: 2})

	t0 := time.Unix(1000, 0)
	at := func(a Answer) Standing { return Standing{Version: "1", Answer: a} }
	move := func(w *Watch, from, to Standing) {
		for _, n := range names {
			c.Move(typ, n, from, to, t0, t0, Mover{Client: w})
		}
	}
	move(a, Standing{}, at(Pending))
	move(b, Standing{}, at(Pending))
	want("five resources sent to each", ClientCounts{Subscribed: 2, Pending: 2})
	move(a, at(Pending), at(Accepted))
	c.Move(typ, "a", at(Pending), at(Rejected), t0, t0, Mover{Client: b, Node: "b"})
	want("one accepts all, the other rejects one", ClientCounts{Subscribed: 2, Accepted: 1, Rejected: 1})
	if rs := c.Convergence([]string{typ}, []string{"a"}); rs[0].Subscribed != 2 || rs[0].Versions[0].Rejected != 1 || rs[0].Versions[0].Accepted != 1 {
		t.Errorf("resource a, per resource: %+v", rs[0])
	}

	// A change marked on a is owed to it until it takes it.
	a.Mark(typ, 1, "c")
	want("a marked", ClientCounts{Subscribed: 2, Behind: 1, Rejected: 1})
	a.Mark(typ, 2, "d")
	a.Take()
	want("a took it", ClientCounts{Subscribed: 2, Accepted: 1, Rejected: 1})

	// A state shared by every wildcard client counts its client once.
	st := &State{Resources: []*Resource{res("a", "1"), res("b", "1")}}
	w := NewWatch()
	c.WatchWildcard(w, typ)
	c.MoveShared(typ, nil, Unsent, st, Pending, t0, t0, Mover{Client: w}, nil)
	want("a wildcard client sent a state", ClientCounts{Subscribed: 3, Pending: 1, Accepted: 1, Rejected: 1})
	c.MoveShared(typ, st, Pending, st, Accepted, t0, t0, Mover{Client: w}, nil)
	c.Unshare(typ, st, Accepted) // its records become per name: still one client
	want("the wildcard client accepted it", ClientCounts{Subscribed: 3, Accepted: 2, Rejected: 1})

	// Leaving: the registrations go, then what it holds.
	c.Release(b)
	move(b, at(Pending), Standing{})
	c.Move(typ, "a", at(Rejected), Standing{}, t0, t0, Mover{Client: b, Node: "b"})
	want("b left", ClientCounts{Subscribed: 2, Accepted: 2})
	a.Mark(typ, 3, "e")
	c.Release(a)
	move(a, at(Accepted), Standing{})
	want("a left with a change owed", ClientCounts{Subscribed: 1, Accepted: 1})
	if len(a.conv) != 0 || len(b.conv) != 0 {
		t.Errorf("records kept for clients gone: %v, %v", a.conv, b.conv)
	}
}

// A change the rollout holds makes each client it is held from behind,
// once however many of its resources the change holds, until the change
// is released to it and it takes it.
func TestClientSummaryHeldRollout(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	var events []RolloutEvent
	c, ws := rolling(t, 5, clk, &events)
	for _, w := range ws {
		if err := c.Watch(w, eds, "y", "z"); err != nil {
			t.Fatal(err)
		}
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("y", "1"), res("z", "1")}})
	for _, w := range ws {
		w.Take()
	}
	count := func() ClientCounts {
		s := c.ClientSummary()
		if len(s) != 1 {
			t.Fatalf("summary %+v", s)
		}
		return s[0]
	}
	if got := count(); got.Subscribed != 5 || got.Behind != 0 {
		t.Fatalf("before the change: %+v", got)
	}
	c.Apply(eds, Change{Upserts: []*Resource{res("x", "2"), res("y", "2"), res("z", "2")}})
	if got := count(); got.Behind != 5 {
		t.Errorf("a change of three resources marked on 2 canaries, held from 3: %+v, want 5 behind", got)
	}
	for _, w := range ws[:2] {
		w.Take()
	}
	if got := count(); got.Behind != 3 {
		t.Errorf("the canaries took it: %+v, want the 3 it is held from behind", got)
	}
	v := c.ReadFor(ws[0], eds, []string{"x"}, false).Version
	c.Verdict(ws[0], eds, v, false, "n0", "")
	c.Verdict(ws[1], eds, v, false, "n1", "")
	if got := count(); got.Behind != 5 {
		t.Errorf("released, not taken yet: %+v, want 5 behind (the release marks the canaries too)", got)
	}
	for _, w := range ws {
		w.Take()
	}
	if got := count(); got.Behind != 0 || got.Subscribed != 5 {
		t.Errorf("everyone took it: %+v", got)
	}
}

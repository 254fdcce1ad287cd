package loadtest

import (
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
)

func TestSeqRoundTrip(t *testing.T) {
	for typ, kd := range kinds {
		for _, updates := range []int{0, 1, 200, maxUpdates} {
			c := newSeqCoding(kd, updates)
			for _, seq := range []int{0, updates / 2, updates} {
				a, err := anypb.New(c.resource(kd.prefix+"3", 3, seq, 5))
				if err != nil {
					t.Fatal(err)
				}
				if got := c.seqOf(a); got != seq {
					t.Errorf("%s, %d updates: seqOf(resource(seq %d)) = %d", typ, updates, seq, got)
				}
			}
		}
	}
}

// Each kind reads its resources' names from the encoded bytes.
func TestNameOf(t *testing.T) {
	for typ, kd := range kinds {
		c := newSeqCoding(kd, 10)
		a, err := anypb.New(c.resource(kd.prefix+"7", 7, 3, 5))
		if err != nil {
			t.Fatal(err)
		}
		if got := kd.nameOf(a); got != kd.prefix+"7" {
			t.Errorf("%s: nameOf = %q, want %q", typ, got, kd.prefix+"7")
		}
		if other := kinds[map[string]string{"eds": "cds", "cds": "lds", "lds": "rds", "rds": "eds"}[typ]]; other.nameOf(a) != "" {
			t.Errorf("%s: another kind read a name from it", typ)
		}
	}
}

func TestSeqOfForeignResource(t *testing.T) {
	eds, cds := newSeqCoding(kinds["eds"], 10), newSeqCoding(kinds["cds"], 10)
	a, err := anypb.New(cds.resource("c", 0, 4, 0))
	if err != nil {
		t.Fatal(err)
	}
	if got := eds.seqOf(a); got != -1 {
		t.Errorf("eds seqOf(a Cluster) = %d, want -1", got)
	}
	earlier := cds
	earlier.base += 100 // an earlier run's resource
	if a, err = anypb.New(earlier.resource("c", 0, 4, 0)); err != nil {
		t.Fatal(err)
	}
	if got := cds.seqOf(a); got != -1 {
		t.Errorf("seqOf(an earlier run's resource) = %d, want -1", got)
	}
	a.Value = []byte{0xff}
	if got := cds.seqOf(a); got != -1 {
		t.Errorf("seqOf(garbage) = %d, want -1", got)
	}
}

func TestTrackerCoalescedUpdates(t *testing.T) {
	tr := newTracker(2, 3)
	t0 := tr.clients[0].started
	tr.observe(0, 2, t0) // too early: no update is published yet
	if tr.early.Load() != 1 || tr.delivered[1].Load() != 0 {
		t.Errorf("an unpublished update was counted: early %d, delivered %d", tr.early.Load(), tr.delivered[1].Load())
	}
	tr.announce(3)
	tr.observe(0, 3, t0) // updates 1 and 2 coalesced into 3
	tr.observe(1, 1, t0) // the first response already has update 1
	for s, want := range []int64{0, 2, 1, 1} {
		if s > 0 && tr.delivered[s].Load() != want {
			t.Errorf("update %d delivered to %d clients, want %d", s, tr.delivered[s].Load(), want)
		}
	}
	if got := tr.settledFirst.Load(); got != 2 {
		t.Errorf("settledFirst = %d, want 2", got)
	}
	if got := tr.settledLast.Load(); got != 1 {
		t.Errorf("settledLast = %d, want 1", got)
	}
	tr.fail(1, errTest)
	if got := tr.settledLast.Load(); got != 2 {
		t.Errorf("after a failure settledLast = %d, want 2", got)
	}
}

package downstream

import (
	"fmt"
	"testing"
	"time"
	"unsafe"
)

// A stream's status record stays within what the stream holds: names that
// come and go for a client that never answers, and names only the
// wildcard brought that are gone, are not kept.
func TestStatusRecordIsBounded(t *testing.T) {
	s := &streamStatus{}
	const typ = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	now := time.Now()
	for i := range 1000 {
		name := fmt.Sprint("n", i%10)
		s.subscribed(typ, []string{name})
		ts := s.sending(typ, false)
		ts.sent(name, "v", uint64(i+1), now)
		s.done()
		s.unsubscribed(typ, []string{name})
	}
	if p := len(s.types.get(typ).pending); p > 2*10+16+1 {
		t.Fatalf("%d names pending for a client that never answers, churning 10 names", p)
	}

	s.setWildcard(typ, true)
	ts := s.sending(typ, false)
	for i := range 100 {
		ts.sent(fmt.Sprint("w", i), "v", 2000, now)
	}
	for i := range 100 {
		ts.absent(fmt.Sprint("w", i), now)
	}
	s.done()
	s.answered(typ, "2000", "", false, "", now)
	if n := s.types.get(typ).res.len(); n != 0 {
		t.Fatalf("%d records left of names only the wildcard brought, all gone", n)
	}
}

// A NACK is recorded for the names it covers, with its message and time,
// and an ACK that follows clears it; a name's record stays small.
func TestStatusRecordsNacks(t *testing.T) {
	if size := unsafe.Sizeof(resStatus{}); size > 48 {
		t.Errorf("a name's status record is %d bytes, want at most 48", size)
	}
	s := &streamStatus{}
	const typ = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	now := time.Unix(1000, 0)
	s.subscribed(typ, []string{"a", "b"})
	ts := s.sending(typ, false)
	ts.sent("a", "1", 1, now)
	ts.sent("b", "1", 1, now)
	s.done()
	s.answered(typ, "1", "0", true, "bad cluster", now.Add(time.Second))
	for _, r := range s.snapshot().Types[0].Resources {
		if r.State != Nacked || r.Error != "bad cluster" || !r.ErrorAt.Equal(now.Add(time.Second)) || !r.Sent.Equal(now) {
			t.Errorf("after the NACK: %+v", r)
		}
	}
	ts = s.sending(typ, false)
	ts.sent("a", "2", 2, now)
	s.done()
	s.answered(typ, "2", "2", false, "", now)
	for _, r := range s.snapshot().Types[0].Resources {
		if want := map[string]ResourceState{"a": Acked, "b": Nacked}[r.Name]; r.State != want || (r.State == Acked) != (r.Error == "") {
			t.Errorf("after the ACK of a: %+v", r)
		}
	}
}

// Answers are applied to the names they cover as they come: a name takes
// the first answer that covers its response, and an answer never covers a
// response sent after it.
func TestStatusAppliesAnswersInOrder(t *testing.T) {
	s := &streamStatus{}
	const typ = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	now := time.Unix(1000, 0)
	s.subscribed(typ, []string{"a", "b", "c", "d", "e"})
	ts := s.sending(typ, false)
	for i, n := range []string{"a", "b", "c", "d"} {
		ts.sent(n, "1", uint64(i+1), now)
	}
	s.done()
	s.answered(typ, "1", "1", false, "", now)
	s.answered(typ, "2", "0", true, "bad b", now)
	s.answered(typ, "3", "1", false, "", now)
	s.answered(typ, "9", "0", true, "bad d", now) // a nonce never sent: covers d, and nothing sent later
	ts = s.sending(typ, false)
	ts.sent("e", "1", 5, now)
	s.done()
	want := map[string]ResourceState{"a": Acked, "b": Nacked, "c": Acked, "d": Nacked, "e": Requested}
	wantErr := map[string]string{"b": "bad b", "d": "bad d"}
	for _, r := range s.snapshot().Types[0].Resources {
		if r.State != want[r.Name] || r.Error != wantErr[r.Name] {
			t.Errorf("%s: %v %q, want %v %q", r.Name, r.State, r.Error, want[r.Name], wantErr[r.Name])
		}
	}
	s.answered(typ, "5", "1", false, "", now)
	for _, r := range s.snapshot().Types[0].Resources {
		if r.Name == "e" && r.State != Acked {
			t.Errorf("e after its ACK, read without a send: %v", r.State)
		}
	}
}

// An inline map reads the same whether an entry is the inline one or in
// the map, as entries are set, removed and set again.
func TestInlineMap(t *testing.T) {
	var m inlineMap[resStatus]
	want := map[string]string{}
	check := func(step string) {
		t.Helper()
		if m.len() != len(want) {
			t.Fatalf("%s: %d records, want %d", step, m.len(), len(want))
		}
		seen := 0
		for n, r := range m.all() {
			seen++
			if want[n] != r.version {
				t.Fatalf("%s: %s at %q, want %q", step, n, r.version, want[n])
			}
		}
		for n, v := range want {
			if r, ok := m.get(n); !ok || r.version != v {
				t.Fatalf("%s: get %s = %q %v, want %q", step, n, r.version, ok, v)
			}
		}
		if seen != len(want) {
			t.Fatalf("%s: all yielded %d, want %d", step, seen, len(want))
		}
	}
	set := func(n, v string) { m.set(n, resStatus{version: v}); want[n] = v }
	set("a", "1")
	check("one")
	set("b", "1")
	set("c", "1")
	check("three")
	set("a", "2") // the inline one
	set("c", "2") // one in the map
	check("updated")
	m.remove("a")
	delete(want, "a")
	check("inline removed")
	set("c", "3") // in the map while the inline slot is free: stays one record
	set("d", "1") // takes the inline slot
	check("refilled")
	m.removeFunc(func(_ string, r resStatus) bool { return r.version == "1" })
	delete(want, "b")
	delete(want, "d")
	check("removed by func")
	if _, ok := m.get("zz"); ok {
		t.Fatal("get found a name never set")
	}
}

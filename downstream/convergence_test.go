package downstream

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// The group's counters follow each stream's status as it is written: a
// send is pending, an ACK accepted, a NACK rejected with its error and
// node, a new version moves the client, and a stream that leaves takes its
// counts with it.
func TestConvergenceFollowsStatus(t *testing.T) {
	const typ = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	c := cache.New(cache.Options{})
	stream := func(id string) *streamStatus {
		return &streamStatus{node: &corepb.Node{Id: id}, cache: c, opened: 1}
	}
	a, b := stream("a"), stream("b")
	now := time.Unix(1000, 0)
	for _, s := range []*streamStatus{a, b} {
		s.subscribed(typ, []string{"x"})
		ts := s.sendingFrom(typ, false, now.UnixNano())
		ts.sent("x", "1", 1, now)
		s.done()
	}
	at := func() cache.VersionCount {
		t.Helper()
		rs := c.Convergence([]string{typ}, []string{"x"})
		if len(rs) != 1 {
			t.Fatalf("%d resources", len(rs))
		}
		for _, v := range rs[0].Versions {
			if v.Version == "1" {
				return v
			}
		}
		return cache.VersionCount{}
	}
	if v := at(); v.Pending != 2 || v.Accepted != 0 {
		t.Fatalf("after the sends: %+v", v)
	}
	a.answered(typ, "1", "1", false, "", now.Add(time.Second))
	b.answered(typ, "1", "0", true, "bad x", now.Add(time.Second))
	v := at()
	if v.Pending != 0 || v.Accepted != 1 || v.Rejected != 1 || v.FirstError != "bad x" || len(v.RejectedBy) != 1 || v.RejectedBy[0] != "b" {
		t.Fatalf("after an ACK and a NACK: %+v", v)
	}
	if v.Acks != 1 || v.Max != time.Second {
		t.Errorf("time to accept: %d acks, max %v; want 1, 1s", v.Acks, v.Max)
	}
	ts := a.sendingFrom(typ, false, now.Add(time.Minute).UnixNano())
	ts.sent("x", "2", 2, now.Add(time.Minute))
	a.done()
	if v := at(); v.Accepted != 0 || v.Rejected != 1 {
		t.Fatalf("a sent version 2: version 1 is %+v", v)
	}
	b.left()
	a.left()
	if rs := c.Convergence(nil, nil); len(rs) != 0 {
		t.Fatalf("every stream left, the counters still hold %+v", rs)
	}
}

// What counting adds to a stream stays small: the stream's record holds
// three words more (its opening, where to observe, and its watch, whose
// standing as one client the moves change), a type's the time of its last
// ACK, and the answers that were kept for later are applied as they come,
// so a type's record is smaller than before (it was 304 bytes). The watch
// holds 72 bytes more for counting the client once (cache/clients.go).
func TestConvergenceCostsAStreamLittle(t *testing.T) {
	if size := unsafe.Sizeof(streamStatus{}); size > 128 {
		t.Errorf("a stream's status record is %d bytes, want at most 128 (104 before counting, and 24 more)", size)
	}
	if size := unsafe.Sizeof(typeStatus{}); size > 304 {
		t.Errorf("a type's status record is %d bytes, want at most the 304 it was before counting", size)
	}
}

// Wildcard SotW streams counted once per shared state say, per resource
// and version, what each stream's record (CSDS) says, through sends of
// either state, ACKs, NACKs, a response by name that turns the record per
// name, and leaving.
func TestConvergenceOfSharedStatesIsCSDS(t *testing.T) {
	const typ = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	res := func(name, version string) *cache.Resource { return &cache.Resource{Name: name, Version: version} }
	a1, b1, b2, c1 := res("a", "1"), res("b", "1"), res("b", "2"), res("c", "1")
	now := time.Unix(1000, 0)
	states := []*cache.State{{Received: now, Resources: []*cache.Resource{a1, b1}}, {Received: now, Resources: []*cache.Resource{a1, b2, c1}}}
	c := cache.New(cache.Options{})
	streams := make([]*streamStatus, 5)
	nonces := make([]uint64, len(streams))
	for i := range streams {
		streams[i] = &streamStatus{node: &corepb.Node{Id: fmt.Sprint("n", i)}, cache: c, opened: 1}
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for step := range 400 {
		now = now.Add(time.Second)
		i := rnd.IntN(len(streams))
		s := streams[i]
		switch op := rnd.IntN(6); op {
		case 0, 1:
			nonces[i]++
			s.sentShared(typ, states[rnd.IntN(len(states))], nonces[i], now)
		case 2, 3:
			s.answered(typ, fmt.Sprint(nonces[i]), "v", op == 3, "bad", now)
		case 4:
			nonces[i]++
			rec := s.sendingFrom(typ, false, now.UnixNano())
			rec.sent("b", "3", nonces[i], now)
			s.done()
		case 5:
			s.left()
		}
		csds := map[string][3]int{} // name@version: ACKED, NACKED, sent and unanswered
		for _, s := range streams {
			for _, ts := range s.snapshot().Types {
				for _, r := range ts.Resources {
					k, n := r.Name+"@"+r.Version, csds[r.Name+"@"+r.Version]
					switch {
					case r.Version == "":
						continue
					case r.State == Acked:
						n[0]++
					case r.State == Nacked:
						n[1]++
					case r.State == Requested:
						n[2]++
					}
					csds[k] = n
				}
			}
		}
		counted := map[string][3]int{}
		for _, rc := range c.Convergence(nil, nil) {
			for _, v := range rc.Versions {
				if v.Accepted+v.Rejected+v.Pending > 0 {
					counted[rc.Name+"@"+v.Version] = [3]int{v.Accepted, v.Rejected, v.Pending}
				}
			}
		}
		if !maps.Equal(csds, counted) {
			t.Fatalf("step %d: CSDS %v, counters %v", step, csds, counted)
		}
	}
	for _, s := range streams {
		s.left()
	}
	if rs := c.Convergence(nil, nil); len(rs) != 0 {
		t.Fatalf("every stream left, the counters still hold %+v", rs)
	}
}

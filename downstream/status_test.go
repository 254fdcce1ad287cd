package downstream

import (
	"fmt"
	"testing"
	"time"
)

// A stream's status record stays within what the stream holds: names that
// come and go for a client that never answers, and names only the
// wildcard brought that are gone, are not kept.
func TestStatusRecordIsBounded(t *testing.T) {
	s := &streamStatus{types: map[string]*typeStatus{}}
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
	if p := len(s.types[typ].pending); p > 2*10+16+1 {
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
	if n := len(s.types[typ].res); n != 0 {
		t.Fatalf("%d records left of names only the wildcard brought, all gone", n)
	}
}

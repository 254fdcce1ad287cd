package downstream

import (
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// A forwarded NACK comes from a client: it marks as rejected only what the
// client holds, of the NACK's type, at the version it names; a name it
// does not hold, a version since replaced or another type's name moves
// nothing, and no more than maxForwardedPerNACK details are read.
func TestForwardedNACKMarksOnlyWhatTheClientHolds(t *testing.T) {
	const cds, lds = resourcev3.ClusterType, resourcev3.ListenerType
	s := &streamStatus{}
	b := &streamBase{status: s, cache: cache.New(cache.Options{Retention: time.Hour})}
	now := time.Unix(1000, 0)
	s.subscribed(cds, []string{"a", "b", "c", "d"})
	rec := s.sending(cds, false)
	for n, v := range map[string]string{"a": "1", "b": "2", "c": "1", "d": "1"} {
		rec.sent(n, v, 1, now)
	}
	s.done()
	s.answered(cds, "1", "v", false, "", now)

	detail := func(typeURL, name, version string) *anypb.Any {
		d, err := xds.Rejected{Type: typeURL, Name: name, Version: version, Rejected: 1, Clients: 2, Error: "bad"}.Detail()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	b.forwarded(cds, &rpcstatus.Status{Details: []*anypb.Any{
		detail(cds, "a", "1"),  // held at 1: rejected
		detail(cds, "b", "1"),  // held at 2
		detail(lds, "c", "1"),  // another type
		detail(cds, "zz", "1"), // not held
	}})
	junk := make([]*anypb.Any, maxForwardedPerNACK, maxForwardedPerNACK+1)
	for i := range junk {
		junk[i] = &anypb.Any{TypeUrl: "type.googleapis.com/google.rpc.ErrorInfo", Value: []byte{0xff}}
	}
	b.forwarded(cds, &rpcstatus.Status{Details: append(junk, detail(cds, "d", "1"))}) // d's detail is past the bound

	got := map[string]ResourceState{}
	for _, ts := range s.snapshot().Types {
		for _, r := range ts.Resources {
			got[r.Name] = r.State
		}
	}
	want := map[string]ResourceState{"a": Nacked, "b": Acked, "c": Acked, "d": Acked}
	for n, st := range want {
		if got[n] != st {
			t.Errorf("%s is %v after the forwarded NACKs, want %v (all: %v)", n, got[n], st, got)
		}
	}
	if msg := errorOf(s, "a"); msg != "1 of 2 clients behind rejected it: bad" {
		t.Errorf("a's error is %q", msg)
	}

	// Counts that make no sense are not repeated.
	for _, c := range [][2]int{{-1, 2}, {3, 2}, {0, 0}, {1 << 62, 1}} {
		s.subscribed(cds, []string{"e"})
		rec := s.sending(cds, false)
		rec.sent("e", "1", 2, now)
		s.done()
		s.answered(cds, "2", "v", false, "", now)
		d, err := xds.Rejected{Type: cds, Name: "e", Version: "1", Rejected: c[0], Clients: c[1], Error: "bad"}.Detail()
		if err != nil {
			t.Fatal(err)
		}
		b.forwarded(cds, &rpcstatus.Status{Details: []*anypb.Any{d}})
		if msg := errorOf(s, "e"); msg != "clients behind rejected it: bad" {
			t.Errorf("with %d of %d clients, e's error is %q", c[0], c[1], msg)
		}
		s.unsubscribed(cds, []string{"e"})
	}
	if _, ok := got["zz"]; ok {
		t.Errorf("a name the client does not hold is recorded: %v", got)
	}
}

// errorOf is the error the status record s holds for name.
func errorOf(s *streamStatus, name string) string {
	for _, ts := range s.snapshot().Types {
		for _, r := range ts.Resources {
			if r.Name == name {
				return r.Error
			}
		}
	}
	return ""
}

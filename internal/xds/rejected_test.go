package xds

import (
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// A forwarded NACK's details read back as written; other details, and
// ErrorInfo of another domain, are not forwarded NACKs; at most max are
// read, and the error is clipped.
func TestForwardedRoundTrip(t *testing.T) {
	want := Rejected{Type: "T", Name: "n", Version: "v", Rejected: 2, Clients: 5, Error: "bad", AnyVersion: "abc"}
	mine, err := want.Detail()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := anypb.New(&errdetails.ErrorInfo{Domain: "elsewhere", Reason: RejectedReason, Metadata: map[string]string{"name": "x", "version": "1"}})
	info, _ := anypb.New(&errdetails.DebugInfo{Detail: "x"})
	long := want
	long.Name, long.Error = "m", strings.Repeat("e", 3*MaxText)
	longDetail, _ := long.Detail()
	st := &status.Status{Details: []*anypb.Any{other, info, mine, longDetail, mine}}
	got := Forwarded(st, 2)
	if len(got) != 2 || got[0] != want || got[1].Name != "m" || len(got[1].Error) > MaxText+32 {
		t.Fatalf("read %+v, want %+v and m clipped", got, want)
	}
	if got := Forwarded(&status.Status{Message: "a client's own NACK"}, 10); got != nil {
		t.Errorf("a NACK without details: %+v", got)
	}
}

// A count that does not parse, or is negative, reads as 0.
func TestForwardedCounts(t *testing.T) {
	for _, c := range []string{"-3", "x", "99999999999999999999999", ""} {
		d, _ := anypb.New(&errdetails.ErrorInfo{Domain: RejectedDomain, Reason: RejectedReason,
			Metadata: map[string]string{"name": "n", "version": "1", "rejected": c, "clients": c}})
		if got := Forwarded(&status.Status{Details: []*anypb.Any{d}}, 1); len(got) != 1 || got[0].Rejected != 0 || got[0].Clients != 0 {
			t.Errorf("counts %q read %+v, want 0", c, got)
		}
	}
}

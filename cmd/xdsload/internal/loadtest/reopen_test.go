package loadtest

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A client whose stream the server closes after it answered (a fleet's
// balance sheds it) opens another, as Envoy does, and it is counted; a
// stream that ends with no answer, or otherwise than UNAVAILABLE, is the
// client's end.
func TestClientsReopenAStreamClosedAfterAnswers(t *testing.T) {
	closed := status.Error(codes.Unavailable, "error reading from server: EOF")
	for _, tc := range []struct {
		name      string
		ends      []error // each stream's end, in turn
		answered  []bool  // whether each stream was answered
		want      error
		reconnect int64
	}{
		{name: "closed after an answer", ends: []error{closed, nil}, answered: []bool{true, true}, reconnect: 1},
		{name: "closed before any answer", ends: []error{closed}, answered: []bool{false}, want: closed},
		{name: "another end", ends: []error{status.Error(codes.InvalidArgument, "no")}, answered: []bool{true}, want: status.Error(codes.InvalidArgument, "no")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTracker(1, 0)
			n := 0
			err := reopenAnswered(context.Background(), 0, tr, func() error {
				if tc.answered[n] {
					tr.clients[0].responses++
				}
				n++
				return tc.ends[n-1]
			})
			if status.Code(err) != status.Code(tc.want) || (err == nil) != (tc.want == nil) || n != len(tc.ends) {
				t.Fatalf("after %d streams: %v, want %v after %d", n, err, tc.want, len(tc.ends))
			}
			if got := tr.reconnects.Load(); got != tc.reconnect {
				t.Fatalf("%d reconnects counted, want %d", got, tc.reconnect)
			}
		})
	}
}

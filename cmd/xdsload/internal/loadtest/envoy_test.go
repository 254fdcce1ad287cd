package loadtest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// Envoy-behaving clients stall on a changed cluster against the LinearCache
// (its endpoints never come again), and warm it at once through the relay.
func TestRunEnvoy(t *testing.T) {
	for _, tc := range []struct {
		name        string
		relay       bool
		delta       bool
		wantStalled bool
	}{
		{name: "linear-sotw", wantStalled: true},
		{name: "relay-sotw", relay: true},
		{name: "relay-delta", relay: true, delta: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := RunEnvoy(context.Background(), EnvoyConfig{ServeCP: "127.0.0.1:0", Relay: tc.relay, Clients: 20, StreamsPerConn: 5,
				Delta: tc.delta, Clusters: 3, Endpoints: 2, Updates: 2, UpdateEvery: 10 * time.Millisecond,
				InitialFetchTimeout: time.Second, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Updates) != 2 {
				t.Fatalf("%d updates", len(res.Updates))
			}
			// Every client stalls, or none.
			wantStalled, wantWithin := 0, 20
			if tc.wantStalled {
				wantStalled, wantWithin = 20, 0
			}
			for _, u := range res.Updates {
				if u.Stalled != wantStalled || u.Within1s != wantWithin {
					t.Errorf("update of %s: stalled %d, within 1s %d; want %d and %d", u.Cluster, u.Stalled, u.Within1s, wantStalled, wantWithin)
				}
			}
			var out bytes.Buffer
			if err := res.WriteTable(&out); err != nil || !strings.Contains(out.String(), "within 1s") {
				t.Errorf("table: %v\n%s", err, out.String())
			}
		})
	}
}

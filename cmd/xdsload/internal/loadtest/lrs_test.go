package loadtest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// smallLRS is a quick load-report run against the tool's own control plane.
func smallLRS(mod func(*Config)) Config {
	cfg := Config{ServeCP: "127.0.0.1:0", Clients: 20, LRS: true, LRSInterval: 100 * time.Millisecond,
		LRSFor: 300 * time.Millisecond, Timeout: 30 * time.Second}
	mod(&cfg)
	return cfg
}

// Through the relay, the control plane has one load report stream for all
// the clients and is told of exactly what they reported; directly, it has a
// stream per client. Split, the server's CPU and memory are measured.
func TestRunLRS(t *testing.T) {
	for _, tc := range []struct {
		name    string
		relay   bool
		split   bool
		streams int64
	}{
		{"relay", true, false, 1},
		{"direct", false, false, 20},
		{"relay split", true, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := RunLRS(context.Background(), smallLRS(func(c *Config) { c.Relay, c.Split = tc.relay, tc.split }))
			if err != nil {
				t.Fatal(err)
			}
			if res.Told != 20 || res.Failed != 0 || res.CPStreams != tc.streams || res.ClientReports < 20 || res.CPReports < 1 {
				t.Errorf("told %d, failed %d, control plane streams %d (want %d), client reports %d, control plane reports %d",
					res.Told, res.Failed, res.CPStreams, tc.streams, res.ClientReports, res.CPReports)
			}
			if res.Sent == 0 || res.Sent != res.Received {
				t.Errorf("the clients told of %d requests, the control plane was told of %d", res.Sent, res.Received)
			}
			// (The CPU of so short a window may be under a clock tick.)
			if tc.split && (res.Memory == nil || res.MemoryStart == nil || res.RSSStart == 0 || res.RSSReporting == 0) {
				t.Errorf("split: memory %+v from %+v, RSS %d to %d", res.Memory, res.MemoryStart, res.RSSStart, res.RSSReporting)
			}
			var out bytes.Buffer
			if err := res.WriteTable(&out); err != nil || !strings.Contains(out.String(), tc.name[:5]) {
				t.Errorf("table (%v):\n%s", err, out.String())
			}
		})
	}
}

func TestValidateLRS(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.ServeCP, c.Target = "", "127.0.0.1:1" },
		func(c *Config) { c.Churn = time.Second },
		func(c *Config) { c.LRSFor = -time.Second },
	} {
		cfg := smallLRS(mod).Defaults()
		if err := cfg.Validate(); err == nil {
			t.Errorf("%+v was taken", cfg)
		}
	}
}

// A run fails if a client failed, or if the control plane was told of
// other requests than the clients reported.
func TestLRSVerdict(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  LRSResult
		want string
	}{
		{"all told", LRSResult{Sent: 100, Received: 100}, ""},
		{"a client failed", LRSResult{Sent: 100, Received: 100, Failed: 1, FirstError: "boom"}, "1 of 20 clients failed; boom"},
		{"lost", LRSResult{Sent: 100, Received: 90}, "told of 90 requests, the clients of 100"},
		{"counted twice", LRSResult{Sent: 100, Received: 110}, "told of 110 requests, the clients of 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.res.Config.Clients = 20
			err := tc.res.verdict()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("%v, want %q", err, tc.want)
			}
		})
	}
}

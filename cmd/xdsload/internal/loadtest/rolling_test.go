package loadtest

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// buildRelay builds cmd/xdsrelay into a temporary directory.
func buildRelay(t *testing.T) string {
	t.Helper()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "xdsrelay")
	build := exec.Command("go", "build", "-o", bin, "./cmd/xdsrelay")
	build.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/xdsrelay: %v\n%s", err, out)
	}
	return bin
}

// Two relays, the built binary, behind one address, each restarted in
// turn with SIGTERM under a few hundred clients while the control plane
// changes every second: each ends its streams after a GOAWAY and a drain,
// its clients are answered by the other relay, it serves its saved cache
// at once when it comes back (its control plane silent), and every client
// ends at the control plane's last version of every name, told of no
// removal.
func TestRollingRestart(t *testing.T) {
	const clients = 300
	var progress strings.Builder
	cfg := smallLoad(func(c *Config) {
		c.Clients, c.StreamsPerConn, c.Resources, c.Endpoints = clients, 10, 6, 10
		c.UpdateEvery, c.Timeout, c.CPCache, c.Progress = time.Second, 3*time.Minute, CacheLinear, &progress
		c.Rolling.RelayBin = buildRelay(t)
	})
	rl, err := RunRolling(t.Context(), cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if !rl.Passed || len(rl.Restarts) != 2 || rl.Dir != "" {
		t.Fatalf("rolling restart %+v", rl)
	}
	for _, rr := range rl.Restarts {
		if rr.Exit != 0 || rr.Streams == 0 || rr.Ended != rr.Streams || rr.GoAway != rr.Ended || rr.Back != rr.Ended || rr.Other != clients || rr.LeftOn != 0 {
			t.Errorf("relay %s: %+v: want every one of its streams ended after a GOAWAY and back on the other relay", rr.Relay, rr)
		}
		// The drain: GOAWAY at SIGTERM, the streams ended a second later.
		if rr.Drain.Min < 500*time.Millisecond || rr.Gap.N != rr.Ended || rr.Answer.N != rr.Ended {
			t.Errorf("relay %s: drain %+v, reconnects %+v, answers %+v", rr.Relay, rr.Drain, rr.Gap, rr.Answer)
		}
		if !rr.SavedOK || rr.SavedServed <= 0 || rr.SavedServed > savedCacheBound {
			t.Errorf("relay %s: saved cache served after %s, not older %v", rr.Relay, rr.SavedServed, rr.SavedOK)
		}
	}
	// The second relay held every client when it was restarted: the
	// first, restarted warm, took all of them.
	if rl.Restarts[1].Streams != clients {
		t.Errorf("relay b held %d streams at SIGTERM, want %d", rl.Restarts[1].Streams, clients)
	}
	if !rl.Ended || !rl.Ending.ok() || rl.Ending.Names != clients*3 {
		t.Errorf("ending %+v", rl.Ending)
	}
	var table strings.Builder
	if err := rl.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"GOAWAY first", "stream end to next response", "received prior goaway", "rolling restart passed"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

// A restart whose streams ended without a GOAWAY, whose clients did not
// all come back, or after which the other relay did not hold them all,
// fails.
func TestRollingRestartFailures(t *testing.T) {
	ok := RollingRestart{Relay: "a", Streams: 4, Ended: 4, GoAway: 4, Back: 4, Other: 10, SavedServed: time.Millisecond, SavedOK: true}
	tests := []struct {
		name string
		mod  func(*RollingRestart)
		want string
	}{
		{"all well", func(*RollingRestart) {}, ""},
		{"no GOAWAY", func(r *RollingRestart) { r.GoAway, r.FirstError = 3, "EOF" }, "1 of 4 streams ended without a GOAWAY first (EOF)"},
		{"not back", func(r *RollingRestart) { r.Back = 2 }, "2 of 4 clients were not answered again"},
		{"not on the other", func(r *RollingRestart) { r.Other, r.LeftOn = 8, 1 }, "the other relay held 8 of 10"},
		{"an older cache", func(r *RollingRestart) { r.SavedOK = false }, "older than it held at SIGTERM"},
		{"exit 1", func(r *RollingRestart) { r.Exit = 1 }, "exited 1"},
		{"nothing to restart", func(r *RollingRestart) { r.Streams, r.Ended, r.GoAway, r.Back = 0, 0, 0, 0 }, "held no stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rr := ok
			tt.mod(&rr)
			rl := &Rolling{Config: Config{Clients: 10}, Restarts: []RollingRestart{rr}, Ending: Ending{Names: 20}, Ended: true}
			rl.judge(nil)
			got := strings.Join(rl.Failures, "; ")
			if rl.Passed != (tt.want == "") || !strings.Contains(got, tt.want) {
				t.Errorf("passed %v, failures %q; want %q", rl.Passed, got, tt.want)
			}
		})
	}
}

func TestRollingValidate(t *testing.T) {
	base := func(mod func(*Config)) Config {
		cfg := smallLoad(func(c *Config) { c.Rolling.RelayBin = "xdsrelay" })
		mod(&cfg)
		return cfg.Defaults()
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no binary", func(c *Config) { c.Rolling.RelayBin = "" }, "relay-bin"},
		{"a target", func(c *Config) { c.Target = "127.0.0.1:1" }, "target"},
		{"in-process relay", func(c *Config) { c.Relay = true }, "relay"},
		{"a soak", func(c *Config) { c.Soak.Duration = time.Minute }, "soak"},
		{"no changes", func(c *Config) { c.UpdateEvery = 0 }, "update-every"},
		{"past the relays' stream limit", func(c *Config) { c.StreamsPerConn = 101 }, "max_streams_per_connection"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base(tt.mod)
			if err := cfg.ValidateRolling(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v, want an error naming %s", err, tt.want)
			}
		})
	}
	if cfg := base(func(*Config) {}); cfg.ValidateRolling() != nil {
		t.Errorf("a valid rolling restart: %v", cfg.ValidateRolling())
	}
}

// A relay that exits before it is ready fails the wait for its /readyz at
// once, with its exit, rather than after the wait's bound; and the ports
// given to the relays are all different.
func TestRelayExitedBeforeReady(t *testing.T) {
	ports, err := freePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(ports)))) != 4 {
		t.Fatalf("ports %v: not all different", ports)
	}
	bin, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false(1) to stand for a relay that exits")
	}
	p, err := newRelayProc("x", bin, t.TempDir(), "127.0.0.1:1", ports[0], ports[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = p.waitReady(context.Background(), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("waitReady: %v", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("waitReady took %v for a relay that had exited", took)
	}
}

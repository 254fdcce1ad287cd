package loadtest

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/relay"
)

func TestRelayConfigLimits(t *testing.T) {
	def := relay.Default().Limits
	tests := []struct {
		name   string
		limits bool
		check  func(relay.Config) bool
	}{
		{"off by default", false, func(c relay.Config) bool {
			return c.Limits.StreamRate == 0 && c.Limits.MaxStreams == 0 && c.Limits.MaxGroups == 0 && c.Limits.MaxStreamsPerConnection == 0
		}},
		{"relay-limits keeps the defaults", true, func(c relay.Config) bool { return c.Limits == def }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{RelayLimits: tt.limits}
			rc, err := relayConfig("127.0.0.1:1", &cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(rc) {
				t.Errorf("limits %+v", rc.Limits)
			}
		})
	}
}

// --relay-consistency-off reaches the relay as consistency.max_wait 0,
// and the relay keeps its default without it; --lrs-interval shorter than
// 1s lowers the floor with it, as the relay's default lrs.min_interval does.
func TestRelayConfigOptions(t *testing.T) {
	def := relay.Default()
	tests := []struct {
		name  string
		cfg   Config
		check func(relay.Config) bool
	}{
		{"consistency on by default", Config{}, func(c relay.Config) bool {
			return c.Consistency.MaxWait == def.Consistency.MaxWait && c.Consistency.MaxWait > 0
		}},
		{"relay-consistency-off", Config{RelayConsistencyOff: true}, func(c relay.Config) bool { return c.Consistency.MaxWait == 0 }},
		{"lrs-interval under min_interval", Config{LRS: true, LRSInterval: 100 * time.Millisecond}, func(c relay.Config) bool {
			return c.LRS.Interval == 100*time.Millisecond && c.LRSMinInterval() == 100*time.Millisecond
		}},
		{"lrs-interval over min_interval", Config{LRS: true, LRSInterval: time.Minute}, func(c relay.Config) bool {
			return c.LRS.Interval == time.Minute && c.LRSMinInterval() == def.LRSMinInterval()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, err := relayConfig("127.0.0.1:1", &tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(rc) {
				t.Errorf("consistency %+v, lrs %+v", rc.Consistency, rc.LRS)
			}
			if err := rc.Validate(); err != nil {
				t.Errorf("the relay refuses it: %v", err)
			}
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	tests := []struct {
		retry    int
		min, max time.Duration
	}{
		{0, 400 * time.Millisecond, 600 * time.Millisecond},
		{1, 800 * time.Millisecond, 1200 * time.Millisecond},
		{3, 3200 * time.Millisecond, 4800 * time.Millisecond},
		{20, 24 * time.Second, 36 * time.Second}, // capped at 30s, then jittered
	}
	for _, tt := range tests {
		for range 20 {
			if d := backoffDelay(envoyBackoff, tt.retry); d < tt.min || d > tt.max {
				t.Errorf("retry %d: %s, want between %s and %s", tt.retry, d, tt.min, tt.max)
			}
		}
	}
}

func TestRefused(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{status.Error(codes.ResourceExhausted, "limits.stream_rate"), true},
		{status.Error(codes.Unavailable, "going away"), true},
		{status.Error(codes.InvalidArgument, "bad"), false},
		{errTest, false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := refused(tt.err); got != tt.want {
			t.Errorf("refused(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// With the relay's limits, clients that the stream rate turns away retry
// with backoff until every one is configured, and the result says so.
func TestRelayLimitsRetry(t *testing.T) {
	var progress strings.Builder
	res, err := Run(t.Context(), smallLoad(func(c *Config) {
		c.Relay, c.RelayLimits, c.Clients, c.Updates, c.Progress = true, true, 50, 1, &progress
		// Low enough that most of the 50 are refused at first.
		c.relayTune = func(rc *relay.Config) { rc.Limits.StreamRate, rc.Limits.StreamBurst = 20, 10 }
	}))
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	checkDelivered(t, res)
	if res.RetriedClients < 25 || res.RetriedClients > res.Retries || res.AllConfigured <= envoyBackoff.BaseDelay/2 {
		t.Errorf("retries %d by %d clients, all configured after %s; want half the clients or more retried, after the first backoff",
			res.Retries, res.RetriedClients, res.AllConfigured)
	}
	var table strings.Builder
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "streams refused and retried") {
		t.Errorf("table lacks the retries:\n%s", table.String())
	}
}

// A first run fills the relay's persist dir; a second one whose relay
// cannot reach any control plane serves every client from the saved cache.
func TestRelayPersistWarmRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	var progress strings.Builder
	first, err := Run(t.Context(), smallLoad(func(c *Config) {
		c.Relay, c.RelayPersist, c.Clients, c.Progress = true, dir, 50, &progress
	}))
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	checkDelivered(t, first)
	if files, _ := filepath.Glob(filepath.Join(dir, "group-*.cache")); len(files) != 1 {
		t.Fatalf("saved caches %v, want one group's", files)
	}
	second, err := Run(t.Context(), smallLoad(func(c *Config) {
		c.Relay, c.RelayPersist, c.Clients, c.Updates, c.Progress = true, dir, 50, 0, &progress
		c.relayTune = func(rc *relay.Config) { rc.Upstream.Address = closedAddr(t) }
	}))
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if second.Configured != 50 || second.FirstConfigForeign != 50 || second.AllConfigured <= 0 {
		t.Errorf("configured %d, %d of them from the saved cache, all after %s; want all 50 from the cache",
			second.Configured, second.FirstConfigForeign, second.AllConfigured)
	}
}

// closedAddr is a loopback address that refuses connections.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// --split hands the relay's options to its child: the child's relay, with
// the limits on, saves its cache in the directory.
func TestRelayPersistSplit(t *testing.T) {
	dir := t.TempDir()
	var progress strings.Builder
	res, err := Run(t.Context(), smallLoad(func(c *Config) {
		c.Split, c.Relay, c.RelayLimits, c.RelayPersist, c.Clients, c.Progress = true, true, true, dir, 20, &progress
	}))
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	checkDelivered(t, res)
	if files, _ := filepath.Glob(filepath.Join(dir, "group-*.cache")); len(files) != 1 {
		entries, _ := os.ReadDir(dir)
		t.Errorf("the child saved %v, want one group's cache", entries)
	}
}

// What the control plane sees, counted by the control plane: every client
// directly (a stream and a connection each), one stream through a relay
// that groups them by cluster, and one stream per client on one
// connection through a relay that groups them by id (--relay-group-by
// id), as istiod and Consul need.
func TestControlPlaneSeesGroups(t *testing.T) {
	const clients = 5
	for _, tc := range []struct {
		name           string
		mod            func(*Config)
		streams, conns int64
	}{
		{"directly", func(c *Config) {}, clients, clients},
		{"relay by cluster", func(c *Config) { c.Relay = true }, 1, 1},
		{"relay by id", func(c *Config) { c.Relay, c.RelayGroupBy = true, []string{"id"} }, clients, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Run(t.Context(), smallLoad(func(c *Config) { c.Clients, c.CPCache = clients, CacheLinear; tc.mod(c) }))
			if err != nil {
				t.Fatal(err)
			}
			checkDelivered(t, res)
			cp := res.ControlPlane
			if cp == nil || cp.Streams != tc.streams || cp.Connections != tc.conns || cp.Responses < int64(res.Config.Updates) {
				t.Fatalf("the control plane saw %+v, want %d streams on %d connections and a response per update at least", cp, tc.streams, tc.conns)
			}
			var out strings.Builder
			if err := res.WriteTable(&out); err != nil || !strings.Contains(out.String(), "control plane: ") {
				t.Errorf("the table does not say what the control plane saw: %v\n%s", err, out.String())
			}
		})
	}
	if err := (&Config{RelayGroupBy: []string{"id"}}).validateRelay(); err == nil {
		t.Error("relay-group-by without relay was accepted")
	}
}

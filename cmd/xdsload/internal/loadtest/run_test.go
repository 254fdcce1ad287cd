package loadtest

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

var errTest = errors.New("test")

// smallLoad is a quick run against the tool's own control plane.
func smallLoad(mod func(*Config)) Config {
	cfg := Config{
		ServeCP: "127.0.0.1:0", Clients: 5, Rate: 0, ADS: true,
		Resources: 10, Endpoints: 20, Updates: 3, UpdateEvery: 20 * time.Millisecond,
		Timeout: 30 * time.Second,
	}
	mod(&cfg)
	return cfg
}

// checkDelivered checks that every client got its first config and every
// update, and that latencies were recorded.
func checkDelivered(t *testing.T, res *Result) {
	t.Helper()
	n := res.Config.Clients
	if res.Connected != n || res.Configured != n || res.Failed != 0 {
		t.Errorf("connected %d, configured %d, failed %d; want %d, %d, 0", res.Connected, res.Configured, res.Failed, n, n)
	}
	if res.FirstConfig.N != n || res.FirstConfig.Max <= 0 {
		t.Errorf("time to first config: %+v, want %d positive samples", res.FirstConfig, n)
	}
	if len(res.Updates) != res.Config.Updates {
		t.Fatalf("%d updates reported, want %d", len(res.Updates), res.Config.Updates)
	}
	for _, u := range res.Updates {
		if u.Received != n || u.Last <= 0 || u.P50 > u.P99 || u.P99 > u.Last {
			t.Errorf("update %+v: want every one of %d clients and ordered, positive latencies", u, n)
		}
	}
	if res.FanOutLast.N != res.Config.Updates || res.FanOutAll.N != n*res.Config.Updates {
		t.Errorf("fan-out: last %+v, all %+v", res.FanOutLast, res.FanOutAll)
	}
	if res.BytesReceived <= 0 {
		t.Errorf("bytes received %d", res.BytesReceived)
	}
}

func TestRunAgainstOwnControlPlane(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"delta ADS eds snapshot", func(c *Config) { c.Variant = VariantDelta }},
		{"sotw ADS eds snapshot", func(c *Config) { c.Variant = VariantSotW }},
		{"delta per-type eds linear", func(c *Config) { c.Variant, c.ADS, c.CPCache = VariantDelta, false, CacheLinear }},
		{"sotw per-type eds linear", func(c *Config) { c.Variant, c.ADS, c.CPCache = VariantSotW, false, CacheLinear }},
		{"delta ADS names", func(c *Config) { c.Names = []string{"cla-2", "cla-7"} }},
		{"sotw per-type names", func(c *Config) { c.Variant, c.ADS, c.Names = VariantSotW, false, []string{"cla-4"} }},
		{"delta cds", func(c *Config) { c.Type = "cds" }},
		{"sotw lds linear", func(c *Config) { c.Variant, c.Type, c.CPCache = VariantSotW, "lds", CacheLinear }},
		{"delta per-type rds", func(c *Config) { c.Type, c.ADS = "rds", false }},
		{"sotw per-type cds", func(c *Config) { c.Variant, c.Type, c.ADS = VariantSotW, "cds", false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Run(t.Context(), smallLoad(tt.mod))
			if err != nil {
				t.Fatal(err)
			}
			checkDelivered(t, res)
		})
	}
}

func TestRunReportsProgressAndRSS(t *testing.T) {
	var progress strings.Builder
	res, err := Run(t.Context(), smallLoad(func(c *Config) {
		c.PID = os.Getpid()
		c.Progress, c.ProgressEvery = &progress, time.Millisecond
	}))
	if err != nil {
		t.Fatal(err)
	}
	checkDelivered(t, res)
	if res.RSS.Start <= 0 || res.RSS.Configured <= 0 || res.RSS.End <= 0 {
		t.Errorf("RSS %+v, want three samples", res.RSS)
	}
	var table strings.Builder
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"time to first config", "fan-out, last client", "server RSS"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if !strings.Contains(progress.String(), "configured") {
		t.Errorf("no progress line: %q", progress.String())
	}
}

func TestRunFloor(t *testing.T) {
	for _, variant := range []string{VariantDelta, VariantSotW} {
		t.Run(variant, func(t *testing.T) {
			res, err := Run(t.Context(), smallLoad(func(c *Config) {
				c.ServeCP, c.Floor, c.Clients, c.Variant = "", true, 4, variant
			}))
			if err != nil {
				t.Fatal(err)
			}
			checkDelivered(t, res)
		})
	}
}

func TestFloorFramesAreResponseSized(t *testing.T) {
	cfg := smallLoad(func(c *Config) { c.Variant = VariantDelta }).Defaults()
	initial, update, err := responseSizes(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if update <= 0 || initial < cfg.Resources*update/2 {
		t.Errorf("delta frames: initial %d, update %d bytes for %d resources", initial, update, cfg.Resources)
	}
	cfg.Variant = VariantSotW
	initial, update, err = responseSizes(&cfg)
	if err != nil || initial != update {
		t.Errorf("sotw frames: initial %d, update %d, %v; want equal", initial, update, err)
	}
}

// SotW sends the whole state each time: the floor's update frame is as
// large as its initial one, the size of every cluster in one response.
func TestFloorFramesCarryTheWholeSotWState(t *testing.T) {
	cfg := smallLoad(func(c *Config) { c.Variant, c.Type, c.Resources = VariantSotW, "cds", 500 }).Defaults()
	initial, update, err := responseSizes(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	one, err := anypb.New(kinds["cds"].build("cluster-0", 0, kinds["cds"].markMin, 0))
	if err != nil {
		t.Fatal(err)
	}
	if update != initial || update < cfg.Resources*proto.Size(one) {
		t.Errorf("sotw cds frames: initial %d, update %d bytes; want equal and at least %d × %d", initial, update, cfg.Resources, proto.Size(one))
	}
}

func TestRunClientsFailAgainstNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	res, err := Run(t.Context(), Config{Target: addr, Clients: 3, ADS: true, Timeout: 30 * time.Second})
	if err == nil || res == nil {
		t.Fatalf("Run against a closed port: %v, %v; want an error and results", res, err)
	}
	if res.Failed != 3 || res.FirstError == "" {
		t.Errorf("failed %d (%q), want 3 with an error", res.Failed, res.FirstError)
	}
}

func TestRunStopsAtTimeout(t *testing.T) {
	// The updates would take a minute; the timeout ends the run first.
	res, err := Run(t.Context(), smallLoad(func(c *Config) {
		c.UpdateEvery, c.Timeout = time.Minute, 200*time.Millisecond
	}))
	if !errors.Is(err, context.DeadlineExceeded) || res == nil {
		t.Fatalf("Run = %v, %v; want results and a deadline error", res, err)
	}
	if res.Configured != res.Config.Clients || len(res.Updates) != 0 {
		t.Errorf("configured %d, %d updates; want every client and none", res.Configured, len(res.Updates))
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"nothing to load", func(c *Config) { c.ServeCP = "" }, "target"},
		{"variant", func(c *Config) { c.Variant = "rest" }, "variant"},
		{"type", func(c *Config) { c.Type = "sds" }, "type"},
		{"cache", func(c *Config) { c.CPCache = "mux" }, "cp-cache"},
		{"negative rate", func(c *Config) { c.Rate = -1 }, "rate"},
		{"too many updates", func(c *Config) { c.Updates = maxUpdates + 1 }, "updates"},
		{"unserved name", func(c *Config) { c.Names = []string{"cla-10"} }, "cla-10"},
		{"wrong kind of name", func(c *Config) { c.Type, c.Names = "cds", []string{"cla-1"} }, "cla-1"},
		{"no streams per connection", func(c *Config) { c.StreamsPerConn = -1 }, "streams-per-conn"},
		{"floor sharing connections", func(c *Config) { c.ServeCP, c.Floor, c.StreamsPerConn = "", true, 2 }, "streams-per-conn"},
		{"negative churn", func(c *Config) { c.Churn = -time.Second }, "churn"},
		{"floor churning", func(c *Config) { c.ServeCP, c.Floor, c.Churn = "", true, time.Second }, "churn"},
		{"grpc floor and a control plane", func(c *Config) { c.GRPCFloor = true }, "grpc-floor"},
		{"both floors", func(c *Config) { c.ServeCP, c.Floor, c.GRPCFloor = "", true, true }, "grpc-floor"},
		{"grpc floor behind a relay", func(c *Config) { c.ServeCP, c.Relay, c.GRPCFloor = "", true, true }, "grpc-floor"},
		{"grpc floor, unserved name", func(c *Config) { c.ServeCP, c.GRPCFloor, c.Names = "", true, []string{"cla-10"} }, "cla-10"},
		{"negative settle", func(c *Config) { c.Churn, c.ChurnSettle = time.Second, -time.Second }, "churn-settle"},
		{"churn past the timeout", func(c *Config) { c.Churn, c.Timeout = time.Minute, time.Minute }, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := smallLoad(tt.mod).Defaults()
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error about %q", err, tt.want)
			}
		})
	}
	ok := smallLoad(func(*Config) {}).Defaults()
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(small load) = %v", err)
	}
}

// Clients grouped on connections still each get their config and every
// update; the result counts the connections.
func TestRunStreamsPerConn(t *testing.T) {
	for _, relay := range []bool{false, true} {
		t.Run(map[bool]string{false: "control plane", true: "relay"}[relay], func(t *testing.T) {
			res, err := Run(t.Context(), smallLoad(func(c *Config) {
				c.Clients, c.StreamsPerConn, c.Relay, c.CPCache = 7, 3, relay, CacheLinear
			}))
			if err != nil {
				t.Fatal(err)
			}
			checkDelivered(t, res)
			if res.Connections != 3 {
				t.Errorf("%d connections for 7 clients at 3 a connection, want 3", res.Connections)
			}
		})
	}
}

// checkChurn checks that a churn run completed cycles, failed none, and
// sampled the server four times.
func checkChurn(t *testing.T, res *Result) {
	t.Helper()
	ch := res.Churn
	if ch == nil {
		t.Fatal("no churn results")
	}
	if ch.Cycles < res.Config.Clients || ch.Failed != 0 || ch.Cycle.N != ch.Cycles || ch.Cycle.Max <= 0 || ch.PerSec <= 0 {
		t.Errorf("churn %+v: want a cycle per client at least and none failed", ch)
	}
	for _, s := range ch.samples() {
		if s.RSS <= 0 {
			t.Errorf("%s: RSS %d, want a sample", s.name, s.RSS)
		}
	}
	if len(res.Updates) != 0 || res.Config.Updates != 0 {
		t.Errorf("a churn run published %d updates", len(res.Updates))
	}
}

func TestRunChurn(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"connection per cycle, delta", func(c *Config) {}},
		{"stream per cycle, sotw relay", func(c *Config) {
			c.Variant, c.Relay, c.StreamsPerConn, c.CPCache = VariantSotW, true, 3, CacheLinear
		}},
		{"connection per cycle, grpc floor", func(c *Config) { c.ServeCP, c.GRPCFloor = "", true }},
		{"stream per cycle, grpc floor", func(c *Config) { c.ServeCP, c.GRPCFloor, c.StreamsPerConn = "", true, 3 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Run(t.Context(), smallLoad(func(c *Config) {
				c.Clients, c.Churn, c.ChurnSettle, c.PID = 3, 200*time.Millisecond, 10*time.Millisecond, os.Getpid()
				tt.mod(c)
			}))
			if err != nil {
				t.Fatal(err)
			}
			checkChurn(t, res)
			want := res.Churn.Cycles // a connection each
			if res.Config.StreamsPerConn > 1 {
				want = 1 // held by the clients throughout
			}
			if res.Connections != want {
				t.Errorf("%d connections for %d cycles at %d streams a connection, want %d", res.Connections, res.Churn.Cycles, res.Config.StreamsPerConn, want)
			}
			var table strings.Builder
			if err := res.WriteTable(&table); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"streams/s", "after GC", "settled"} {
				if !strings.Contains(table.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, table.String())
				}
			}
		})
	}
}

// The gRPC floor delivers the first config and every update to every
// client, on each variant, service and type, and with streams sharing
// connections.
func TestRunGRPCFloor(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"delta ADS eds names", func(c *Config) { c.Names = []string{"cla-0"} }},
		{"sotw ADS eds wildcard", func(c *Config) { c.Variant = VariantSotW }},
		{"delta per-type cds", func(c *Config) { c.Type, c.ADS = "cds", false }},
		{"sotw per-type lds names", func(c *Config) {
			c.Variant, c.Type, c.ADS, c.Names = VariantSotW, "lds", false, []string{"listener-3", "listener-1"}
		}},
		{"delta rds sharing connections", func(c *Config) { c.Type, c.StreamsPerConn = "rds", 4 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Run(t.Context(), smallLoad(func(c *Config) {
				c.ServeCP, c.GRPCFloor, c.Clients, c.Updates = "", true, 20, 2
				tt.mod(c)
			}))
			if err != nil {
				t.Fatal(err)
			}
			checkDelivered(t, res)
			if want := (20 + res.Config.StreamsPerConn - 1) / res.Config.StreamsPerConn; res.Connections != want {
				t.Errorf("%d connections, want %d", res.Connections, want)
			}
			if res.SeqBase == 0 || res.Early != 0 || !strings.Contains(res.describe(), "gRPC floor") {
				t.Errorf("seq base %d, %d early, description %q", res.SeqBase, res.Early, res.describe())
			}
		})
	}
}

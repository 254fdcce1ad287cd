package loadtest

import (
	"strings"
	"testing"
	"time"
)

func TestRunThroughRelay(t *testing.T) {
	for _, variant := range []string{VariantDelta, VariantSotW} {
		t.Run(variant, func(t *testing.T) {
			res, err := Run(t.Context(), smallLoad(func(c *Config) {
				c.Relay, c.Variant, c.Names = true, variant, []string{"cla-0"}
			}))
			if err != nil {
				t.Fatal(err)
			}
			checkDelivered(t, res)
			if res.Config.Target == "" || !strings.Contains(res.describe(), "xdsrelay") {
				t.Errorf("target %q, description %q", res.Config.Target, res.describe())
			}
		})
	}
}

func TestCompare(t *testing.T) {
	cmp, err := Compare(t.Context(), smallLoad(func(c *Config) {
		c.ServeCP, c.Names, c.CPCache = "", []string{"cla-0"}, CacheLinear
	}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range cmp.Setups {
		names = append(names, s.Name)
		checkDelivered(t, s.Result)
		if s.Error != "" || s.Result.RSS.Configured <= 0 {
			t.Errorf("%s: error %q, RSS %+v", s.Name, s.Error, s.Result.RSS)
		}
	}
	if got := strings.Join(names, ","); got != "relay,linear,snapshot,grpcfloor,floor" {
		t.Errorf("setups %s", got)
	}
	if len(cmp.Ratios) != 4 || cmp.Ratios[2].Versus != SetupGRPCFloor {
		t.Fatalf("ratios %+v, want 4, the third versus the gRPC floor", cmp.Ratios)
	}
	for _, q := range cmp.Ratios {
		if q.FanOutLastP50 <= 0 || q.FirstConfigP50 <= 0 || q.ConfiguredPerSec <= 0 {
			t.Errorf("ratios versus %s: %+v, want positive", q.Versus, q)
		}
	}
	relay, linear := cmp.Setups[0].Result.Config, cmp.Setups[1].Result.Config
	if !relay.Relay || relay.CPCache != CacheLinear || linear.Relay || linear.CPCache != CacheLinear ||
		cmp.Setups[2].Result.Config.CPCache != CacheSnapshot || !cmp.Setups[3].Result.Config.GRPCFloor || !cmp.Setups[4].Result.Config.Floor {
		t.Errorf("setup configs: %+v", cmp.Setups)
	}
	var table strings.Builder
	if err := cmp.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"relay ÷", "snapshot", "floor", "fan-out last"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	checkRows(t, table.String(), SetupGRPCFloor, 2)
}

// checkRows checks that table has n rows for setup: its results, and the
// relay's figures divided by its.
func checkRows(t *testing.T, table, setup string, n int) {
	t.Helper()
	rows := 0
	for _, l := range strings.Split(table, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == setup {
			rows++
		}
	}
	if rows != n {
		t.Errorf("table has %d rows for %s, want %d:\n%s", rows, setup, n, table)
	}
}

// A churn comparison runs the relay, both caches and the gRPC floor, and
// skips the socket floor.
func TestCompareChurn(t *testing.T) {
	cmp, err := Compare(t.Context(), smallLoad(func(c *Config) {
		c.ServeCP, c.Clients, c.Churn, c.ChurnSettle = "", 2, 150*time.Millisecond, 10*time.Millisecond
	}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range cmp.Setups {
		names = append(names, s.Name)
		checkChurn(t, s.Result)
	}
	if got := strings.Join(names, ","); got != "relay,linear,snapshot,grpcfloor" {
		t.Errorf("setups %s", got)
	}
	if len(cmp.Skipped) != 1 || cmp.Skipped[0].Name != SetupFloor {
		t.Errorf("skipped %+v, want the floor", cmp.Skipped)
	}
	if len(cmp.Ratios) != 3 || cmp.Ratios[0].ChurnPerSec <= 0 || cmp.Ratios[2].ChurnPerSec <= 0 {
		t.Errorf("ratios %+v, want three with churn rates", cmp.Ratios)
	}
	var table strings.Builder
	if err := cmp.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"streams/s", "after GC", "floor: skipped"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	checkRows(t, table.String(), SetupGRPCFloor, 2)
}

// Streams sharing connections skip the socket floor, which has one per
// client, and keep the gRPC floor, which multiplexes them.
func TestCompareSkipsFloorWithSharedConnections(t *testing.T) {
	setups, skipped := setupConfigs(smallLoad(func(c *Config) { c.StreamsPerConn = 10 }))
	if len(setups) != 4 || setups[3].name != SetupGRPCFloor || len(skipped) != 1 || !strings.Contains(skipped[0].Reason, "streams-per-conn") {
		t.Errorf("setups %+v, skipped %+v; want 4 with the gRPC floor, and the floor skipped", setups, skipped)
	}
}

func TestValidateCompare(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.Target = "127.0.0.1:1" },
		func(c *Config) { c.Floor = true },
		func(c *Config) { c.GRPCFloor = true },
		func(c *Config) { c.Relay = true },
		func(c *Config) { c.Names = []string{"nope"} },
	} {
		cfg := smallLoad(mod).Defaults()
		if err := cfg.ValidateCompare(); err == nil {
			t.Errorf("ValidateCompare(%+v) = nil, want an error", cfg)
		}
	}
	ok := smallLoad(func(*Config) {}).Defaults()
	if err := ok.ValidateCompare(); err != nil {
		t.Errorf("ValidateCompare(small load) = %v", err)
	}
}

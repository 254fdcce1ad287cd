package fleet

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestConfigValidateNamesTheKey(t *testing.T) {
	on := func(f func(*Config)) Config {
		c := Default()
		c.Peers, c.Self = []string{"xdsrelay-peers.ns.svc:18001"}, "10.0.0.1:18001"
		if f != nil {
			f(&c)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{name: "off", cfg: Default()},
		{name: "on", cfg: on(nil)},
		{name: "static list", cfg: on(func(c *Config) { c.Peers = []string{"10.0.0.1:18001", "10.0.0.2:18001"} })},
		{name: "peer not host:port", cfg: on(func(c *Config) { c.Peers = []string{"relay"} }), want: "fleet.peers"},
		{name: "peer port a name", cfg: on(func(c *Config) { c.Peers = []string{"relay:xds"} }), want: "fleet.peers"},
		{name: "no self", cfg: on(func(c *Config) { c.Self = "" }), want: "fleet.self"},
		{name: "self without peers", cfg: func() Config { c := Default(); c.Self = "10.0.0.1:1"; return c }(), want: "fleet.self"},
		{name: "self a wildcard", cfg: on(func(c *Config) { c.Self = "0.0.0.0:18001" }), want: "fleet.self"},
		{name: "refresh 0", cfg: on(func(c *Config) { c.Refresh = 0 }), want: "fleet.refresh"},
		{name: "slack negative", cfg: on(func(c *Config) { c.BalanceSlack = -0.1 }), want: "fleet.balance_slack"},
		{name: "slack NaN", cfg: on(func(c *Config) { c.BalanceSlack = math.NaN() }), want: "fleet.balance_slack"},
		{name: "shed 0", cfg: on(func(c *Config) { c.ShedPerSecond = 0 }), want: "fleet.shed_per_second"},
		{name: "shed infinite", cfg: on(func(c *Config) { c.ShedPerSecond = math.Inf(1) }), want: "fleet.shed_per_second"},
		{name: "empty identity", cfg: on(func(c *Config) { c.PeerIdentities = []string{" "} }), want: "fleet.peer_identities"},
		{name: "refresh long", cfg: on(func(c *Config) { c.Refresh = time.Hour })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want+":")):
				t.Fatalf("want an error naming %s, got %v", tc.want, err)
			}
		})
	}
}

package fleet

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
)

// Config is fleet.*: the replicas that know each other. Peers empty turns
// the fleet off.
type Config struct {
	// Peers is fleet.peers: host:port entries, the replicas' xDS
	// addresses (this replica's included). An entry whose host is a name
	// is resolved every Refresh, and each address it resolves to is a
	// member: a headless Service gives every pod's.
	Peers []string
	// Self is fleet.self: this replica's own address as the others dial
	// it (in Kubernetes, $(POD_IP) and the xDS port).
	Self string
	// Refresh is fleet.refresh: how often the peers are resolved again.
	Refresh time.Duration
	// Balance is fleet.balance: shed clients while over the bound.
	Balance bool
	// BalanceSlack is fleet.balance_slack: a member holding more than
	// (1 + BalanceSlack) times the fleet's mean sheds clients.
	BalanceSlack float64
	// ShedPerSecond is fleet.shed_per_second: the most connections a
	// member sheds a second.
	ShedPerSecond float64
	// PeerIdentities is fleet.peer_identities: with client certificates,
	// the identities (of a verified certificate) that may use the peer
	// mark and the exchange; the mark from anyone else is ignored.
	PeerIdentities []string
}

// Default is fleet.*'s defaults: no peers (the fleet off).
func Default() Config {
	return Config{Refresh: 5 * time.Second, Balance: true, BalanceSlack: 0.2, ShedPerSecond: 5}
}

// On reports whether the fleet is configured.
func (c *Config) On() bool { return len(c.Peers) > 0 }

// Validate checks fleet.*; an error names the key.
func (c *Config) Validate() error {
	for _, p := range c.Peers {
		if err := checkAddr(p); err != nil {
			return fmt.Errorf("fleet.peers: %w", err)
		}
	}
	switch {
	case c.On() && c.Self == "":
		return errors.New("fleet.self: required with fleet.peers: this replica's address as the others dial it ($(POD_IP):port in Kubernetes)")
	case c.Self != "" && !c.On():
		return errors.New("fleet.self: set without fleet.peers")
	case c.Refresh <= 0:
		return fmt.Errorf("fleet.refresh: must be positive, got %s", c.Refresh)
	case c.BalanceSlack < 0 || math.IsNaN(c.BalanceSlack) || math.IsInf(c.BalanceSlack, 0):
		return fmt.Errorf("fleet.balance_slack: %v is not a fraction of 0 or more", c.BalanceSlack)
	case c.ShedPerSecond <= 0 || math.IsNaN(c.ShedPerSecond) || math.IsInf(c.ShedPerSecond, 0):
		return fmt.Errorf("fleet.shed_per_second: must be positive, got %v", c.ShedPerSecond)
	}
	if c.Self != "" {
		if err := checkAddr(c.Self); err != nil {
			return fmt.Errorf("fleet.self: %w", err)
		}
		if host, _, _ := net.SplitHostPort(c.Self); host == "0.0.0.0" || host == "::" {
			return fmt.Errorf("fleet.self: %q names no host: give the address the others dial (the pod IP)", c.Self)
		}
	}
	for _, id := range c.PeerIdentities {
		if strings.TrimSpace(id) == "" {
			return errors.New("fleet.peer_identities: an empty identity")
		}
	}
	return nil
}

// checkAddr checks a host:port entry: a host, and a port that is a number.
func checkAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q has no valid port: want a number from 1 to 65535", addr)
	}
	if host == "" || strings.ContainsAny(host, " /") {
		return fmt.Errorf("%q has no valid host", addr)
	}
	return nil
}

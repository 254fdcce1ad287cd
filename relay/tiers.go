package relay

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Tiers: a relay whose upstream is another relay is one client of it, and
// its ACK says only that it has a change, not that its clients do. With
// admin.advertise_address, a relay puts its admin endpoint in the node it
// presents upstream (TierMetadataKey); the relay above keeps, per group,
// the lower relays among its clients and lists them in /debug/convergence
// (tiers), so that xdsrelay wait --tiers follows the tree down and counts
// the clients at its leaves (docs/architecture.md, invariant 19 "Count as
// it happens": a set kept as streams join and leave, never found by
// walking them).

// TierMetadataKey is the node metadata field in which a relay advertises
// its admin endpoint (admin.advertise_address) to the relay above.
const TierMetadataKey = "xdsrelay.admin"

// maxTiers bounds the lower relays a group keeps; the others are counted,
// not named.
const maxTiers = 1000

// maxAdvertised bounds an advertised address, as a client sends it.
const maxAdvertised = 256

// tierLink is a lower relay among a group's clients: its admin endpoint and
// how many of its streams are open.
type tierLink struct {
	admin   string
	streams int
}

// checkAdvertised checks an admin address to advertise: host:port that
// another host can dial, not a wildcard, the port a number. A client's node
// is checked with it under Relay.mu, so the length is checked before
// anything reads the address, and a port that is not a number is refused
// before checkHostPort could look it up as a service name.
func checkAdvertised(addr string) error {
	if len(addr) > maxAdvertised {
		return fmt.Errorf("is longer than %d bytes", maxAdvertised)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q has no valid port: want a number from 1 to 65535", addr)
	}
	if err := checkHostPort(addr); err != nil {
		return err
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return errors.New("names no host: advertise one the relay above can reach (the pod IP)")
	}
	return nil
}

// advertise puts the relay's admin address in a node it presents upstream.
func advertise(cfg *Config, n *corepb.Node) {
	if a := cfg.Admin.AdvertiseAddress; a != "" {
		setMetadata(n, TierMetadataKey, structpb.NewStringValue(a))
	}
}

// advertised is the admin address a client's node advertises: "" if none,
// or if it is not a usable address.
func advertised(n *corepb.Node) string {
	a := n.GetMetadata().GetFields()[TierMetadataKey].GetStringValue()
	if a == "" || checkAdvertised(a) != nil {
		return ""
	}
	return a
}

// joinTierLocked records a client's stream if its node advertises an admin
// address; the returned func forgets it (once, under Relay.mu). Call with
// Relay.mu held.
func (g *group) joinTierLocked(n *corepb.Node) func() {
	admin := advertised(n)
	if admin == "" {
		return func() {}
	}
	id := xds.Clip(n.GetId())
	l := g.tiers[id]
	if l == nil {
		if len(g.tiers) >= maxTiers {
			g.tiersOver++
			return func() { g.tiersOver-- }
		}
		if g.tiers == nil {
			g.tiers = make(map[string]*tierLink)
		}
		l = &tierLink{admin: admin}
		g.tiers[id] = l
	}
	l.admin = admin // the latest stream's word
	l.streams++
	return func() {
		if l.streams--; l.streams == 0 && g.tiers[id] == l {
			delete(g.tiers, id)
		}
	}
}

// ConvergenceTier is a lower relay among a group's clients: the node it
// presents and the admin endpoint it advertises.
type ConvergenceTier struct {
	Group string `json:"group"`
	Node  string `json:"node"`
	Admin string `json:"admin"`
}

// tiersOf lists the groups' lower relays, sorted by group and node, and
// how many past maxTiers are not named. It costs what the answer costs.
func (r *Relay) tiersOf(groups []*group) ([]ConvergenceTier, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []ConvergenceTier
	over := 0
	for _, g := range groups {
		for id, l := range g.tiers {
			out = append(out, ConvergenceTier{Group: g.id, Node: id, Admin: l.admin})
		}
		over += g.tiersOver
	}
	slices.SortFunc(out, func(a, b ConvergenceTier) int {
		if c := strings.Compare(a.Group, b.Group); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	return out, over
}

package relay

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/fleet"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// DebugFleet is /debug/fleet: this member's view of its fleet and where
// each group comes from.
type DebugFleet struct {
	// Enabled is false without fleet.peers; the rest is then empty.
	Enabled bool   `json:"enabled"`
	Self    string `json:"self,omitempty"`
	// Config is what of its configuration the members must share
	// (upstream.group_by, the control planes); a peer whose own differs
	// says so in config_differs.
	Config string `json:"config,omitempty"`
	// Members are the live members this one sees (itself included),
	// since when, and how long ago that was.
	Members        []string   `json:"members"`
	ViewSince      *time.Time `json:"view_since,omitempty"`
	ViewAgeSeconds float64    `json:"view_age_seconds"`
	// Peers are the other members resolved: each one's last answer, its
	// client count and its own view, and whether that view is this one's.
	Peers []fleet.PeerStatus `json:"peers"`
	// Clients are the client connections this member holds as balance
	// counts them, and Excess how many of them are past the bound.
	Clients int `json:"clients"`
	Excess  int `json:"excess"`
	// GroupsOwned counts the groups this member owns in its view.
	GroupsOwned int          `json:"groups_owned"`
	Groups      []FleetGroup `json:"groups"`
}

// FleetGroup is where a group comes from, as /debug/fleet,
// /debug/convergence (fleet_paths) and xdsrelay status --summary show it.
type FleetGroup struct {
	// Group is the group's id (GroupID), Key its whole key, clipped
	// (xds.Clip), as /debug/groups shows them.
	Group string `json:"group"`
	Key   string `json:"key"`
	// Owner is the member that owns the group in this one's view.
	Owner string `json:"owner"`
	// Source is control_plane, peer or fallback (xdsrelay_fleet_groups);
	// Peer the member drawn from, for peer.
	Source string `json:"source"`
	Peer   string `json:"peer,omitempty"`
	// AskedByPeers counts the peers' streams in the group: while there is
	// one, this member fetches the group from the control plane (the hop
	// rule).
	AskedByPeers int `json:"asked_by_peers,omitempty"`
}

// debugFleet serves /debug/fleet.
func (r *Relay) debugFleet(w http.ResponseWriter, _ *http.Request) {
	out := DebugFleet{Members: []string{}, Peers: []fleet.PeerStatus{}, Groups: []FleetGroup{}}
	if r.fleet == nil {
		writeJSON(w, out)
		return
	}
	v := r.fleet.members.View()
	since := v.Since
	out.Enabled, out.Self, out.Config, out.Members, out.ViewSince = true, v.Self, v.Config, v.Members, &since
	out.ViewAgeSeconds = time.Since(since).Seconds()
	if v.Peers != nil {
		out.Peers = v.Peers
	}
	out.Clients = r.fleetClients()
	out.Excess = r.fleet.members.Excess(out.Clients)
	out.Groups = r.fleetGroups(r.snapshotGroups())
	for _, g := range out.Groups {
		if g.Owner == v.Self {
			out.GroupsOwned++
		}
	}
	writeJSON(w, out)
}

// fleetGroups is where each of groups comes from; nil without a fleet.
func (r *Relay) fleetGroups(groups []*group) []FleetGroup {
	if r.fleet == nil {
		return nil
	}
	ring, _ := r.fleet.members.Ring()
	out := make([]FleetGroup, 0, len(groups))
	for _, g := range groups {
		fg := FleetGroup{Group: g.id, Key: xds.Clip(g.key), Owner: ring.Owner(g.key), Source: sourceOf(g)}
		if fg.Source == sourcePeer {
			p, _, _ := g.sw.Serving()
			fg.Peer = p.Name
		}
		r.mu.Lock()
		fg.AskedByPeers = g.peers
		r.mu.Unlock()
		out = append(out, fg)
	}
	slices.SortFunc(out, func(a, b FleetGroup) int { return strings.Compare(a.Group, b.Group) })
	return out
}

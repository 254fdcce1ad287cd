package relay

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// GET /debug/convergence: where each group's clients stand with each
// resource's versions, read from the counters the streams keep as they
// send and are answered (cache/convergence.go), never from the streams
// (docs/architecture.md, invariant 19 "Count as it happens").

// convergenceLimit is how many resources /debug/convergence lists unless
// ?limit= says otherwise; the summary covers them all.
const convergenceLimit = 1000

// DebugConvergence is the body of /debug/convergence.
type DebugConvergence struct {
	Summary   []ConvergenceSummary  `json:"summary"`
	Resources []ConvergenceResource `json:"resources"`
	// More is how many resources matched past the limit.
	More int `json:"more,omitempty"`
	// Tiers are the lower relays among the groups' clients, each counted
	// above as one client (tiers.go); TiersMore, how many streams of
	// others past the bound are not named.
	Tiers     []ConvergenceTier `json:"tiers,omitempty"`
	TiersMore int               `json:"tiers_more,omitempty"`
	// FleetPaths, with a fleet, says where each group comes from: the
	// control plane, or a peer, which counts as one client here
	// (fleet.go; xdsrelay status --summary shows it).
	FleetPaths []FleetGroup `json:"fleet_paths,omitempty"`
}

// ConvergenceSummary is where one group's clients stand with a type: each
// client counted once, however many of the type's resources it holds
// (cache.ClientCounts), in the first of rejected, behind, pending,
// accepted and waiting that applies.
type ConvergenceSummary struct {
	Group     string `json:"group"`
	Type      string `json:"type"`
	Resources int    `json:"resources"` // the type's resources reported (see Resources)
	// Subscribed is the clients counted: the sum of the five below.
	Subscribed int `json:"subscribed"`
	Accepted   int `json:"accepted"` // acknowledged every resource they were sent, owed nothing
	Rejected   int `json:"rejected"` // rejected a resource they hold
	Pending    int `json:"pending"`  // sent something not answered yet
	Behind     int `json:"behind"`   // owed a change not sent yet: a held rollout, a slow client
	Waiting    int `json:"waiting"`  // hold nothing of the type yet, owed nothing
	// PeerStreams are the fleet peers' streams of the type, left out of
	// the counts above: each is a member relaying the group to clients of
	// its own, counted there.
	PeerStreams int `json:"peer_streams,omitempty"`
}

// ConvergenceResource is one resource of one group.
type ConvergenceResource struct {
	Group   string `json:"group"`
	Type    string `json:"type"`
	Name    string `json:"name"`
	Version string `json:"version"` // the cache's current version; "" if it holds none
	// UpstreamVersion is the version of the upstream response the current
	// version came in: a SotW response's version_info, a delta response's
	// system_version_info (a delta control plane's own version of the
	// resource is Version itself, when it sets one).
	UpstreamVersion string `json:"upstream_version,omitempty"`
	// BytesVersion, asked for with ?bytes_version=1, is the version a
	// relay below that speaks SotW to this one holds the current version
	// at: a hash of its bytes (cache.Resource.BytesVersion).
	BytesVersion string `json:"bytes_version,omitempty"`
	Subscribed   int    `json:"subscribed"`
	Accepted     int    `json:"accepted"` // of the current version, as are the next three
	Rejected     int    `json:"rejected"`
	Pending      int    `json:"pending"`
	Behind       int    `json:"behind"`
	// Versions are the versions clients stand with, the current first.
	Versions []ConvergenceVersion `json:"versions"`
}

// ConvergenceVersion is where clients stand with one version.
type ConvergenceVersion struct {
	Version  string     `json:"version"`
	Received *time.Time `json:"received,omitempty"` // when the change that brought it arrived
	// UpstreamVersion is the resource's upstream_version, on the current
	// version only.
	UpstreamVersion string `json:"upstream_version,omitempty"`
	Accepted        int    `json:"accepted"`
	Rejected        int    `json:"rejected"`
	Pending         int    `json:"pending"`
	// OldestPending is how long, at most, the oldest pending client has
	// waited: since the pending count last rose from zero.
	OldestPending float64  `json:"oldest_pending_seconds,omitempty"`
	Error         string   `json:"error,omitempty"`       // the first NACK's
	RejectedBy    []string `json:"rejected_by,omitempty"` // node ids, at most cache.MaxRejectedBy
	// Times to accept, from Received to each ACK.
	Acks int     `json:"acks"`
	P50  float64 `json:"p50_seconds"`
	P99  float64 `json:"p99_seconds"`
	Max  float64 `json:"max_seconds"`
}

func (r *Relay) debugConvergence(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	var types []string
	if t := q.Get("type"); t != "" {
		typeURL, err := xds.ParseType(t)
		if err != nil {
			http.Error(w, "xdsrelay: type: "+err.Error(), http.StatusBadRequest)
			return
		}
		types = []string{typeURL}
	}
	limit := convergenceLimit
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			http.Error(w, fmt.Sprintf("xdsrelay: limit: %q is not a count", xds.Clip(l)), http.StatusBadRequest)
			return
		}
		limit = n
	}
	groups := r.snapshotGroups()
	if key := q.Get("group"); key != "" {
		g := r.groupNamed(key)
		if g == nil {
			http.Error(w, fmt.Sprintf("xdsrelay: no group %q", xds.Clip(key)), http.StatusNotFound)
			return
		}
		groups = []*group{g}
	}
	out := convergenceOf(groups, types, q["name"], limit, time.Now())
	if q.Get("bytes_version") == "1" {
		withBytesVersions(groups, out.Resources)
	}
	out.Tiers, out.TiersMore = r.tiersOf(groups)
	out.FleetPaths = r.fleetGroups(groups)
	writeJSON(w, out)
}

// convergenceOf reads the groups' counters: types and names narrow it,
// limit bounds the resources listed. The summary counts clients, so it is
// given for whole types only: with names, each resource's own counts are
// its clients'.
func convergenceOf(groups []*group, types, names []string, limit int, now time.Time) DebugConvergence {
	out := DebugConvergence{Summary: []ConvergenceSummary{}, Resources: []ConvergenceResource{}}
	for _, g := range groups {
		var rs []cache.ResourceConvergence
		if limit > len(out.Resources) || len(names) > 0 {
			rs = g.cache.Convergence(types, names)
		}
		if len(names) == 0 {
			listed := out.summarize(g, types)
			if rs == nil {
				out.More += listed // past the limit, not read
			}
		}
		for _, rc := range rs {
			if len(out.Resources) >= limit {
				out.More++
				continue
			}
			out.Resources = append(out.Resources, resourceShown(g.id, rc, now))
		}
	}
	return out
}

// summarize appends g's clients by type (types, if any, narrow it), with
// each type's resources; it returns how many resources that is.
func (out *DebugConvergence) summarize(g *group, types []string) int {
	resources := map[string]int{}
	for _, s := range g.cache.ConvergenceSummary() {
		resources[s.Type] = s.Resources
	}
	total := 0
	for _, cc := range g.cache.ClientSummary() {
		if len(types) > 0 && cc.Type != types[0] {
			continue
		}
		out.Summary = append(out.Summary, ConvergenceSummary{Group: g.id, Type: cc.Type, Resources: resources[cc.Type],
			Subscribed: cc.Subscribed, Accepted: cc.Accepted, Rejected: cc.Rejected, Pending: cc.Pending, Behind: cc.Behind, Waiting: cc.Waiting,
			PeerStreams: cc.Peers})
		total += resources[cc.Type]
	}
	return total
}

// resourceShown is one resource as the body shows it: names and errors
// clipped, node ids as the streams clipped them.
func resourceShown(group string, rc cache.ResourceConvergence, now time.Time) ConvergenceResource {
	at := rc.At()
	out := ConvergenceResource{Group: group, Type: rc.Type, Name: xds.Clip(rc.Name), Version: xds.Clip(rc.Current),
		UpstreamVersion: xds.Clip(rc.Upstream),
		Subscribed:      rc.Subscribed, Behind: rc.Behind, Accepted: at.Accepted, Rejected: at.Rejected, Pending: at.Pending,
		Versions: []ConvergenceVersion{}}
	for _, v := range rc.Versions {
		cv := ConvergenceVersion{Version: xds.Clip(v.Version), Accepted: v.Accepted, Rejected: v.Rejected, Pending: v.Pending,
			Error: xds.Clip(v.FirstError), RejectedBy: clipList(v.RejectedBy), Acks: v.Acks,
			P50: v.P50.Seconds(), P99: v.P99.Seconds(), Max: v.Max.Seconds()}
		if !v.Received.IsZero() {
			cv.Received = &v.Received
		}
		if v.Version == rc.Current {
			cv.UpstreamVersion = out.UpstreamVersion
		}
		if !v.PendingSince.IsZero() {
			cv.OldestPending = now.Sub(v.PendingSince).Seconds()
		}
		out.Versions = append(out.Versions, cv)
	}
	return out
}

// withBytesVersions sets the listed resources' bytes versions: a hash of
// each one's bytes, which costs what the answer's resources weigh; asked
// for by xdsrelay wait --tiers, so that a version is found through a SotW
// tier (docs/architecture.md, invariant 19 "Count as it happens").
func withBytesVersions(groups []*group, rs []ConvergenceResource) {
	byShown := make(map[string]*group, len(groups))
	for _, g := range groups {
		byShown[g.id] = g
	}
	for i := range rs {
		r := &rs[i]
		g := byShown[r.Group]
		if g == nil || r.Version == "" {
			continue
		}
		if res := g.cache.Get(r.Type, []string{r.Name})[0].Resource; res != nil && xds.Clip(res.Version) == r.Version {
			r.BytesVersion = res.BytesVersion()
		}
	}
}

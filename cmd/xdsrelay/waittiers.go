package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/xdsrelay/xdsrelay/relay"
)

// wait --tiers: the relays asked are the top of a tree. A lower relay is
// one client of the relay above it, and its ACK says only that it has the
// version; each relay lists the lower relays among its clients, as they
// advertise their admin endpoints (admin.advertise_address, /debug/
// convergence tiers). wait asks them too, tier by tier, and counts the
// clients at the leaves: at each tier, a lower relay's clients take its
// place as a client of the tier above (docs/architecture.md, invariant
// 19 "Count as it happens", Tiers).

// Bounds of the tree wait --tiers follows.
const (
	tierDepth  = 8    // tiers below the relays asked
	tierRelays = 1000 // relays asked in all
)

// tierRelay is one relay of the tree: its admin endpoint, how it was
// found and what it answered (nil if it did not).
type tierRelay struct {
	af     adminFlags
	depth  int
	parent *tierRelay // nil at the top
	group  string     // the parent's group it is a client in
	dc     *relay.DebugConvergence
	// more are the other relays that list it, found once it was known: in
	// a fleet, the members are each other's clients, each for the groups
	// the other owns (docs/architecture.md, "Fleet").
	more []tierLink
}

// tierLink is a relay that lists a lower one, and the group of the relay
// above the lower one is a client in.
type tierLink struct {
	parent *tierRelay
	group  string
}

// links are every relay that lists t, and in which group.
func (t *tierRelay) links() []tierLink {
	if t.parent == nil {
		return t.more
	}
	return append([]tierLink{{t.parent, t.group}}, t.more...)
}

// tierKey is a resource, whatever its group.
type tierKey struct{ typ, name string }

// tierVersions are, per resource, the versions that are the one waited
// for: --version (or each resource's current version at the top) and,
// tier by tier, those a relay holds it at when its version or its
// upstream version is one of them: its version (a delta tier below holds
// it at that) and the hash of its bytes (bytes_version: a SotW tier below
// holds it at that, whatever the version above).
type tierVersions struct {
	asked string // --version: every resource's
	by    map[tierKey]map[string]bool
}

func (vs *tierVersions) has(k tierKey, v string) bool {
	return v != "" && (v == vs.asked || vs.by[k][v])
}

func (vs *tierVersions) add(k tierKey, v string) {
	if v == "" {
		return
	}
	if vs.by == nil {
		vs.by = map[tierKey]map[string]bool{}
	}
	if vs.by[k] == nil {
		vs.by[k] = map[string]bool{}
	}
	vs.by[k][v] = true
}

// one is a version waited for of a resource, to name it: --version, or
// the first of them in order.
func (vs *tierVersions) one(k tierKey) string {
	if vs.asked != "" {
		return vs.asked
	}
	all := slices.Sorted(maps.Keys(vs.by[k]))
	if len(all) == 0 {
		return ""
	}
	return all[0]
}

// learn adds what one relay's resources say: at the top without
// --version, each current version; everywhere, a current version whose
// version or upstream version is one waited for.
func (vs *tierVersions) learn(top bool, dc *relay.DebugConvergence) {
	for _, r := range dc.Resources {
		k := tierKey{r.Type, r.Name}
		if top && vs.asked == "" {
			vs.add(k, r.Version)
		}
		if vs.has(k, r.Version) || vs.has(k, r.UpstreamVersion) {
			vs.add(k, r.Version)
			vs.add(k, r.BytesVersion) // as a SotW tier below holds it
		}
	}
}

// countTiers asks the relays and, tier by tier, the lower relays they
// list, and sums the clients at the leaves; refused is a top relay's 4xx
// answer (a lower relay's is that relay not reached).
func (f *waitFlags) countTiers(ctx context.Context, c waitCount) (_ waitCount, refused error) {
	var all []*tierRelay
	seen := map[string]*tierRelay{}
	level := []*tierRelay{}
	for _, af := range f.replicas(ctx) {
		if seen[af.server] == nil {
			t := &tierRelay{af: af}
			seen[af.server] = t
			level = append(level, t)
		}
	}
	vs := &tierVersions{asked: f.version}
	for len(level) > 0 {
		var next []*tierRelay
		for _, t := range level {
			if err := f.ask(ctx, t); err != nil {
				if t.parent == nil && final(err) {
					return c, named(t.af.server, err)
				}
				c.notCounted(fmt.Sprintf("%s: %v", t.where(), err))
				continue
			}
			if t.parent == nil {
				c.answered++
			}
			c.summed(*t.dc)
			if t.parent != nil {
				c.all-- // a lower relay, a client of its parent: its own clients are counted
			}
			vs.learn(t.parent == nil, t.dc)
			next = f.below(t, next, seen, len(all)+len(level), &c)
		}
		all = append(all, level...)
		level = next
	}
	f.sumTiers(&c, all, vs)
	return c, nil
}

// ask asks one relay for the resources.
func (f *waitFlags) ask(ctx context.Context, t *tierRelay) error {
	q := f.query()
	q.Set("bytes_version", "1")
	body, err := t.af.do(ctx, http.MethodGet, "/debug/convergence", q, "")
	if err != nil {
		return err
	}
	var dc relay.DebugConvergence
	if err := json.Unmarshal(body, &dc); err != nil {
		return err
	}
	t.dc = &dc
	return nil
}

// below appends to next the lower relays t lists that are not known yet,
// within the bounds; what the bounds leave out is unknown. One known
// already (a member of t's fleet, asked at the top) is linked to t.
func (f *waitFlags) below(t *tierRelay, next []*tierRelay, seen map[string]*tierRelay, asked int, c *waitCount) []*tierRelay {
	if t.dc.TiersMore > 0 {
		c.notCounted(fmt.Sprintf("%s: %d streams of lower relays past the bound it names", t.af.server, t.dc.TiersMore))
	}
	for _, l := range t.dc.Tiers {
		if known, ok := seen[l.Admin]; ok {
			if known != nil && known != t {
				known.more = append(known.more, tierLink{t, l.Group})
			}
			continue
		}
		seen[l.Admin] = nil // not asked, unless appended below
		switch {
		case t.depth+1 > tierDepth:
			c.notCounted(fmt.Sprintf("%s: deeper than %d tiers, not asked", l.Admin, tierDepth))
			continue
		case asked+len(next) >= tierRelays:
			c.notCounted(fmt.Sprintf("%s: more than %d relays, not asked", l.Admin, tierRelays))
			continue
		}
		af := f.tls
		af.server, af.timeout = l.Admin, 10*time.Second
		lower := &tierRelay{af: af, depth: t.depth + 1, parent: t, group: l.Group}
		seen[l.Admin] = lower
		next = append(next, lower)
	}
	return next
}

// where names a relay and how it was found.
func (t *tierRelay) where() string {
	if t.parent == nil {
		return t.af.server
	}
	return fmt.Sprintf("%s (a lower relay of %s, group %q)", t.af.server, t.parent.af.server, t.group)
}

// tierCount is one resource of one relay's group, as wait counts it.
type tierCount struct {
	relay                                   *tierRelay
	r                                       relay.ConvergenceResource
	at                                      relay.ConvergenceVersion // summed over the versions waited for
	subscribed, accepted, rejected, pending int
}

// sumTiers counts every relay's resources at the versions waited for,
// takes each lower relay out of its parent's count where it is a client,
// and sums.
func (f *waitFlags) sumTiers(c *waitCount, all []*tierRelay, vs *tierVersions) {
	var counts []*tierCount
	byRelay := map[*tierRelay][]*tierCount{}
	for _, t := range all {
		if t.dc == nil {
			continue
		}
		if t.dc.More > 0 {
			c.notCounted(fmt.Sprintf("%s: %d resources past the %d listed: name those to wait for with --name", t.where(), t.dc.More, len(t.dc.Resources)))
		}
		for _, r := range t.dc.Resources {
			tc := countAt(t, r, vs)
			counts = append(counts, tc)
			byRelay[t] = append(byRelay[t], tc)
		}
	}
	for _, tc := range counts {
		takeOutAll(tc, byRelay, vs)
	}
	for _, tc := range counts {
		c.addTier(tc)
	}
}

// countAt counts one relay's resource at the versions waited for: at the
// top without --version, its own current version.
func countAt(t *tierRelay, r relay.ConvergenceResource, vs *tierVersions) *tierCount {
	tc := &tierCount{relay: t, r: r, subscribed: r.Subscribed}
	k := tierKey{r.Type, r.Name}
	for _, v := range r.Versions {
		if t.parent == nil && vs.asked == "" && v.Version != r.Version {
			continue
		}
		if !vs.has(k, v.Version) && !(v.Version == r.Version && vs.has(k, r.UpstreamVersion)) {
			continue
		}
		tc.at.Version = v.Version
		tc.at.Accepted += v.Accepted
		tc.at.Rejected += v.Rejected
		tc.at.Pending += v.Pending
		tc.at.OldestPending = max(tc.at.OldestPending, v.OldestPending)
		tc.at.Error = cmp.Or(tc.at.Error, v.Error)
		tc.at.RejectedBy = append(tc.at.RejectedBy, v.RejectedBy...)
	}
	tc.at.Version = cmp.Or(tc.at.Version, vs.one(k))
	tc.accepted, tc.rejected, tc.pending = tc.at.Accepted, tc.at.Rejected, tc.at.Pending
	return tc
}

// takeOutAll takes a lower relay's resource out of the counts of the
// relays that list it. A member of a fleet is a client of another in the
// groups that other owns, under the same group key: it is taken out there,
// in that group alone. A relay of the tier below is a client in a group
// of its own making: it is taken out of its parent's count (takeOut).
func takeOutAll(tc *tierCount, byRelay map[*tierRelay][]*tierCount, vs *tierVersions) {
	fleet := false
	for _, l := range tc.relay.links() {
		if !holdsGroup(byRelay[tc.relay], l.group) {
			continue
		}
		fleet = true
		if tc.r.Group == l.group {
			takeOutOf(tc, parentCount(onlyGroup(byRelay[l.parent], l.group), l.group, tc.r), vs)
		}
	}
	if !fleet && tc.relay.parent != nil {
		takeOut(tc, byRelay[tc.relay.parent], vs)
	}
}

// holdsGroup reports whether counts hold a resource of group.
func holdsGroup(counts []*tierCount, group string) bool {
	return slices.ContainsFunc(counts, func(tc *tierCount) bool { return tc.r.Group == group })
}

// onlyGroup are the counts of group.
func onlyGroup(counts []*tierCount, group string) []*tierCount {
	return slices.DeleteFunc(slices.Clone(counts), func(tc *tierCount) bool { return tc.r.Group != group })
}

// takeOut takes a lower relay's group that holds a resource out of its
// parent's count of it: its stream above is one subscribed client, and
// one that accepted if it holds a version waited for. Its own clients
// are counted in its place.
func takeOut(tc *tierCount, parent []*tierCount, vs *tierVersions) {
	if tc.relay.parent == nil {
		return
	}
	takeOutOf(tc, parentCount(parent, tc.relay.group, tc.r), vs)
}

// takeOutOf takes the lower relay's resource tc out of up, the count of
// it above; nil is nothing to take out of.
func takeOutOf(tc *tierCount, up *tierCount, vs *tierVersions) {
	if up == nil || tc.r.Version == "" {
		return
	}
	up.subscribed--
	if vs.has(tierKey{tc.r.Type, tc.r.Name}, tc.r.Version) {
		up.accepted--
	}
}

// addTier adds one relay's resource to its resource's clients, and a line
// if it is not there yet.
func (c *waitCount) addTier(tc *tierCount) {
	// A lower relay taken out may have been counted above in another way
	// than its version here says (an answer on its way): no relay's count
	// goes below zero, nor its acceptances past its clients.
	tc.subscribed = max(tc.subscribed, 0)
	tc.accepted = min(max(tc.accepted, 0), tc.subscribed)
	behind := max(tc.subscribed-tc.accepted-tc.rejected-tc.pending, 0)
	c.addResource(tierKey{tc.r.Type, tc.r.Name}, tally{subscribed: tc.subscribed, accepted: tc.accepted, rejected: tc.rejected, pending: tc.pending, behind: behind})
	if tc.accepted >= tc.subscribed {
		return
	}
	if len(c.shown) == waitShown {
		c.more++
		return
	}
	r, at := tc.r, tc.at
	r.Subscribed, at.Accepted = tc.subscribed, tc.accepted
	c.shown = append(c.shown, resourceLine(tc.relay.where(), r, at.Version, at, behind))
}

// parentCount is the parent's count of the resource a lower relay holds:
// in the group the lower relay is a client of, else in any.
func parentCount(up []*tierCount, group string, r relay.ConvergenceResource) *tierCount {
	var any *tierCount
	for _, tc := range up {
		if tc.r.Type != r.Type || tc.r.Name != r.Name || tc.subscribed == 0 {
			continue
		}
		if tc.r.Group == group {
			return tc
		}
		if any == nil {
			any = tc
		}
	}
	return any
}

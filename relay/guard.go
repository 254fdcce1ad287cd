package relay

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The mass-removal guard's side in the relay (docs/protection.md, "Mass-removal
// guard"): the caches hold the removals (cache.Guard); the relay logs and
// counts each hold, shows it on /readyz and /debug/groups, and releases it
// on an operator's word (POST /debug/guard/release).

// guardMetrics count holds and their ends.
type guardMetrics struct {
	holds *metrics.Vec // by type
	ends  *metrics.Vec // by type, reason
	wipes *metrics.Vec // by type, reason: wipe holds (guard.wipe_hold) that ended
}

func newGuardMetrics(reg *metrics.Registry) guardMetrics {
	return guardMetrics{
		holds: reg.Counter("xdsrelay_guard_holds_total", "Mass removals from the control plane held by the guard (guard.max_removed_fraction): clients kept the resources.", "type").
			ZeroEach(xds.TypeLabels()...),
		ends: reg.Counter("xdsrelay_guard_hold_ends_total", "Guard holds that ended, by reason: released (an operator), resent (nothing left to remove: the control plane sent the resources again), expired (guard.hold passed; the removals were applied).", "type", "reason").
			Zero(metrics.Cross(xds.TypeLabels(), []string{cache.EndReleased, cache.EndResent, cache.EndExpired})...),
		wipes: reg.Counter("xdsrelay_guard_wipe_holds_total", "Removals of every resource of a type held for guard.wipe_hold, by how the hold ended: resent (the control plane sent resources again: clients never saw the gap), expired (guard.wipe_hold passed; the removals were applied) or released (an operator).", "type", "reason").
			Zero(metrics.Cross(xds.TypeLabels(), []string{cache.EndReleased, cache.EndResent, cache.EndExpired})...),
	}
}

// guardEvent logs and counts a hold starting or ending in group key.
func (r *Relay) guardEvent(id string, ev cache.GuardEvent) {
	short := xds.ShortName(ev.TypeURL)
	if ev.Wipe {
		r.wipeEvent(id, short, ev)
		return
	}
	if ev.End == "" {
		r.guardM.holds.With(short).Inc()
		r.log.Error("guard: the control plane removed most of a type; the removals are HELD and clients keep the resources",
			"group", id, "type", short, "held", ev.Held, "removed_in_window", ev.Removed, "of", ev.Base,
			"first", xds.Clip(ev.First), "guard.max_removed_fraction", r.cfg.Guard.MaxRemovedFraction,
			"release", "POST /debug/guard/release on the admin endpoint, or xdsrelay guard release")
		return
	}
	r.guardM.ends.With(short, ev.End).Inc()
	r.log.Warn("guard: hold ended", "group", id, "type", short, "reason", ev.End,
		"removals_applied", len(ev.Applied))
}

// wipeEvent logs a wipe hold starting, and logs and counts its end: a
// short hold, over on its own, that asks nothing of an operator.
func (r *Relay) wipeEvent(id, short string, ev cache.GuardEvent) {
	if ev.End == "" {
		r.log.Warn("guard: the control plane removed every resource of a type; clients keep them while it may send them again",
			"group", id, "type", short, "removed", ev.Held, "first", xds.Clip(ev.First), "guard.wipe_hold", r.cfg.Guard.WipeHold)
		return
	}
	r.guardM.wipes.With(short, ev.End).Inc()
	r.log.Warn("guard: wipe hold ended", "group", id, "type", short, "reason", ev.End,
		"removals_applied", len(ev.Applied))
}

// guardRelease serves POST /debug/guard/release[?group=G][&type=T]: the
// holds of one group or all, of one type or all, end and their removals
// are applied.
func (r *Relay) guardRelease(w http.ResponseWriter, req *http.Request) {
	release(r, w, req, "guard: holds released by an operator", "holds", func(g *group, typeURL string) (out []debugHold) {
		for _, h := range g.cache.ReleaseHolds(typeURL) {
			out = append(out, debugHold{Group: g.id, Type: h.TypeURL, Since: h.Since, Names: len(h.Names), Wipe: h.Wipe})
		}
		return out
	})
}

// release is an operator's release (the guard's or the rollout's): each
// group in the request's scope releases what it holds of the scope's type
// (each), and the answer lists what was released; logged at warn, with
// how many under count.
func release[T any](r *Relay, w http.ResponseWriter, req *http.Request, msg, count string, each func(g *group, typeURL string) []T) {
	out, ok := collect(r, w, req, each)
	if !ok {
		return
	}
	q := req.URL.Query()
	r.log.Warn(msg, "group", xds.Clip(q.Get("group")), "type", q.Get("type"), count, len(out))
	writeJSON(w, out)
}

// collect gathers what each group in the request's scope (releaseScope)
// gives of the scope's type: what an operator's release ends, or what the
// guard's and the rollout's lists show. Not ok: the scope was refused, and
// answered.
func collect[T any](r *Relay, w http.ResponseWriter, req *http.Request, each func(g *group, typeURL string) []T) ([]T, bool) {
	groups, typeURL, ok := r.releaseScope(w, req)
	if !ok {
		return nil, false
	}
	out := []T{}
	for _, g := range groups {
		out = append(out, each(g, typeURL)...)
	}
	return out, true
}

// releaseScope reads a release's ?group= (the id as /debug/groups shows
// it) and ?type= (any name of a type, xds.ParseType): the groups it names,
// every group without it, and the type URL, "" for every type. It answers
// 400 for an unknown type and 404 for an unknown group itself.
func (r *Relay) releaseScope(w http.ResponseWriter, req *http.Request) (groups []*group, typeURL string, ok bool) {
	q := req.URL.Query()
	shown, typeName := q.Get("group"), q.Get("type")
	if typeName != "" {
		var err error
		if typeURL, err = xds.ParseType(typeName); err != nil {
			http.Error(w, "xdsrelay: type: "+err.Error(), http.StatusBadRequest)
			return nil, "", false
		}
	}
	if shown == "" {
		return r.snapshotGroups(), typeURL, true
	}
	g := r.groupNamed(shown)
	if g == nil {
		http.Error(w, fmt.Sprintf("xdsrelay: no group %q (see /debug/groups)", xds.Clip(shown)), http.StatusNotFound)
		return nil, "", false
	}
	return []*group{g}, typeURL, true
}

// debugHold is one type's held removals in a group.
type debugHold struct {
	Group string    `json:"group,omitempty"`
	Type  string    `json:"type"`
	Since time.Time `json:"since"`
	Names int       `json:"names"`          // removals held
	Wipe  bool      `json:"wipe,omitempty"` // held for guard.wipe_hold: every resource of the type removed
}

func holdsOf(c *cache.Cache) []debugHold {
	out := []debugHold{}
	for _, h := range c.Holds() {
		out = append(out, debugHold{Type: h.TypeURL, Since: h.Since, Names: len(h.Names), Wipe: h.Wipe})
	}
	return out
}

// guardDetail writes a group's holds for the private /readyz.
func guardDetail(w io.Writer, c *cache.Cache) {
	for _, h := range c.Holds() {
		if h.Wipe {
			fmt.Fprintf(w, "  DEGRADED: guard holding the removal of every %s (%d) since %s, for up to guard.wipe_hold\n",
				xds.ShortName(h.TypeURL), len(h.Names), h.Since.UTC().Format(time.RFC3339))
			continue
		}
		fmt.Fprintf(w, "  DEGRADED: guard holding %d removals of %s since %s (release: POST /debug/guard/release)\n",
			len(h.Names), xds.ShortName(h.TypeURL), h.Since.UTC().Format(time.RFC3339))
	}
}

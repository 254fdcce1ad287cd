package relay

import (
	"fmt"
	"net/http"
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Make before break's side in the relay (docs/architecture.md, invariant
// 18; docs/control-planes.md, "References"): the caches fetch what
// resources point at and hold what would dangle (cache.Consistency); the
// relay counts and logs each wait that ends, gauges what dangles, and
// shows it on GET /debug/references.

// referenceMetrics count reference waits and gauge dangling references.
type referenceMetrics struct {
	waits    *metrics.Vec // by type, outcome
	dangling *metrics.Vec // by type
	refused  *metrics.Vec // by type
}

func newReferenceMetrics(reg *metrics.Registry) referenceMetrics {
	return referenceMetrics{
		waits: reg.Counter("xdsrelay_reference_waits_total", "Resources from the control plane that waited for a name they point at (a Route for its Cluster, a Cluster for its endpoints), and removals that waited for nothing to point at the name, by the type of what waited and how the wait ended: resolved (what it waited for came, or went) or timeout (consistency.max_wait passed, for it or for another wait on the same name; clients got the control plane's word as it was, and nothing waits for that name again until it exists).", "type", "outcome").
			Zero(metrics.Cross(xds.TypeLabels(), []string{cache.WaitResolved, cache.WaitTimeout})...),
		dangling: reg.Gauge("xdsrelay_dangling_references", "References from resources the groups' caches hold to names they lack (being fetched, not existing upstream, or let through after consistency.max_wait), by the type of the name pointed at; summed over groups.", "type").
			ZeroEach(xds.TypeLabels()...),
		refused: reg.Counter("xdsrelay_references_refused_total", "Names that resources from the control plane point at and that the relay did not fetch, because the group's interest was at limits.max_names_per_group, by the type of the name; what waits for one is released after consistency.max_wait.", "type").
			ZeroEach(xds.TypeLabels()...),
	}
}

// registerReferenceMetrics sets, at each scrape, the dangling references
// of every group: each cache keeps its own as they happen.
func (r *Relay) registerReferenceMetrics() {
	r.metrics.OnScrape(func() {
		sum := map[string]int64{}
		for _, g := range r.snapshotGroups() {
			for typeURL, n := range g.cache.DanglingReferences() {
				sum[xds.ShortName(typeURL)] += int64(n)
			}
		}
		for _, short := range xds.TypeLabels() {
			r.refM.dangling.With(short).Set(sum[short])
			delete(sum, short)
		}
		for short, n := range sum {
			r.refM.dangling.With(short).Set(n)
		}
	})
}

// referenceEvent counts a reference wait that ended in group key, and
// logs one that timed out: clients got what the control plane said, a
// reference that dangles or a removal of a name still pointed at.
func (r *Relay) referenceEvent(id string, ev cache.ReferenceEvent) {
	short := xds.ShortName(ev.TypeURL)
	r.refM.waits.With(short, ev.Outcome).Inc()
	if ev.Outcome != cache.WaitTimeout {
		return
	}
	first := ""
	if len(ev.Missing) > 0 {
		first = xds.ShortName(ev.Missing[0].TypeURL) + " " + ev.Missing[0].Name
	}
	if ev.Removal {
		r.log.Warn("consistency: a removal waited consistency.max_wait for what points at the name to move; removed as the control plane said",
			"group", id, "type", short, "name", xds.Clip(ev.Name), "still_pointed_at_by", len(ev.Missing),
			"first", xds.Clip(first), "consistency.max_wait", r.cfg.Consistency.MaxWait)
		return
	}
	r.log.Warn("consistency: a resource waited for a name it points at until consistency.max_wait ran out; sent as the control plane said, and what points at the name is sent at once until the name exists",
		"group", id, "type", short, "name", xds.Clip(ev.Name), "missing", len(ev.Missing),
		"first", xds.Clip(first), "waited", ev.Waited, "consistency.max_wait", r.cfg.Consistency.MaxWait)

}

// unsafeOrder logs, once per group and type (the cache tells only the
// first wait of each type), that the control plane sends resources of the
// type in an order that is not make before break ("Eventual consistency
// considerations"): the relay holds them, for consistency.max_wait at most.
func (r *Relay) unsafeOrder(id string, u cache.UnsafeOrder) {
	short := xds.ShortName(u.TypeURL)
	first := ""
	if len(u.Refs) > 0 {
		first = xds.ShortName(u.Refs[0].TypeURL) + " " + u.Refs[0].Name
	}
	if u.Removal {
		r.log.Warn("consistency: the control plane removed a name that a resource still points at, an unsafe order; the relay holds the removal until nothing points at the name, for consistency.max_wait at most (logged once per group and type)",
			"group", id, "type", short, "name", xds.Clip(u.Name), "pointed_at_by", xds.Clip(first),
			"consistency.max_wait", r.cfg.Consistency.MaxWait)
		return
	}
	r.log.Warn("consistency: the control plane sent a resource before what it points at, an unsafe order; the relay holds it until that arrives, for consistency.max_wait at most, and a name that has not come by then is not waited for again until it exists (logged once per group and type)",
		"group", id, "type", short, "name", xds.Clip(u.Name), "points_at", xds.Clip(first),

		"consistency.max_wait", r.cfg.Consistency.MaxWait)
}

// referencesRefused counts names a group's resources point at that were
// not fetched at limits.max_names_per_group (docs/architecture.md,
// invariant 9 "Every bound is explicit"), and logs the first refusal of
// the group.
func (r *Relay) referencesRefused(id string, rr cache.RefusedReferences) {
	for typeURL, n := range rr.ByType {
		r.refM.refused.With(xds.ShortName(typeURL)).Add(int64(n))
	}
	if !rr.First {
		return
	}
	from := ""
	if rr.From.Name != "" {
		from = xds.ShortName(rr.From.TypeURL) + " " + rr.From.Name
	}
	r.log.Warn("consistency: names resources point at were not fetched, the group's names are at limits.max_names_per_group; what waits for them is released after consistency.max_wait (logged once per group, counted in xdsrelay_references_refused_total)",
		"group", id, "refused", rr.Count, "first", xds.Clip(xds.ShortName(rr.Example.TypeURL)+" "+rr.Example.Name),
		"from", xds.Clip(from), "limits.max_names_per_group", rr.Max)
}

// maxDebugReferences bounds the entries of each list /debug/references
// shows, and of what points at each entry.
const maxDebugReferences = 1000

type debugRef struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

type debugDangling struct {
	debugRef
	From     []debugRef `json:"from"`
	MoreFrom int        `json:"more_from,omitempty"`
}

type debugWaiting struct {
	debugRef
	Since       time.Time  `json:"since"`
	Removal     bool       `json:"removal"`
	Missing     []debugRef `json:"missing,omitempty"`       // what a resource lacks
	PointedAtBy []debugRef `json:"pointed_at_by,omitempty"` // what still points at a removed name
	More        int        `json:"more,omitempty"`
}

type debugReferences struct {
	Group        string          `json:"group"`
	MaxWait      string          `json:"max_wait"`
	Dangling     []debugDangling `json:"dangling"`
	MoreDangling int             `json:"more_dangling,omitempty"`
	Waiting      []debugWaiting  `json:"waiting"`
	MoreWaiting  int             `json:"more_waiting,omitempty"`
}

// bounded is what f makes of the first maxDebugReferences of in, and how
// many more there are: every list /debug/references shows is cut so.
func bounded[T, U any](in []T, f func(T) U) ([]U, int) {
	n := min(len(in), maxDebugReferences)
	out := make([]U, 0, n)
	for _, v := range in[:n] {
		out = append(out, f(v))
	}
	return out, len(in) - n
}

// debugRefs is refs as an admin body shows them: at most
// maxDebugReferences, names clipped, and how many more there are.
func debugRefs(refs []xds.Ref) ([]debugRef, int) { return bounded(refs, shownRef) }

func shownRef(ref xds.Ref) debugRef {
	return debugRef{Type: xds.ShortName(ref.TypeURL), Name: xds.Clip(ref.Name)}
}

// debugReferences serves GET /debug/references?group=KEY: what resources
// of the group's cache point at that it lacks, and what waits for
// references (make before break).
func (r *Relay) debugReferences(w http.ResponseWriter, req *http.Request) {
	key := req.URL.Query().Get("group")
	if key == "" {
		http.Error(w, "xdsrelay: group: give the group's id, ?group=ID (GET /debug/groups lists them)", http.StatusBadRequest)
		return
	}
	g := r.groupNamed(key)
	if g == nil {
		http.Error(w, fmt.Sprintf("xdsrelay: no group %q", xds.Clip(key)), http.StatusNotFound)
		return
	}
	refs := g.cache.References()
	out := debugReferences{Group: g.id, MaxWait: r.cfg.Consistency.MaxWait.String()}
	out.Dangling, out.MoreDangling = bounded(refs.Dangling, func(d cache.Dangling) debugDangling {
		from, more := debugRefs(d.From)
		return debugDangling{debugRef: shownRef(d.Ref), From: from, MoreFrom: more}
	})
	out.Waiting, out.MoreWaiting = bounded(refs.Waiting, func(wt cache.Waiting) debugWaiting {
		dw := debugWaiting{debugRef: shownRef(wt.Ref), Since: wt.Since, Removal: wt.Removal}
		if wt.Removal {
			dw.PointedAtBy, dw.More = debugRefs(wt.Missing)
		} else {
			dw.Missing, dw.More = debugRefs(wt.Missing)
		}
		return dw
	})
	writeJSON(w, out)
}

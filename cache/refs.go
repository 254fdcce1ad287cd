package cache

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Consistency is make before break (docs/architecture.md, invariant 18):
// what a resource points at (Resource.Refs) is fetched as an interest of
// the group and reaches clients before it, and a removal reaches them only
// once nothing they hold points at the name. The zero Consistency is off.
//
// The waits live in the release step, before the rollout's gate sees a
// change: a resource (new or changed) that points at a Cluster the cache
// lacks, or at its endpoints (waitsFor), is not applied, and its watchers
// not marked, until they are present or MaxWait has passed. A removal
// meets the guard's holds first; what they let through, of a present name
// that a present resource points at, is not applied until nothing does,
// or MaxWait has passed. After
// MaxWait the control plane's word wins. A change that needs no wait is
// applied as before.
type Consistency struct {
	MaxWait time.Duration // 0: off
}

func (k Consistency) on() bool { return k.MaxWait > 0 }

// How a reference wait ended (ReferenceEvent.Outcome).
const (
	WaitResolved = "resolved" // what it waited for came (or went)
	WaitTimeout  = "timeout"  // Consistency.MaxWait passed: applied as the control plane said
)

// ReferenceEvent is the end of a reference wait, as told to
// Options.OnReference.
type ReferenceEvent struct {
	TypeURL, Name string
	Removal       bool   // a removal waited, not a resource
	Outcome       string // WaitResolved or WaitTimeout
	Waited        time.Duration
	// Missing is, on a timeout, what the resource still lacked, or, for a
	// removal, what still pointed at the name.
	Missing []xds.Ref
}

// Dangling is a name the cache lacks that present resources point at.
type Dangling struct {
	xds.Ref
	From []xds.Ref // sorted
}

// Waiting is a resource or a removal waiting for references.
type Waiting struct {
	xds.Ref
	Since   time.Time
	Removal bool
	// Missing is what the resource lacks, or, for a removal, what still
	// points at the name; sorted.
	Missing []xds.Ref
}

// References is what points at what is missing, and what waits.
type References struct {
	Dangling []Dangling
	Waiting  []Waiting
}

// UnsafeOrder is the first wait of a type in the cache, as told to
// Options.OnUnsafeOrder: the control plane sent a resource before what it
// points at, or removed a name something still points at. Each type is
// told once for the life of the cache.
type UnsafeOrder struct {
	TypeURL, Name string
	Removal       bool // a removal waits, not a resource
	// Refs is what the resource lacks, or, for a removal, what still
	// points at the name; sorted, at most maxUnsafeRefs.
	Refs []xds.Ref
}

// maxUnsafeRefs bounds UnsafeOrder.Refs: an example, not an inventory.
const maxUnsafeRefs = 4

// RefusedReferences is, as told to Options.OnRefused, how many names that
// resources point at were not fetched since the last time told, because
// the group's interest was at MaxNames; a resource that waits for one is
// released when Consistency.MaxWait passes. First is set the first time
// in the life of the cache.
type RefusedReferences struct {
	Count   int
	ByType  map[string]int // Count by the type of the names refused
	First   bool
	Example xds.Ref // the first refused
	From    xds.Ref // what pointed at it, if a present resource did
	Max     int     // Options.MaxNames
}

// waiter is a resource waiting for what it points at.
type waiter struct {
	res   *Resource
	since time.Time
}

// queuedWait is a wait in Cache.waitQ: the resource (or removal) of ref
// that began to wait at since. It has ended if what waits for ref now
// began at another time, or nothing does.
type queuedWait struct {
	ref     xds.Ref
	removal bool
	since   time.Time
}

// referenced reports whether something points at the entry: a present
// resource or one waiting.
func (e *entry) referenced() bool { return len(e.from) > 0 || e.pend > 0 }

// refsLocked moves the references of name (of t) from old to new, the
// resource it had and the one it has now (either may be nil). Called
// whenever an entry's resource changes (setLocked).
func (c *Cache) refsLocked(t *typeState, name string, old, new *Resource) {
	var was, is []xds.Ref
	if old != nil {
		was = old.Refs
	}
	if new != nil {
		is = new.Refs
	}
	if slices.Equal(was, is) {
		return // the common change: what it points at stays
	}
	from := xds.Ref{TypeURL: t.typeURL, Name: name}
	in := func(refs []xds.Ref) func(xds.Ref) bool {
		if len(refs) < 16 {
			return func(r xds.Ref) bool { return slices.Contains(refs, r) }
		}
		set := make(map[xds.Ref]struct{}, len(refs))
		for _, r := range refs {
			set[r] = struct{}{}
		}
		return func(r xds.Ref) bool { _, ok := set[r]; return ok }
	}
	inWas, inIs := in(was), in(is)
	for _, r := range is {
		if !inWas(r) {
			c.pointLocked(r, &from, 0)
		}
	}
	for _, r := range was {
		if !inIs(r) {
			c.unpointLocked(r, &from, 0)
		}
	}
}

// pendLocked counts (or, unless add, uncounts) the references of a
// waiting resource: they are fetched while it waits.
func (c *Cache) pendLocked(r *Resource, add bool) {
	for _, ref := range r.Refs {
		if add {
			c.pointLocked(ref, nil, 1)
		} else {
			c.unpointLocked(ref, nil, 1)
		}
	}
}

// pointLocked records that from (a present resource) or a waiting one
// (pend) points at ref.
func (c *Cache) pointLocked(ref xds.Ref, from *xds.Ref, pend int) {
	t := c.typeLocked(ref.TypeURL)
	e := t.newEntryLocked(ref.Name)
	was := e.referenced()
	if from != nil {
		if e.from == nil {
			e.from = make(map[xds.Ref]struct{}, 1)
		}
		e.from[*from] = struct{}{}
	}
	e.pend += pend
	refused := c.refused.Count
	c.referencedLocked(t, ref.Name, e, was)
	if refused == 0 && c.refused.Count > 0 && from != nil {
		c.refused.From = *from
	}
}

// unpointLocked undoes pointLocked.
func (c *Cache) unpointLocked(ref xds.Ref, from *xds.Ref, pend int) {
	t := c.types[ref.TypeURL]
	e := t.entryLocked(ref.Name)
	if e == nil {
		return
	}
	was := e.referenced()
	if from != nil {
		delete(e.from, *from)
	}
	e.pend -= pend
	c.referencedLocked(t, ref.Name, e, was)
}

// referencedLocked keeps the interest and the missing names as what points
// at e changed (was: whether something did). A name something points at is
// in the interest, if the group's bound lets it in (admitLocked); once
// nothing does, it is retained as a name whose last watcher left.
func (c *Cache) referencedLocked(t *typeState, name string, e *entry, was bool) {
	is := e.referenced()
	switch {
	case is && !was:
		if c.admitLocked(t, name, e) && !e.wanted {
			c.noteLocked(t.typeURL, name, true)
			c.signalInterest()
		}
	case !is && was:
		admitted := e.refIn
		c.unadmitLocked(e)
		switch {
		case e.wanted:
		case !admitted:
			// Refused at MaxNames: never fetched, nothing to keep.
			if e.res == nil && !e.absent && e.watchers.len() == 0 && e.rel == nil && e.err == nil {
				t.deleteEntryLocked(name)
			}
		case c.dropping:
			// What pointed at it is dropped, retired or evicted: nothing
			// held it but that, and it goes with it (dropIfUnheldLocked).
			c.orphans = append(c.orphans, xds.Ref{TypeURL: t.typeURL, Name: name})
		default:
			c.wantLocked(e, true)
			e.idle = c.now()
			if e.watchers.len() == 0 {
				c.idle.Add(idleKey{typeURL: t.typeURL, name: name}, struct{}{})
			}
		}
	}
	if len(e.from) == 0 && c.waits > 0 {
		c.wakeRemovalLocked(t, name) // nothing present points at it: its removal may go
	}
	t.missingLocked(name, e)
}

// admitLocked lets a name something now points at into the interest,
// unless that would take the names the group fetches (wanted, and only
// referenced) past MaxNames (docs/architecture.md, invariant 9 "Every
// bound is explicit"): a Route naming 100,000 Clusters fetches no more
// than the bound. A refused name is counted (OnRefused) and not fetched;
// what waits for it is released by Consistency.MaxWait.
func (c *Cache) admitLocked(t *typeState, name string, e *entry) bool {
	if !e.wanted && c.maxNames > 0 && c.wanted+c.refOnly >= c.maxNames {
		if c.refused.Count == 0 {
			c.refused.Example, c.refused.From, c.refused.Max = xds.Ref{TypeURL: t.typeURL, Name: name}, xds.Ref{}, c.maxNames
			c.refused.ByType = make(map[string]int, 1)
		}
		c.refused.Count++
		c.refused.ByType[t.typeURL]++
		return false
	}
	e.refIn = true
	if !e.wanted {
		c.refOnly++
	}
	return true
}

// unadmitLocked takes out of the interest a name nothing points at any
// more (the interest log is kept by the caller).
func (c *Cache) unadmitLocked(e *entry) {
	if e.refIn && !e.wanted {
		c.refOnly--
	}
	e.refIn = false
}

// missingLocked keeps t.missing: the names present resources point at
// that the cache lacks.
func (t *typeState) missingLocked(name string, e *entry) {
	if len(e.from) > 0 && e.res == nil {
		if t.missing == nil {
			t.missing = make(map[string]struct{})
		}
		t.missing[name] = struct{}{}
	} else {
		delete(t.missing, name)
	}
}

// waitsFor reports whether a resource waits for the names of typeURL it
// points at: the Clusters of a Route or a Listener, which the spec's order
// sends before them ("Eventual consistency considerations": CDS before
// the EDS, LDS and RDS that use it). It waits for those Clusters'
// endpoints too (lackingLocked): a client that reads the Route finds
// everything it needs to send a request cached. What comes after what
// points at it (a Cluster's own endpoints, a Listener's Route, the Secrets
// both load) is warmed by the client, which asks for it once it reads what
// points at it: it is fetched, so that it is cached by then, and its
// removal waits, but nothing waits for it.
func waitsFor(typeURL string) bool { return typeURL == resourcev3.ClusterType }

// lacksLocked reports whether the cache lacks a name r waits for.
func (c *Cache) lacksLocked(r *Resource) bool { return len(c.lackingLocked(r, false)) > 0 }

// lackingLocked is what r waits for that the cache lacks: a Cluster it
// points at, or that Cluster's endpoints; only the first unless all. A name
// upstream said does not exist is not waited for: the control plane's word
// wins. Nor is a dangling one, whose wait ran out before.
func (c *Cache) lackingLocked(r *Resource, all bool) []xds.Ref {
	return c.refsWhereLocked(r, all, lacked)
}

// missingRefsLocked is what r points at and would wait for that the cache
// lacks, dangling names included: what it goes to clients without.
func (c *Cache) missingRefsLocked(r *Resource) []xds.Ref {
	return c.refsWhereLocked(r, true, missing)
}

// refsWhereLocked is what r waits for (waitsFor, and those Clusters'
// endpoints) whose entries match; only the first unless all.
func (c *Cache) refsWhereLocked(r *Resource, all bool, match func(*entry) bool) []xds.Ref {
	var out []xds.Ref
	for _, ref := range r.Refs {
		if !waitsFor(ref.TypeURL) {
			continue
		}
		e := c.types[ref.TypeURL].entryLocked(ref.Name)
		if match(e) {
			out = append(out, ref)
			if !all {
				return out
			}
			continue
		}
		if e == nil || e.res == nil {
			continue // absent, or dangling
		}
		for _, sub := range e.res.Refs {
			if sub.TypeURL == resourcev3.EndpointType && match(c.types[sub.TypeURL].entryLocked(sub.Name)) {
				out = append(out, sub)
				if !all {
					return out
				}
			}
		}
	}
	return out
}

// missing reports whether an entry pointed at is neither present nor known
// not to exist.
func missing(e *entry) bool { return e == nil || (e.res == nil && !e.absent) }

// lacked reports whether an entry is waited for: missing, and not
// dangling. A name whose wait ran out is not waited for again until it
// exists: it would hold every later version of what points at it (a whole
// RouteConfiguration, its other virtual hosts with it) for nothing, where
// Envoy does not wait on a route's Clusters at all (docs/architecture.md,
// invariant 18 "Make before break, whatever the order upstream").
func lacked(e *entry) bool { return missing(e) && (e == nil || !e.dangling) }

// waitUpsertsLocked takes out of upserts those that point at a name the
// cache lacks and that they wait for (waitsFor): they wait (t.waiting)
// and what they point at is fetched. A newer version of a waiting
// resource replaces it, keeping when the wait began; an upsert of a name
// whose removal waits ends that wait (unremoveLocked). upserts is not
// modified. The waiters it replaces are returned, for the caller to let
// go of (unpendLocked) once the upserts are applied: what both point at
// stays in the interest throughout.
func (c *Cache) waitUpsertsLocked(t *typeState, upserts []*Resource, now time.Time) (out, replaced []*Resource) {
	if !c.consistency.on() {
		return upserts, nil
	}
	out = upserts
	copied := false
	for i, r := range upserts {
		since := now
		queued := false
		if w := c.dropWaiterLocked(t, r.Name); w != nil {
			since, queued = w.since, true
			replaced = append(replaced, w.res)
		}
		c.unremoveLocked(t, r.Name)
		wait := len(r.Refs) > 0 && c.lacksLocked(r)
		if wait {
			e := t.entries[r.Name]
			switch {
			case e == nil && !t.wantWildcard && !t.aliasWantedLocked(r) && t.globLocked(r.Name) == nil:
				wait = false // nobody asked for it: putLocked ignores it
			case e != nil && e.res != nil && e.res.Version == r.Version && string(e.res.Wire) == string(r.Wire):
				wait = false // nothing changes
			}
		}
		if !wait {
			if copied {
				out = append(out, r)
			}
			continue
		}
		if !copied {
			out = append(make([]*Resource, 0, len(upserts)-1), upserts[:i]...)
			copied = true
		}
		c.addWaiterLocked(t, &waiter{res: r, since: since}, !queued)
		c.pendLocked(r, true)
	}
	return out, replaced
}

// addWaiterLocked makes w wait: indexed by the Clusters it points at
// (waitsFor), so that a change of one looks at its waiters only
// (wakeLocked), and queued for its MaxWait unless it replaces a waiter
// that is (queued keeps its place: a newer version keeps when the wait
// began). The first wait of the type is told (unsafeLocked).
func (c *Cache) addWaiterLocked(t *typeState, w *waiter, queue bool) {
	if t.waiting == nil {
		t.waiting = make(map[string]*waiter)
	}
	t.waiting[w.res.Name] = w
	c.waits++
	ref := xds.Ref{TypeURL: t.typeURL, Name: w.res.Name}
	for _, r := range w.res.Refs {
		if !waitsFor(r.TypeURL) {
			continue
		}
		if c.waitOn == nil {
			c.waitOn = make(map[string]map[xds.Ref]struct{})
		}
		m := c.waitOn[r.Name]
		if m == nil {
			m = make(map[xds.Ref]struct{}, 1)
			c.waitOn[r.Name] = m
		}
		m[ref] = struct{}{}
	}
	if queue {
		c.waitQ = append(c.waitQ, queuedWait{ref: ref, since: w.since})
		c.unsafeLocked(t, w.res.Name, false, func() []xds.Ref { return c.lackingLocked(w.res, true) })
	}
}

// dropWaiterLocked ends the wait of the resource name, if one waits, and
// returns its waiter.
func (c *Cache) dropWaiterLocked(t *typeState, name string) *waiter {
	w := t.waiting[name]
	if w == nil {
		return nil
	}
	delete(t.waiting, name)
	ref := xds.Ref{TypeURL: t.typeURL, Name: name}
	for _, r := range w.res.Refs {
		if m := c.waitOn[r.Name]; m != nil && waitsFor(r.TypeURL) {
			delete(m, ref)
			if len(m) == 0 {
				delete(c.waitOn, r.Name)
			}
		}
	}
	c.waitEndedLocked()
	return w
}

// waitEndedLocked counts a wait that ended (settleRemovalsLocked lets go
// of what was kept for them once none is left).
func (c *Cache) waitEndedLocked() {
	c.waits--
}

// unsafeLocked tells (OnUnsafeOrder) the first wait of t's type in the
// life of the cache: the refs are what it waits for.
func (c *Cache) unsafeLocked(t *typeState, name string, removal bool, refs func() []xds.Ref) {
	if c.unsafeTold[t.typeURL] {
		return
	}
	if c.unsafeTold == nil {
		c.unsafeTold = make(map[string]bool)
	}
	c.unsafeTold[t.typeURL] = true
	r := refs()
	c.unsafe = append(c.unsafe, UnsafeOrder{TypeURL: t.typeURL, Name: name, Removal: removal, Refs: r[:min(len(r), maxUnsafeRefs):min(len(r), maxUnsafeRefs)]})
}

// wakeLocked notes the waits that a change of name (of t) may end: the
// resources waiting for it if it is a Cluster, or for a Cluster that
// points at it; and its own removal's. settleLocked and
// settleRemovalsLocked look at those (and at the waits whose MaxWait
// passed) only.
func (c *Cache) wakeLocked(t *typeState, name string, e *entry) {
	if c.waits == 0 {
		return
	}
	switch t.typeURL {
	case resourcev3.ClusterType:
		c.wakeWaitersLocked(name)
	case resourcev3.EndpointType:
		for from := range e.from {
			if from.TypeURL == resourcev3.ClusterType {
				c.wakeWaitersLocked(from.Name)
			}
		}
	}
	c.wakeRemovalLocked(t, name)
}

// wakeWaitersLocked notes the resources waiting for the Cluster name.
func (c *Cache) wakeWaitersLocked(name string) {
	for ref := range c.waitOn[name] {
		if c.wokenRes == nil {
			c.wokenRes = make(map[xds.Ref]struct{})
		}
		c.wokenRes[ref] = struct{}{}
	}
}

// wakeRemovalLocked notes the removal of name, if one waits.
func (c *Cache) wakeRemovalLocked(t *typeState, name string) {
	if _, ok := t.removing[name]; !ok {
		return
	}
	if c.wokenRm == nil {
		c.wokenRm = make(map[xds.Ref]struct{})
	}
	c.wokenRm[xds.Ref{TypeURL: t.typeURL, Name: name}] = struct{}{}
}

// lateLocked wakes the waits whose MaxWait has passed by now, oldest
// first, skipping those that ended.
func (c *Cache) lateLocked(now time.Time) {
	i := 0
	for ; i < len(c.waitQ); i++ {
		q := c.waitQ[i]
		if now.Sub(q.since) < c.consistency.MaxWait {
			break
		}
		t := c.types[q.ref.TypeURL]
		if t == nil {
			continue
		}
		switch {
		case q.removal:
			if since, ok := t.removing[q.ref.Name]; ok && since.Equal(q.since) {
				c.wakeRemovalLocked(t, q.ref.Name)
			}
		default:
			if w := t.waiting[q.ref.Name]; w != nil && w.since.Equal(q.since) {
				if c.wokenRes == nil {
					c.wokenRes = make(map[xds.Ref]struct{})
				}
				c.wokenRes[q.ref] = struct{}{}
			}
		}
	}
	c.waitQ = c.waitQ[i:]
}

// unremoveLocked ends the wait of a removal of name, if one waits: upstream
// sent the name again (upserted, or resent with the bytes the cache holds).
func (c *Cache) unremoveLocked(t *typeState, name string) {
	if _, ok := t.removing[name]; ok {
		delete(t.removing, name)
		c.waitEndedLocked()
	}
}

// unpendLocked lets go of what waiters that were replaced pointed at.
func (c *Cache) unpendLocked(replaced []*Resource) {
	for _, r := range replaced {
		c.pendLocked(r, false)
	}
}

// unwaitLocked ends the wait of a resource without applying it.
func (c *Cache) unwaitLocked(t *typeState, name string) {
	if w := c.dropWaiterLocked(t, name); w != nil {
		c.pendLocked(w.res, false)
	}
}

// waitRemovalsLocked takes out of removed the present names that a present
// resource points at: their removal waits (t.removing). A removal of a
// waiting resource ends its wait.
func (c *Cache) waitRemovalsLocked(t *typeState, removed []string, now time.Time) []string {
	if !c.consistency.on() {
		return removed
	}
	out := removed
	copied := false
	for i, n := range removed {
		c.unwaitLocked(t, n)
		e := t.entries[n]
		wait := e != nil && e.res != nil && len(e.from) > 0
		if !wait {
			if copied {
				out = append(out, n)
			}
			continue
		}
		if !copied {
			out = append(make([]string, 0, len(removed)-1), removed[:i]...)
			copied = true
		}
		if _, ok := t.removing[n]; !ok {
			if t.removing == nil {
				t.removing = make(map[string]time.Time)
			}
			t.removing[n] = now
			c.waits++
			c.waitQ = append(c.waitQ, queuedWait{ref: xds.Ref{TypeURL: t.typeURL, Name: n}, removal: true, since: now})
			c.unsafeLocked(t, n, true, func() []xds.Ref { return sortedRefs(e.from) })
		}
	}
	return out
}

// staging is what a type was before an op, for the rollout's gate
// (gateLocked) of what the op changed in it.
type staging struct {
	prev   map[string]released
	state  *State
	synced bool
}

// stageNameLocked records what the group has of name before the op changes
// it, if the rollout is on (stg not nil).
func stageNameLocked(stg map[string]*staging, t *typeState, name string) {
	if stg == nil {
		return
	}
	s := stg[t.typeURL]
	if s == nil {
		s = &staging{prev: map[string]released{}, state: t.state, synced: t.synced}
		stg[t.typeURL] = s
	}
	if _, ok := s.prev[name]; !ok {
		if e := t.entries[name]; e != nil {
			s.prev[name] = released{res: e.res, absent: e.absent}
		}
	}
}

// settleLocked applies the resource waits that are over: resources whose
// Clusters are all present, or whose Consistency.MaxWait has passed. It
// looks only at the waits that changes since the last settle may have
// ended (wakeLocked) and at those past MaxWait (lateLocked): its cost is
// that of what changed, not of what waits. What one applies may end
// others (a Cluster released lets the Route that points at it go): it
// goes on until nothing more is over. The removals wait for a later op
// (settleRemovalsLocked): a removal that this one's changes end reaches
// clients after them. Costs nothing while nothing waits.
func (c *Cache) settleLocked(now time.Time, stg map[string]*staging, o *op) {
	c.lateLocked(now)
	for c.waits > 0 && len(c.wokenRes) > 0 {
		woken := slices.SortedFunc(maps.Keys(c.wokenRes), compareRefs)
		c.wokenRes = nil
		for _, ref := range woken {
			t := c.types[ref.TypeURL]
			w := t.waitingLocked(ref.Name)
			if w == nil {
				continue
			}
			late := now.Sub(w.since) >= c.consistency.MaxWait
			if !late && c.lacksLocked(w.res) {
				continue
			}
			ev := ReferenceEvent{TypeURL: ref.TypeURL, Name: ref.Name, Outcome: WaitResolved, Waited: now.Sub(w.since)}
			if ev.Missing = c.missingRefsLocked(w.res); len(ev.Missing) > 0 {
				// Late, or what it lacks dangles since another's wait ran
				// out: the control plane's word wins.
				ev.Outcome = WaitTimeout
			}
			c.dropWaiterLocked(t, ref.Name)
			if late {
				c.dangleLocked(ev.Missing)
			}
			stageNameLocked(stg, t, ref.Name)
			c.putLocked(t, ref.TypeURL, w.res, o)
			c.pendLocked(w.res, false) // after: what it points at stays in the interest
			o.refs = append(o.refs, ev)
		}
	}
}

// settleDueLocked reports whether a wait may be over: one that the changes
// since the last settle may have ended (wakeLocked), or one past MaxWait.
// Once nothing waits it drops what was kept for the waits. It costs
// nothing while nothing waits.
func (c *Cache) settleDueLocked(now time.Time) bool {
	if c.waits == 0 {
		c.waitQ, c.wokenRes, c.wokenRm = nil, nil, nil
		return false
	}
	return len(c.wokenRes) > 0 || len(c.wokenRm) > 0 || c.lateDueLocked(now)
}

// removalsDueLocked reports whether a removal's wait may be over: one that
// the changes since the last settle may have ended, or one past MaxWait.
func (c *Cache) removalsDueLocked(now time.Time) bool {
	return c.waits > 0 && (len(c.wokenRm) > 0 || c.lateDueLocked(now))
}

// lateDueLocked reports whether the oldest wait queued is past MaxWait (it
// may have ended: lateLocked skips it).
func (c *Cache) lateDueLocked(now time.Time) bool {
	return len(c.waitQ) > 0 && now.Sub(c.waitQ[0].since) >= c.consistency.MaxWait
}

// followLocked applies, in rel, the resource waits that are over
// (settleLocked), after the op that ended them was made and marked
// (publish), gated by the rollout as a change of their own. A Route that
// waited for a Cluster is thus released in an op after the Cluster's,
// which every watch is marked with first (docs/architecture.md, invariant
// 18 "Make before break, whatever the order upstream"). The removals
// follow in an op of their own, once rel is marked (settleRemovalsLocked).
func (c *Cache) followLocked(now time.Time) (rel *op) {
	rel = c.beginLocked()
	var stg map[string]*staging
	if c.rollout.on() {
		stg = map[string]*staging{}
	}
	var staged []*change
	if c.waits > 0 {
		c.settleLocked(now, stg, rel)
		if stg != nil {
			staged = c.gateStagedLocked(stg, rel)
		}
	}
	c.finishLocked(rel)
	c.queueStagedLocked(staged, rel)
	if len(staged) > 0 {
		c.advanceLocked(now, rel)
	}
	return rel
}

// dangleLocked marks the names a wait ran out on as dangling, and notes the
// waits on them (wakeLocked): none waits for them any more.
func (c *Cache) dangleLocked(refs []xds.Ref) {
	for _, ref := range refs {
		t := c.types[ref.TypeURL]
		e := t.entryLocked(ref.Name)
		if e == nil || e.dangling {
			continue
		}
		e.dangling = true
		c.wakeLocked(t, ref.Name, e)
	}
}

// waitingLocked is the waiter of name; t may be nil.
func (t *typeState) waitingLocked(name string) *waiter {
	if t == nil {
		return nil
	}
	return t.waiting[name]
}

// settleRemovalsLocked applies, in an op of their own after the changes
// that ended them, the removals whose wait is over: of names nothing
// present points at any more, or whose Consistency.MaxWait has passed.
// Like settleLocked, it looks only at the removals changes may have ended
// and at those past MaxWait. It returns the op, nil if it applied
// nothing; the caller wakes it and tells its events after the first op's.
func (c *Cache) settleRemovalsLocked(now time.Time) *op {
	if c.waits == 0 {
		c.waitQ, c.wokenRes, c.wokenRm = nil, nil, nil
		return nil
	}
	c.lateLocked(now)
	if len(c.wokenRm) == 0 {
		return nil
	}
	o := c.beginLocked()
	var stg map[string]*staging
	if c.rollout.on() {
		stg = map[string]*staging{}
	}
	done := false
	for c.waits > 0 && len(c.wokenRm) > 0 {
		woken := slices.SortedFunc(maps.Keys(c.wokenRm), compareRefs)
		c.wokenRm = nil
		for _, ref := range woken {
			t := c.types[ref.TypeURL]
			if t == nil {
				continue
			}
			n := ref.Name
			since, ok := t.removing[n]
			if !ok {
				continue
			}
			e := t.entries[n]
			held := e != nil && e.res != nil && len(e.from) > 0
			late := now.Sub(since) >= c.consistency.MaxWait
			if held && !late {
				continue
			}
			delete(t.removing, n)
			c.waitEndedLocked()
			done = true
			if e == nil || e.res == nil {
				continue // gone by other means
			}
			ev := ReferenceEvent{TypeURL: ref.TypeURL, Name: n, Removal: true, Outcome: WaitResolved, Waited: now.Sub(since)}
			if held {
				ev.Outcome, ev.Missing = WaitTimeout, sortedRefs(e.from)
			}
			stageNameLocked(stg, t, n)
			forget := !e.wanted && t.wantWildcard && stg == nil
			c.removeLocked(t, ref.TypeURL, n, forget, o)
			o.refs = append(o.refs, ev)
		}
	}
	if !done {
		return nil
	}
	var staged []*change
	if stg != nil {
		staged = c.gateStagedLocked(stg, o)
	}
	c.finishLocked(o)
	c.queueStagedLocked(staged, o)
	if stg != nil {
		c.advanceLocked(now, o)
	}
	return o
}

// gateStagedLocked gates what the op changed in each staged type
// (gateLocked), before finishLocked; queueStagedLocked queues the changes
// after it.
func (c *Cache) gateStagedLocked(stg map[string]*staging, o *op) []*change {
	var out []*change
	for _, typeURL := range slices.Sorted(maps.Keys(stg)) {
		s := stg[typeURL]
		if ch := c.gateLocked(c.types[typeURL], typeURL, s.prev, s.state, s.synced, o); ch != nil {
			out = append(out, ch)
		}
	}
	return out
}

func (c *Cache) queueStagedLocked(staged []*change, o *op) {
	for _, ch := range staged {
		for typeURL := range ch.types {
			c.canaryMarksLocked(c.types[typeURL], typeURL, ch, o)
		}
		c.queueLocked(ch, o)
	}
}

func sortedRefs(m map[xds.Ref]struct{}) []xds.Ref {
	return slices.SortedFunc(maps.Keys(m), compareRefs)
}

func compareRefs(a, b xds.Ref) int {
	return cmp.Or(strings.Compare(a.TypeURL, b.TypeURL), strings.Compare(a.Name, b.Name))
}

// References lists the names present resources point at that the cache
// lacks, with what points at them, and what waits. It costs what its
// answer costs.
func (c *Cache) References() References {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out References
	for typeURL, t := range c.types {
		for n := range t.missing {
			if e := t.entries[n]; e != nil {
				out.Dangling = append(out.Dangling, Dangling{Ref: xds.Ref{TypeURL: typeURL, Name: n}, From: sortedRefs(e.from)})
			}
		}
		for n, w := range t.waiting {
			out.Waiting = append(out.Waiting, Waiting{Ref: xds.Ref{TypeURL: typeURL, Name: n}, Since: w.since, Missing: c.lackingLocked(w.res, true)})
		}
		for n, since := range t.removing {
			var from []xds.Ref
			if e := t.entries[n]; e != nil {
				from = sortedRefs(e.from)
			}
			out.Waiting = append(out.Waiting, Waiting{Ref: xds.Ref{TypeURL: typeURL, Name: n}, Since: since, Removal: true, Missing: from})
		}
	}
	slices.SortFunc(out.Dangling, func(a, b Dangling) int { return compareRefs(a.Ref, b.Ref) })
	slices.SortFunc(out.Waiting, func(a, b Waiting) int {
		return cmp.Or(compareRefs(a.Ref, b.Ref), cmpBool(a.Removal, b.Removal))
	})
	return out
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// DanglingReferences counts, by the type of the name pointed at, the
// references of present resources to names the cache lacks.
func (c *Cache) DanglingReferences() map[string]int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out map[string]int
	for typeURL, t := range c.types {
		for n := range t.missing {
			if e := t.entries[n]; e != nil && len(e.from) > 0 {
				if out == nil {
					out = make(map[string]int)
				}
				out[typeURL] += len(e.from)
			}
		}
	}
	return out
}

// tellReferences passes the op's reference events on, without the lock.
func (c *Cache) tellReferences(o *op) {
	if c.onUnsafeOrder != nil {
		for _, u := range o.unsafe {
			c.onUnsafeOrder(u)
		}
	}
	if c.onRefused != nil && o.refused.Count > 0 {
		c.onRefused(o.refused)
	}
	if c.onReference == nil {
		return
	}
	for _, ev := range o.refs {
		c.onReference(ev)
	}
}

// takeTellsLocked moves into o what the cache has to tell that is not of
// one op (first waits, refused references), for tellReferences.
func (c *Cache) takeTellsLocked(o *op) {
	o.unsafe, c.unsafe = c.unsafe, nil
	o.refused, c.refused = c.refused, RefusedReferences{}
	if o.refused.Count > 0 && !c.refusedTold {
		o.refused.First, c.refusedTold = true, true
	}
}

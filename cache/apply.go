package cache

import (
	"slices"
	"time"
)

// Change is one upstream response for one type, applied whole by Apply.
type Change struct {
	// Upserts replace or add resources; a resource nobody asked for (an
	// unsubscribe in flight) is ignored.
	Upserts []*Resource
	// Removed are names upstream says do not exist (or no longer do).
	Removed []string
	// Resent are names upstream sent again with the bytes the cache
	// holds (a SotW full state re-sends every resource): nothing to
	// store, but a held removal of them ends as if they had been upserted.
	Resent []string
	// Unknown are names taken not to exist on a word that no longer
	// holds: a does-not-exist timer's judgment on a stream that then
	// proved dead (docs/architecture.md, invariant 15 "Silence is not an
	// answer"). Each that is
	// absent becomes neither present nor absent again, still being
	// fetched, and loses its error; clients are told nothing new.
	Unknown []string
	// Heartbeats refresh the TTL of the present version of a resource
	// without changing it ("TTL").
	Heartbeats []*Heartbeat
	// Errors are errors for single resources (gRFC A88), upstream's or the
	// relay's, passed on to the clients that watch them. They are applied
	// after the removals: a name removed with an error keeps the error.
	Errors []*ResourceError
	// Synced is set when the response answers the wildcard subscription: the
	// type's resources are from now on the complete state of the world.
	Synced bool
	// WildcardUnavailable, if set, says why upstream cannot answer the
	// type's wildcard subscription: every server that could is
	// unreachable. It holds while the wildcard is wanted and not answered,
	// until upstream sends anything of the type or can be reached again
	// (WildcardReachable).
	WildcardUnavailable string
	// Received is when the response arrived from upstream; zero for now.
	// The type keeps the latest that changed it (View.Received).
	Received time.Time
	// Trace is the trace of the upstream response, for the spans of the
	// pushes that carry it; zero when not traced. The type keeps the latest
	// that changed it (View.Trace).
	Trace Trace
	// Ahead is set when the upserts go ahead of what points at them, which
	// the source applies next: resource files, which hold every resource
	// there is and give what a resource points at before it
	// (docs/architecture.md, invariant 18 "Make before break, whatever the
	// order upstream"). They are kept though nobody asked for them yet,
	// so that what points at them finds them and waits for nothing; the
	// next sweep drops one that nothing holds by then.
	Ahead bool
}

// Trace identifies a traced upstream response (its span's trace and span
// IDs), so that the pushes carrying it can link to it. The cache only keeps
// it; the zero Trace is none.
type Trace struct {
	TraceID [16]byte
	SpanID  [8]byte
	Sampled bool // the response's span was sampled
}

// Apply applies one upstream response for typeURL under one lock: readers
// see all of it or none of it, and it makes at most one new version of the
// type. Watchers of what changed, and wildcard watchers of the type, are
// marked once the lock is released, before any later change of the cache
// is made (publish). It is one piece because its steps are the release
// step's order under that one lock: the reference waits take out what
// must wait, the rest is applied, the guard holds removals, and the
// rollout gates what changed. What waited for the change (a Route for its
// Cluster) and the removals it ended follow in ops of their own, each
// made once the one before is marked on every watch.
func (c *Cache) Apply(typeURL string, ch Change) {
	c.wakeMu.Lock()
	c.mu.Lock()
	o := c.beginLocked()
	t := c.typeLocked(typeURL)
	rolling := c.rollout.on()
	var stg map[string]*staging
	if rolling {
		stg = map[string]*staging{typeURL: {prev: c.stageLocked(t, ch), state: t.state, synced: t.synced}}
	}
	now := c.now()
	held := len(t.waiting) > 0
	var replaced []*Resource
	ch.Upserts, replaced = c.waitUpsertsLocked(t, ch.Upserts, now)
	if ch.Ahead {
		c.aheadLocked(t, ch.Upserts)
	}
	for _, r := range ch.Upserts {
		c.putLocked(t, typeURL, r, o)
	}
	c.unpendLocked(replaced)
	for _, n := range ch.Resent {
		c.resentLocked(t, typeURL, n, o)
		c.unremoveLocked(t, n)
	}
	for _, n := range c.waitRemovalsLocked(t, c.guardLocked(t, typeURL, ch.Removed, o), now) {
		e := t.entries[n]
		if e == nil || e.absent {
			continue
		}
		// Only the wildcard held it: forget it entirely, once released.
		forget := !e.wanted && e.res != nil && t.wantWildcard && !rolling
		c.removeLocked(t, typeURL, n, forget, o)
	}
	for _, n := range ch.Unknown {
		c.unknowLocked(t, typeURL, n, o)
	}
	c.beatLocked(t, typeURL, ch.Heartbeats, o)
	c.errorsLocked(t, typeURL, ch.Errors, o)
	if ch.Synced && t.wantWildcard && !t.synced {
		t.synced = true
		o.change(t, typeURL)
	}
	if held && len(t.waiting) == 0 && t.synced {
		// The last wait ended with nothing applied (the resource removed,
		// or sent again as it is held): a wildcard's first answer, which
		// waited for it (View.Held), goes now.
		o.change(t, typeURL)
	}
	c.unavailableLocked(t, typeURL, ch, o)
	var staged []*change
	if rolling {
		staged = c.gateStagedLocked(stg, o)
	}
	if c.evictLocked(o) {
		c.signalInterest()
	}
	// The type keeps the receipt (and trace) of the latest response that
	// changed it: not of a heartbeat, nor of an eviction in another type.
	_, changed := o.touched[typeURL]
	c.finishLocked(o)
	c.queueStagedLocked(staged, o)
	if rolling {
		c.advanceLocked(c.now(), o)
	}
	if changed {
		t.received, t.trace = ch.Received, ch.Trace
		if t.received.IsZero() {
			t.received = c.now()
		}
	}
	c.publish(o, now)
}

// publish ends an op made under c.mu and c.wakeMu (Apply, Sweep): it
// releases c.mu and marks the op's watchers; then it applies the waits the
// op ended, the resources (followLocked) and then the removals
// (settleRemovalsLocked), each in an op of its own made once the one
// before is marked on every watch; it releases c.wakeMu and tells the ops'
// events in order. What waited for what an op brought becomes readable
// only once that op's marks are on every watch: a flush that reads a
// released Route finds its Cluster's mark and sends the Cluster first
// (downstream's readOrdered; "Eventual consistency considerations").
func (c *Cache) publish(o *op, now time.Time) {
	due := c.settleDueLocked(now)
	c.mu.Unlock()
	o.markAll()
	var rel, after *op
	if due {
		c.mu.Lock()
		rel = c.followLocked(now)
		due = c.removalsDueLocked(now)
		c.mu.Unlock()
		rel.markAll()
	}
	if due {
		c.mu.Lock()
		after = c.settleRemovalsLocked(now)
		c.mu.Unlock()
		if after != nil {
			after.markAll()
		}
	}
	c.wakeMu.Unlock()
	c.tell(o)
	if rel != nil {
		c.tell(rel)
	}
	if after != nil {
		c.tell(after)
	}
}

// op is one change of the cache, made under its lock: each type it touches
// gets one new version, and the watchers to wake are collected to be woken
// once the lock is released.
type op struct {
	seq     uint64                         // set by finishLocked
	changed map[string][]string            // type → changed names, also for wildcard watchers
	touched map[string]*typeState          // type → its state, to bump once
	names   map[string]map[*Watch][]string // type → watcher → names
	beats   map[string]map[*Watch][]string // type → watcher → heartbeats
	guard   []GuardEvent                   // holds started or ended, told after the lock
	rollout []RolloutEvent                 // rollout steps, told after the lock
	refs    []ReferenceEvent               // reference waits that ended, told after the lock
	unsafe  []UnsafeOrder                  // first waits of a type, told after the lock
	refused RefusedReferences              // references refused at MaxNames, told after the lock
	first   bool                           // a watch marked is woken first (Watch.SetFirst)
}

func (c *Cache) beginLocked() *op { return &op{} }

// change records that names of a type changed (none: the type's state did).
func (o *op) change(t *typeState, typeURL string, names ...string) {
	if o.touched == nil {
		o.touched, o.changed = make(map[string]*typeState), make(map[string][]string)
	}
	o.touched[typeURL] = t
	o.changed[typeURL] = append(o.changed[typeURL], names...)
}

// mark adds names to what w is marked with for a type.
func (o *op) mark(set *map[string]map[*Watch][]string, typeURL string, w *Watch, names ...string) {
	byW := o.byWatch(set, typeURL, 0)
	byW[w] = append(byW[w], names...)
	if w.first {
		o.first = true
	}
}

// markShared marks every watcher in ws with names, a slice they all share:
// clipped, so that a later mark of one of them copies it before appending.
func (o *op) markShared(set *map[string]map[*Watch][]string, typeURL string, ws map[*Watch]struct{}, names []string) {
	if len(ws) == 0 {
		return
	}
	byW := o.byWatch(set, typeURL, len(ws))
	names = slices.Clip(names)
	for w := range ws {
		if prev, ok := byW[w]; ok {
			byW[w] = append(prev, names...)
		} else {
			byW[w] = names
		}
		if w.first {
			o.first = true
		}
	}
}

// byWatch returns the watchers marked for a type in set, made with room for
// hint of them if it is the first.
func (o *op) byWatch(set *map[string]map[*Watch][]string, typeURL string, hint int) map[*Watch][]string {
	if *set == nil {
		*set = make(map[string]map[*Watch][]string)
	}
	byW := (*set)[typeURL]
	if byW == nil {
		byW = make(map[*Watch][]string, hint)
		(*set)[typeURL] = byW
	}
	return byW
}

// markWatchers marks every watcher of e with name. A name watched by many
// streams costs one slice for all of them (a later mark of the same watcher
// copies it before appending, as markShared's do) and a map sized for them.
func (o *op) markWatchers(e *entry, typeURL, name string) {
	byW := o.byWatch(&o.names, typeURL, e.watchers.len())
	one := []string{name}
	for w := range e.watchers.all() {
		if prev, ok := byW[w]; ok {
			byW[w] = append(prev, name)
		} else {
			byW[w] = one
		}
		if w.first {
			o.first = true
		}
	}
}

// finishLocked gives each touched type its one new version, drops its
// shared state, and marks its wildcard watchers with what changed. The
// cache's sequence number (its generation, and the order of changes for
// watchers) moves only if something did.
func (c *Cache) finishLocked(o *op) {
	if len(o.touched) > 0 || len(o.names) > 0 || len(o.beats) > 0 {
		c.seq++
		o.seq = c.seq
	}
	for typeURL, t := range o.touched {
		t.version++
		t.state = nil
		o.markShared(&o.names, typeURL, t.wildcard, o.changed[typeURL])
	}
	c.takeTellsLocked(o)
}

// markAll marks the collected watchers with what changed; called without the
// cache's lock and under wakeMu, so that the marks are on every watch
// before the next op is made (publish). It wakes none: notify does, once
// wakeMu is released too.
func (o *op) markAll() {
	for typeURL, byW := range o.names {
		for w, names := range byW {
			w.record(typeURL, o.seq, false, names)
		}
	}
	for typeURL, byW := range o.beats {
		for w, names := range byW {
			w.record(typeURL, o.seq, true, names)
		}
	}
}

// notify wakes the watchers markAll marked, with no lock of the cache held: a
// watch's OnReady function is a callback (docs/architecture.md, "Locks").
// The watches woken first (Watch.SetFirst) queue their streams' flushes
// before the others'.
func (o *op) notify() {
	if o.first {
		o.notifyWhere(func(w *Watch) bool { return w.first })
		o.notifyWhere(func(w *Watch) bool { return !w.first })
		return
	}
	o.notifyWhere(nil)
}

// notifyWhere wakes the watchers of the op that keep selects, every one if
// keep is nil.
func (o *op) notifyWhere(keep func(*Watch) bool) {
	for _, byW := range o.names {
		for w := range byW {
			if keep == nil || keep(w) {
				w.Wake()
			}
		}
	}
	for _, byW := range o.beats {
		for w := range byW {
			if keep == nil || keep(w) {
				w.Wake()
			}
		}
	}
}

// setLocked sets e's resource, keeping the counts of present resources.
func (c *Cache) setLocked(t *typeState, e *entry, r *Resource) {
	switch {
	case e.res == nil && r != nil:
		c.size++
		t.present++
	case e.res != nil && r == nil:
		c.size--
		t.present--
	}
	old := e.res
	e.res = r
	if r != nil {
		e.dangling = false // it exists: what points at it anew waits as ever
	}
	if c.consistency.on() {
		name := ""
		if r != nil {
			name = r.Name
		} else if old != nil {
			name = old.Name
		}
		c.refsLocked(t, name, old, r)
		t.missingLocked(name, e)
		c.wakeLocked(t, name, e)
	}
}

// putLocked stores r if someone wants it and it differs from what is held.
func (c *Cache) putLocked(t *typeState, typeURL string, r *Resource, o *op) {
	e := t.entries[r.Name]
	if e == nil {
		if !t.wantWildcard && !t.aliasWantedLocked(r) && t.globLocked(r.Name) == nil {
			return // nobody asked for it (an unsubscribe in flight)
		}
		e = t.newEntryLocked(r.Name)
	}
	c.aliasLocked(t, typeURL, r, o)
	c.resentLocked(t, typeURL, r.Name, o)
	if e.res != nil && e.res.Version == r.Version && string(e.res.Wire) == string(r.Wire) {
		return
	}
	c.setLocked(t, e, r)
	e.absent, e.hb, e.err = false, nil, nil
	t.expireAt(r.Name, e, r.TTL, c.now)
	o.change(t, typeURL, r.Name)
	o.markWatchers(e, typeURL, r.Name)
	o.markGlob(t, typeURL, r.Name)
}

// aliasLocked records r's aliases ("Resource names": VHDS resources may be
// known by an alias; who watches the alias watches the resource) and marks
// those who watch them.
func (c *Cache) aliasLocked(t *typeState, typeURL string, r *Resource, o *op) {
	for _, a := range r.Aliases {
		if t.aliases == nil {
			t.aliases = make(map[string]string)
		}
		if t.aliases[a] != r.Name {
			t.aliases[a] = r.Name
			t.recheck = true
		}
		if ae := t.entries[a]; ae != nil && a != r.Name {
			o.markWatchers(ae, typeURL, a)
		}
	}
}

// aheadLocked makes entries for the upserts of a change that goes ahead
// of what points at them (Change.Ahead), which nobody asked for yet: the
// next sweep looks at them (recheck) and drops one nothing holds.
func (c *Cache) aheadLocked(t *typeState, upserts []*Resource) {
	for _, r := range upserts {
		if t.entries[r.Name] == nil {
			t.newEntryLocked(r.Name)
			t.recheck = true
		}
	}
}

// removeLocked is the one way a resource goes: removed upstream, expired,
// evicted or swept. It drops the resource with its heartbeat, error and
// aliases, and marks who watched it or an alias. The entry stays, marked
// absent, unless forget.
func (c *Cache) removeLocked(t *typeState, typeURL, name string, forget bool, o *op) {
	e := t.entries[name]
	if e == nil {
		return
	}
	visible := e.res != nil || (!forget && !e.absent)
	kept := forget && e.referenced() // something points at it: fetched still
	if kept {
		forget = false
	}
	c.resentLocked(t, typeURL, name, o) // nothing left to remove
	c.setLocked(t, e, nil)
	e.hb, e.err = nil, nil
	t.expireAt(name, e, 0, nil)
	for a, target := range t.aliases {
		if target != name {
			continue
		}
		delete(t.aliases, a)
		t.recheck = true
		if ae := t.entries[a]; ae != nil {
			o.markWatchers(ae, typeURL, a)
		}
	}
	if forget && e.rel != nil {
		e.rel = nil // gone for everyone
		t.held--
		t.relState = nil
	}
	if forget {
		t.deleteEntryLocked(name)
		c.idle.Remove(idleKey{typeURL: typeURL, name: name})
	} else {
		e.absent = !kept
	}
	c.wakeLocked(t, name, e) // absent: what waited for it need not
	if visible {
		o.change(t, typeURL, name)
		o.markWatchers(e, typeURL, name)
		o.markGlob(t, typeURL, name)
	}
}

// unknowLocked withdraws the judgment that name does not exist (see
// Change.Unknown).
func (c *Cache) unknowLocked(t *typeState, typeURL, name string, o *op) {
	e := t.entries[name]
	if e == nil || e.res != nil || !e.absent {
		return
	}
	e.absent, e.err = false, nil
	o.change(t, typeURL, name)
	o.markWatchers(e, typeURL, name)
}

// beatLocked applies heartbeats: each refreshes the TTL of the resource it
// names if that is still the present version ("TTL": a heartbeat is not an
// update), and marks the resource's watchers so that they can pass it on.
func (c *Cache) beatLocked(t *typeState, typeURL string, hbs []*Heartbeat, o *op) {
	var beaten []string
	for _, hb := range hbs {
		e := t.entries[hb.Name]
		if e == nil || e.res == nil || e.res.Version != hb.Version {
			continue
		}
		e.hb = hb
		t.expireAt(hb.Name, e, hb.TTL, c.now)
		beaten = append(beaten, hb.Name)
		for w := range e.watchers.all() {
			o.mark(&o.beats, typeURL, w, hb.Name)
		}
	}
	if len(beaten) > 0 {
		o.markShared(&o.beats, typeURL, t.wildcard, beaten)
	}
}

// errorsLocked records per-resource errors, so that they are passed on to
// the watchers of those names.
func (c *Cache) errorsLocked(t *typeState, typeURL string, errs []*ResourceError, o *op) {
	for _, re := range errs {
		e := t.entries[re.Name]
		if e == nil {
			continue // nobody here asked for it
		}
		e.err = re
		o.change(t, typeURL, re.Name)
		o.markWatchers(e, typeURL, re.Name)
	}
}

// evictLocked drops the least recently used things nobody watches until the
// cache is within its bound. It reports whether the interest changed.
func (c *Cache) evictLocked(o *op) bool {
	changed := false
	for c.max > 0 && c.size > c.max {
		k, _, ok := c.idle.RemoveOldest()
		if !ok {
			break // everything left is watched
		}
		t := c.types[k.typeURL]
		if t == nil {
			continue
		}
		if k.wildcard {
			c.dropWildcardLocked(t, k.typeURL, o)
			for n, e := range t.entries {
				if !e.wanted && e.watchers.len() == 0 && !e.referenced() {
					c.removeLocked(t, k.typeURL, n, true, o)
				}
			}
		} else if e := t.entries[k.name]; e != nil && e.watchers.len() == 0 {
			c.wantLocked(e, false)
			c.noteLocked(k.typeURL, k.name, false)
			if !t.wantWildcard || e.res == nil {
				c.removeLocked(t, k.typeURL, k.name, true, o)
			}
		}
		c.evictions++
		changed = true
	}
	return changed
}

// unavailableLocked keeps the type's Change.WildcardUnavailable: set, and
// its wildcard watchers marked, while the wildcard is wanted and not
// answered; cleared by anything upstream sends of the type.
func (c *Cache) unavailableLocked(t *typeState, typeURL string, ch Change, o *op) {
	switch {
	case ch.WildcardUnavailable != "":
		if t.wantWildcard && !t.synced && t.unavailable == "" {
			t.unavailable = ch.WildcardUnavailable
			o.change(t, typeURL)
		}
	case t.synced || len(ch.Upserts) > 0 || len(ch.Removed) > 0:
		t.unavailable = ""
	}
}

// WildcardReachable clears what Change.WildcardUnavailable said of
// typeURL: upstream can be reached again, and may answer the wildcard.
func (c *Cache) WildcardReachable(typeURL string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.types[typeURL]; t != nil {
		t.unavailable = ""
	}
}

// WildcardUnavailable is why upstream cannot answer the wildcard
// subscription of typeURL, which it has not answered (see
// Change.WildcardUnavailable); "" if it may yet.
func (c *Cache) WildcardUnavailable(typeURL string) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if t := c.types[typeURL]; t != nil && !t.synced {
		return t.unavailable
	}
	return ""
}

// dropWildcardLocked ends the wildcard's part in the interest: the type's
// resources are no longer known to be the complete state.
func (c *Cache) dropWildcardLocked(t *typeState, typeURL string, o *op) {
	t.wantWildcard, t.synced, t.unavailable = false, false, ""
	c.noteLocked(typeURL, "*", false)
	c.idle.Remove(idleKey{typeURL: typeURL, wildcard: true})
	o.change(t, typeURL)
}

// aliasWantedLocked reports whether someone wants r by one of its aliases.
func (t *typeState) aliasWantedLocked(r *Resource) bool {
	for _, a := range r.Aliases {
		if e := t.entries[a]; e != nil && e.wanted {
			return true
		}
	}
	return false
}

// Sweep removes resources whose TTL ran out, and ends the retention of
// names and wildcards nobody has watched for the retention period, dropping
// their resources. It reports whether the cache is now empty of interest
// (nothing watched, nothing retained). It costs in proportion to what is
// due, not to what is cached: it looks only at resources with a TTL and
// at the oldest of what nobody watches.
func (c *Cache) Sweep() (empty bool) {
	c.wakeMu.Lock()
	c.mu.Lock()
	o := c.beginLocked()
	now := c.now()
	changed := c.retireLocked(now, o)
	empty = true
	if len(c.changes) > 0 {
		c.advanceLocked(now, o) // changes whose bake time passed
	}
	for typeURL, t := range c.types {
		c.expireLocked(t, typeURL, now, o)
		c.expireHoldLocked(t, typeURL, now, o)
		if t.recheck {
			t.recheck = false
			for n := range t.entries {
				c.dropIfUnheldLocked(t, typeURL, n, o)
			}
		}
		if t.heldLocked() {
			empty = false
		} else if len(t.wildcard) == 0 {
			delete(c.types, typeURL)
		}
	}
	if changed {
		c.signalInterest()
	}
	c.finishLocked(o)
	c.publish(o, now) // and the waits whose MaxWait passed
	return empty
}

// expireAt sets when e's resource expires, ttl from now (never if ttl is
// zero), keeping the type's set of names with a TTL.
func (t *typeState) expireAt(name string, e *entry, ttl time.Duration, now func() time.Time) {
	if ttl <= 0 {
		e.expires = time.Time{}
		delete(t.ttl, name)
		return
	}
	e.expires = now().Add(ttl)
	if t.ttl == nil {
		t.ttl = make(map[string]struct{})
	}
	t.ttl[name] = struct{}{}
}

// expireLocked removes the resources whose TTL ran out without a heartbeat,
// as if upstream had removed them ("TTL").
func (c *Cache) expireLocked(t *typeState, typeURL string, now time.Time, o *op) {
	for n := range t.ttl {
		if e := t.entries[n]; e == nil || e.res == nil || e.expires.IsZero() {
			delete(t.ttl, n)
		} else if now.After(e.expires) {
			c.removeLocked(t, typeURL, n, false, o)
		}
	}
}

// retireLocked ends the retention periods that ran out, oldest first, and
// drops what nobody wants any more. What nobody watches is in c.idle in the
// order its last watcher left, so it stops at the first that is not due.
// It reports whether the interest changed.
func (c *Cache) retireLocked(now time.Time, o *op) (changed bool) {
	for {
		k, _, ok := c.idle.GetOldest()
		if !ok {
			return changed
		}
		t := c.types[k.typeURL]
		if k.wildcard {
			if t == nil || !t.wantWildcard || len(t.wildcard) > 0 {
				c.idle.Remove(k) // watched again or dropped: nothing to retire
				continue
			}
			if now.Sub(t.wildcardIdle) < c.retention {
				return changed
			}
			c.dropWildcardLocked(t, k.typeURL, o)
			for n := range t.entries {
				c.dropIfUnheldLocked(t, k.typeURL, n, o)
			}
			changed = true
			continue
		}
		var e *entry
		if t != nil {
			e = t.entries[k.name]
		}
		if e == nil || !e.wanted || e.watchers.len() > 0 {
			c.idle.Remove(k)
			continue
		}
		if now.Sub(e.idle) < c.retention {
			return changed
		}
		c.wantLocked(e, false)
		c.noteLocked(k.typeURL, k.name, false)
		c.idle.Remove(k)
		changed = true
		c.dropIfUnheldLocked(t, k.typeURL, k.name, o)
		if target, ok := t.aliases[k.name]; ok {
			c.dropIfUnheldLocked(t, k.typeURL, target, o)
		}
	}
}

// dropIfUnheldLocked removes the entry name if nothing holds it any more:
// no client wants or watches it, by its name or an alias, and no wildcard.
func (c *Cache) dropIfUnheldLocked(t *typeState, typeURL, name string, o *op) {
	e := t.entries[name]
	if e != nil && !e.wanted && e.watchers.len() == 0 && !e.referenced() && !t.wantWildcard && (e.res == nil || !t.aliasWantedLocked(e.res)) &&
		t.globLocked(name) == nil {
		was := c.dropping
		c.dropping = true
		c.removeLocked(t, typeURL, name, true, o)
		c.dropping = was
		if was {
			return // the outermost drop takes the orphans
		}
		for len(c.orphans) > 0 {
			ref := c.orphans[len(c.orphans)-1]
			c.orphans = c.orphans[:len(c.orphans)-1]
			if tt := c.types[ref.TypeURL]; tt != nil {
				c.dropIfUnheldLocked(tt, ref.TypeURL, ref.Name, o)
			}
		}
	}
}

package cache

import (
	"maps"
	"math"
	"slices"
	"time"
)

// Rollout is the NACK-gated canary rollout (docs/architecture.md,
// invariant 12 "Released, not just received"). A change from upstream (one
// Apply) that
// alters what a type's watchers watch goes first to that type's canary
// watches: the Canary lowest-ranked ones (Watch.SetRank), at least one.
// Every other watch keeps reading the released version until the canaries
// that were sent the change ACK it (Verdict), or Bake passes without a
// NACK. A canary's NACK holds the change: it is never released, and later
// changes of the same resources wait behind it, until upstream changes
// those resources again (the new change supersedes the held one for them).
// Changes are released in the order they came. The zero Rollout is off.
type Rollout struct {
	// Canary is a fraction of each type's watches (below 1), or a count
	// (1 or more); 0 turns the rollout off.
	Canary float64
	Bake   time.Duration
}

func (r Rollout) on() bool { return r.Canary > 0 }

// RollingOut reports whether the cache rolls changes out to canaries first.
func (c *Cache) RollingOut() bool { return c.rollout.on() }

// count is how many of n watches are canaries.
func (r Rollout) count(n int) int {
	if n == 0 {
		return 0
	}
	k := int(r.Canary)
	if r.Canary < 1 {
		k = int(math.Ceil(r.Canary * float64(n)))
	}
	return max(1, min(k, n))
}

// Kinds of RolloutEvent.
const (
	RolloutCanary     = "canary"     // a change went to the canaries
	RolloutReleased   = "released"   // a change went to the whole group
	RolloutHalted     = "halted"     // a canary NACKed a change: held
	RolloutSuperseded = "superseded" // a newer change replaced a held one's resources
)

// RolloutEvent is a rollout step, as told to Options.OnRollout.
type RolloutEvent struct {
	Kind     string
	Types    []string // the type URLs of the change
	Names    int      // resources it changes
	Canaries int      // canaries it was sent to
	// Baked is set on a release that came with the bake time, not every
	// canary's ACK (none was sent the change, or some did not answer).
	Baked bool
	// Released is set on the release of a held change an operator
	// released (ReleaseHeld).
	Released bool
	// Who and Detail are, on a halt, the canary that NACKed (Watch.SetRank's
	// label) and its error detail.
	Who, Detail string
}

// RolloutState is a change waiting for release, as the admin endpoints
// show it.
type RolloutState struct {
	Since    time.Time
	Types    []string
	Names    int
	Canaries int    // canaries sent it
	Acked    int    // of those, how many ACKed it
	Held     bool   // a canary NACKed it
	Who      string // the canary that NACKed
	Detail   string // its error detail
}

// released is what the group (all but the canaries) has of a name while a
// change of it is pending: Cache.mu guards it.
type released struct {
	res    *Resource
	absent bool
}

// change is one upstream change waiting for release. Guarded by Cache.mu.
type change struct {
	at      time.Time
	types   map[string]*changeType
	held    bool
	who     string
	detail  string
	noticed bool // its halt was told
	forced  bool // an operator released it while held (ReleaseHeld)
}

type changeType struct {
	version  uint64              // the type's version once the change was applied
	vals     map[string]released // what the change made of each name
	canaries map[*Watch]bool     // canaries sent it → whether they ACKed it
	watched  bool                // someone watches what it changed
	withheld []*Watch            // the other watches it would have marked: behind until it is released (clients.go)
}

func (ch *change) names() int {
	n := 0
	for _, ct := range ch.types {
		n += len(ct.vals)
	}
	return n
}

func (ch *change) event(kind string) RolloutEvent {
	ev := RolloutEvent{Kind: kind, Types: slices.Sorted(maps.Keys(ch.types)), Names: ch.names(), Who: ch.who, Detail: ch.detail}
	for _, ct := range ch.types {
		ev.Canaries += len(ct.canaries)
	}
	return ev
}

// stageLocked records, before a change is applied, what the group has of
// each name it may change: the released version, while the change bakes.
func (c *Cache) stageLocked(t *typeState, ch Change) map[string]released {
	prev := make(map[string]released, len(ch.Upserts)+len(ch.Removed))
	for _, names := range [][]string{ch.Removed, upsertNames(ch.Upserts)} {
		for _, n := range names {
			if e := t.entries[n]; e != nil {
				prev[n] = released{res: e.res, absent: e.absent}
			}
		}
	}
	return prev
}

func upsertNames(rs []*Resource) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
}

// gateLocked makes an applied change wait for release: the names it
// changed keep their released version for all but the canaries, and only
// the canaries among the marked watchers stay marked. Called before
// finishLocked, with what the type was before the change.
//
// A name the group never had (neither a resource nor known not to exist)
// is its first configuration, not a change of it: it is not held, unless
// the type's complete state was known (wasSynced), in which case a new
// resource is a change of that state.
func (c *Cache) gateLocked(t *typeState, typeURL string, prev map[string]released, prevState *State, wasSynced bool, o *op) *change {
	names := o.changed[typeURL]
	if len(names) == 0 {
		return nil
	}
	ct := &changeType{version: t.version + 1, vals: map[string]released{}, canaries: map[*Watch]bool{}}
	for _, n := range names {
		e := t.entries[n]
		if e == nil {
			continue
		}
		r := prev[n] // the zero released (not there) for a name new to the cache
		if e.rel == nil && r == (released{}) && !wasSynced {
			continue // first configuration
		}
		if t.held == 0 {
			// From now on the group reads the type as it was until now.
			t.relVersion, t.relState = t.version, prevState
		}
		if e.rel == nil {
			e.rel = &r
			t.held++
		}
		ct.vals[n] = released{res: e.res, absent: e.absent}
	}
	if len(ct.vals) == 0 {
		return nil
	}
	return &change{at: c.now(), types: map[string]*changeType{typeURL: ct}}
}

// canaryMarksLocked keeps, of the watchers an applied change marked, only
// the canaries, and records them as sent the change. Called after
// finishLocked (which marks the wildcard watchers).
func (c *Cache) canaryMarksLocked(t *typeState, typeURL string, ch *change, o *op) {
	ct := ch.types[typeURL]
	byW := o.names[typeURL]
	for w := range byW {
		ct.watched = true
		if _, canary := t.canaries[w]; canary {
			ct.canaries[w] = false
		} else {
			delete(byW, w)
			ct.withheld = append(ct.withheld, w)
		}
	}
	c.heldLocked(typeURL, ct.withheld, 1)
}

// queueLocked queues an applied change behind the others, superseding, in
// the held ones, the resources it changes again.
func (c *Cache) queueLocked(ch *change, o *op) {
	kept := c.changes[:0]
	for _, h := range c.changes {
		if h.held {
			superseded := false
			for typeURL, ct := range ch.types {
				if ht := h.types[typeURL]; ht != nil {
					for n := range ct.vals {
						if _, ok := ht.vals[n]; ok {
							delete(ht.vals, n)
							superseded = true
						}
					}
					if len(ht.vals) == 0 {
						delete(h.types, typeURL)
						c.heldLocked(typeURL, ht.withheld, -1)
					}
				}
			}
			if superseded {
				o.rollout = append(o.rollout, h.event(RolloutSuperseded))
			}
			if len(h.types) == 0 {
				continue
			}
		}
		kept = append(kept, h)
	}
	clear(c.changes[len(kept):])
	c.changes = append(kept, ch)
	o.rollout = append(o.rollout, ch.event(RolloutCanary))
}

// advanceLocked releases, in order, the changes that are ready: not held,
// not changing what a held change waits on, and ACKed by every canary sent
// them or baked. A change that is not ready stops the release of later
// ones, so that the group sees the changes in the order they came.
func (c *Cache) advanceLocked(now time.Time, o *op) {
	blocked := map[[2]string]bool{} // names a held change waits on
	kept := c.changes[:0]
	stopped := false
	for _, ch := range c.changes {
		switch {
		case stopped:
		case ch.held || ch.overlaps(blocked):
			for typeURL, ct := range ch.types {
				for n := range ct.vals {
					blocked[[2]string{typeURL, n}] = true
				}
			}
			if ch.held && !ch.noticed {
				ch.noticed = true
				o.rollout = append(o.rollout, ch.event(RolloutHalted))
			}
		default:
			ready, baked := ch.ready(now, c.rollout.Bake)
			if !ready {
				stopped = true
				break
			}
			c.releaseLocked(ch, o)
			ev := ch.event(RolloutReleased)
			ev.Baked, ev.Released = baked && !ch.forced, ch.forced
			o.rollout = append(o.rollout, ev)
			continue
		}
		kept = append(kept, ch)
	}
	clear(c.changes[len(kept):])
	c.changes = kept
}

func (ch *change) overlaps(names map[[2]string]bool) bool {
	if len(names) == 0 {
		return false
	}
	for typeURL, ct := range ch.types {
		for n := range ct.vals {
			if names[[2]string{typeURL, n}] {
				return true
			}
		}
	}
	return false
}

// ready reports whether a change may be released: every type it changed
// is unwatched, or ACKed by every canary sent it, or baked. baked is set
// when the bake time decided.
func (ch *change) ready(now time.Time, bake time.Duration) (ready, baked bool) {
	if ch.forced {
		return true, false
	}
	done := now.Sub(ch.at) >= bake
	for _, ct := range ch.types {
		if !ct.watched {
			continue
		}
		acked := len(ct.canaries) > 0
		for _, ok := range ct.canaries {
			acked = acked && ok
		}
		if !acked {
			if !done {
				return false, false
			}
			baked = true
		}
	}
	return true, baked
}

// releaseLocked gives the whole group a change: the names it changed read
// as the change made them (or as the candidate, when no later change is
// pending on them), and their watchers are marked.
func (c *Cache) releaseLocked(ch *change, o *op) {
	for typeURL, ct := range ch.types {
		t := c.types[typeURL]
		if t == nil {
			c.heldLocked(typeURL, ct.withheld, -1)
			continue
		}
		names := make([]string, 0, len(ct.vals))
		for n, v := range ct.vals {
			e := t.entries[n]
			if e == nil || e.rel == nil {
				continue
			}
			if c.pendingLater(ch, typeURL, n) {
				*e.rel = v
			} else {
				e.rel = nil
				t.held--
			}
			names = append(names, n)
			o.markWatchers(e, typeURL, n)
		}
		t.relVersion, t.relState = ct.version, nil
		if t.held == 0 {
			t.relVersion = t.version
		}
		o.markShared(&o.names, typeURL, t.wildcard, names)
		c.unheldLocked(typeURL, ct.withheld, o.names[typeURL])
		for _, n := range names {
			// A removal of what only the wildcard held was kept while it
			// baked: it is forgotten now.
			if e := t.entries[n]; e != nil && e.res == nil && !e.wanted && e.watchers.len() == 0 && e.rel == nil {
				c.removeLocked(t, typeURL, n, true, o)
			}
		}
	}
}

// pendingLater reports whether a change after ch changes name of typeURL.
func (c *Cache) pendingLater(ch *change, typeURL, name string) bool {
	after := false
	for _, x := range c.changes {
		if x == ch {
			after = true
			continue
		}
		if after {
			if ct := x.types[typeURL]; ct != nil {
				if _, ok := ct.vals[name]; ok {
					return true
				}
			}
		}
	}
	return false
}

// Verdict records a watch's answer to what it was sent of typeURL up to
// version (View.Version, State.Version): an ACK, or a NACK with the
// client's error detail. who names the client in the rollout's events. A
// canary's NACK holds the changes it was sent; its ACKs count towards
// their release.
func (c *Cache) Verdict(w *Watch, typeURL string, version uint64, nack bool, who, detail string) {
	if !c.rollout.on() {
		return
	}
	c.wakeMu.Lock()
	c.mu.Lock()
	o := c.beginLocked()
	for _, ch := range c.changes {
		ct := ch.types[typeURL]
		if ct == nil || ct.version > version {
			continue
		}
		acked, sent := ct.canaries[w]
		if !sent || acked {
			continue
		}
		if nack {
			if !ch.held {
				ch.held, ch.who, ch.detail = true, who, detail
			}
		} else {
			ct.canaries[w] = true
		}
	}
	c.advanceLocked(c.now(), o)
	c.finishLocked(o)
	c.mu.Unlock()
	o.markAll()
	c.wakeMu.Unlock()
	c.tell(o)
}

// Rollouts lists the changes waiting for release, oldest first.
func (c *Cache) Rollouts() []RolloutState {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]RolloutState, 0, len(c.changes))
	for _, ch := range c.changes {
		out = append(out, ch.state())
	}
	return out
}

func (ch *change) state() RolloutState {
	s := RolloutState{Since: ch.at, Types: slices.Sorted(maps.Keys(ch.types)), Names: ch.names(),
		Held: ch.held, Who: ch.who, Detail: ch.detail}
	for _, ct := range ch.types {
		for _, ok := range ct.canaries {
			s.Canaries++
			if ok {
				s.Acked++
			}
		}
	}
	return s
}

// ReleaseHeld releases the held changes (those a canary NACKed) that change
// typeURL, or every held change if typeURL is empty: an operator's word
// overrides the canary's NACK, and the group gets them. They are released
// in order, as any change: at once, unless an earlier change still waits
// for its canaries (then as soon as it is released). It returns the
// changes it released from hold, as they were.
func (c *Cache) ReleaseHeld(typeURL string) []RolloutState {
	c.wakeMu.Lock()
	c.mu.Lock()
	o := c.beginLocked()
	var out []RolloutState
	for _, ch := range c.changes {
		if !ch.held || (typeURL != "" && ch.types[typeURL] == nil) {
			continue
		}
		out = append(out, ch.state())
		ch.held, ch.forced = false, true
	}
	c.advanceLocked(c.now(), o)
	c.finishLocked(o)
	c.mu.Unlock()
	o.markAll()
	c.wakeMu.Unlock()
	c.tell(o)
	return out
}

// trackLocked keeps the type's watches and canaries as w's registration
// for the type changes. Only with the rollout on.
func (c *Cache) trackLocked(t *typeState, typeURL string, w *Watch) {
	if !c.rollout.on() {
		return
	}
	in := w.regs.get(typeURL).in()
	_, was := t.watches[w]
	switch {
	case in && !was:
		if t.watches == nil {
			t.watches = map[*Watch]struct{}{}
		}
		t.watches[w] = struct{}{}
		if len(t.canaries) < c.rollout.count(len(t.watches)) || w.rank < t.maxCanary {
			t.pickCanaries(c.rollout)
		}
	case !in && was:
		delete(t.watches, w)
		_, canary := t.canaries[w]
		if canary || len(t.canaries) != c.rollout.count(len(t.watches)) {
			t.pickCanaries(c.rollout)
		}
		for _, ch := range c.changes {
			if ct := ch.types[typeURL]; ct != nil {
				delete(ct.canaries, w) // gone: its answer is not waited for
			}
		}
	}
}

// pickCanaries makes the lowest-ranked watches of the type its canaries:
// stable as long as the same nodes watch it, whatever their streams.
func (t *typeState) pickCanaries(r Rollout) {
	ws := slices.Collect(maps.Keys(t.watches))
	slices.SortFunc(ws, func(a, b *Watch) int {
		switch {
		case a.rank < b.rank:
			return -1
		case a.rank > b.rank:
			return 1
		}
		return 0
	})
	ws = ws[:r.count(len(ws))]
	t.canaries = make(map[*Watch]struct{}, len(ws))
	t.maxCanary = 0
	for _, w := range ws {
		t.canaries[w] = struct{}{}
		t.maxCanary = max(t.maxCanary, w.rank)
	}
}

// canaryLocked reports whether w reads the candidate of the type (it is a
// canary) rather than the released version.
func (t *typeState) canaryLocked(w *Watch) bool {
	if w == nil {
		return false
	}
	_, ok := t.canaries[w]
	return ok
}

// releasedView reports whether a read by w sees something else than the
// candidate: a change of the type is pending and w is no canary.
func (t *typeState) releasedView(w *Watch) bool {
	return t != nil && t.held > 0 && !t.canaryLocked(w)
}

// tell wakes the watchers the op marked and passes its guard and rollout
// events on, with no lock of the cache held.
func (c *Cache) tell(o *op) {
	o.notify()
	c.tellGuard(o)
	c.tellReferences(o)
	if c.onRollout == nil {
		return
	}
	for _, ev := range o.rollout {
		c.onRollout(ev)
	}
}

package cache

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// Guard is the mass-removal guard (docs/architecture.md, invariant 12
// "Released, not just received"): when upstream removes, within Window,
// more than
// MaxRemovedFraction of a type's resources and the type held at least
// MinResources, those removals are held: clients keep the resources, while
// additions and changes still flow. A removal of every resource of a type,
// at any size, is held for WipeHold: a control plane that read its input
// mid-write and briefly saw nothing sends the resources again within it.
// The zero Guard is off.
type Guard struct {
	MaxRemovedFraction float64       // 0: off
	MinResources       int           // a type with fewer is never held
	Window             time.Duration // how far back removals add up
	// Hold is how long a hold lasts before its removals are applied; 0
	// holds until released.
	Hold time.Duration
	// WipeHold is how long the removal of every resource of a type is
	// held when the rest of the guard lets it through; 0: not held.
	WipeHold time.Duration
}

func (g Guard) on() bool { return g.MaxRemovedFraction > 0 }

// Why a hold ends.
const (
	EndReleased = "released" // an operator released it
	EndResent   = "resent"   // upstream sent every held resource again
	EndExpired  = "expired"  // Guard.Hold passed
)

// GuardEvent is a hold starting (End empty) or ending, as told to
// Options.OnGuard.
type GuardEvent struct {
	TypeURL string
	Held    int      // names held when it started, or still held when it ended
	First   string   // one of them, for the log
	Removed int      // removals within the window that set it off (start)
	Base    int      // resources of the type before them (start)
	End     string   // EndReleased, EndResent or EndExpired; empty at start
	Applied []string // the names whose removal was applied at the end
	Wipe    bool     // a wipe's short hold (Guard.WipeHold), not a mass removal's
}

// Hold is a type's held removals, as the admin endpoints show them.
type Hold struct {
	TypeURL string
	Since   time.Time
	Names   []string // sorted
	Wipe    bool     // a wipe's short hold (Guard.WipeHold)
}

// hold is a type's held removals. Guarded by Cache.mu.
type hold struct {
	since time.Time
	names map[string]struct{}
	wipe  bool // held for Guard.WipeHold, not Guard.Hold
}

// removal is upstream's removal of count present resources at a time.
type removal struct {
	at    time.Time
	count int
}

// guardLocked splits the present resources upstream removes into those to
// remove now and those to hold, starting a hold when the removals in the
// window pass the guard's fraction.
func (c *Cache) guardLocked(t *typeState, typeURL string, removed []string, o *op) []string {
	if !c.guard.on() && c.guard.WipeHold <= 0 {
		return removed
	}
	var present []string
	for _, n := range removed {
		if e := t.entries[n]; e != nil && e.res != nil {
			present = append(present, n)
		}
	}
	if len(present) == 0 {
		return removed // names not present (not found, unroutable) are never held
	}
	if t.hold == nil {
		ev, held := c.startHoldLocked(t, typeURL, c.now(), present)
		if !held {
			return removed
		}
		o.guard = append(o.guard, ev)
	}
	for _, n := range present {
		t.hold.names[n] = struct{}{}
	}
	return slices.DeleteFunc(removed, func(n string) bool { _, held := t.hold.names[n]; return held })
}

// startHoldLocked starts a hold for the removal of present, if the guard
// holds it: a mass removal (more than MaxRemovedFraction of a type of at
// least MinResources within Window), else a wipe (every present resource
// of the type, at any size) for WipeHold. A removal it lets through adds
// to the window.
func (c *Cache) startHoldLocked(t *typeState, typeURL string, now time.Time, present []string) (GuardEvent, bool) {
	ev := GuardEvent{TypeURL: typeURL, Held: len(present), First: present[0]}
	if c.guard.on() {
		inWindow := t.windowLocked(now, c.guard.Window)
		ev.Removed, ev.Base = inWindow+len(present), t.present+inWindow
		if ev.Base >= c.guard.MinResources && float64(ev.Removed) > c.guard.MaxRemovedFraction*float64(ev.Base) {
			t.hold = &hold{since: now, names: map[string]struct{}{}}
			return ev, true
		}
	}
	if c.guard.WipeHold > 0 && len(present) == t.present {
		t.hold = &hold{since: now, names: map[string]struct{}{}, wipe: true}
		ev.Removed, ev.Base, ev.Wipe = len(present), t.present, true
		return ev, true
	}
	if c.guard.on() {
		t.removals = append(t.removals, removal{at: now, count: len(present)})
	}
	return GuardEvent{}, false
}

// windowLocked drops the removals older than window and counts the rest.
func (t *typeState) windowLocked(now time.Time, window time.Duration) int {
	i := 0
	for i < len(t.removals) && now.Sub(t.removals[i].at) > window {
		i++
	}
	t.removals = t.removals[i:]
	n := 0
	for _, r := range t.removals {
		n += r.count
	}
	return n
}

// resentLocked lets go of a held name that upstream sent again (or that
// went by other means), ending the hold once nothing is held.
func (c *Cache) resentLocked(t *typeState, typeURL, name string, o *op) {
	if t.hold == nil {
		return
	}
	if _, held := t.hold.names[name]; !held {
		return
	}
	delete(t.hold.names, name)
	if len(t.hold.names) == 0 {
		wipe := t.hold.wipe
		t.hold = nil
		o.guard = append(o.guard, GuardEvent{TypeURL: typeURL, End: EndResent, Wipe: wipe})
	}
}

// endHoldLocked applies a hold's removals and ends it.
func (c *Cache) endHoldLocked(t *typeState, typeURL, why string, o *op) {
	h := t.hold
	t.hold = nil
	names := slices.Sorted(maps.Keys(h.names))
	ev := GuardEvent{TypeURL: typeURL, Held: len(names), End: why, Wipe: h.wipe}
	for _, n := range names {
		e := t.entries[n]
		if e == nil || e.res == nil {
			continue
		}
		forget := !e.wanted && t.wantWildcard
		c.removeLocked(t, typeURL, n, forget, o)
		ev.Applied = append(ev.Applied, n)
	}
	if len(names) > 0 {
		ev.First = names[0]
	}
	o.guard = append(o.guard, ev)
}

// ReleaseHolds ends the holds of typeURL (every type if empty), applying their
// removals now; it returns the holds it ended.
func (c *Cache) ReleaseHolds(typeURL string) []Hold {
	c.wakeMu.Lock()
	c.mu.Lock()
	o := c.beginLocked()
	var out []Hold
	for tu, t := range c.types {
		if t.hold == nil || (typeURL != "" && tu != typeURL) {
			continue
		}
		out = append(out, t.hold.export(tu))
		c.endHoldLocked(t, tu, EndReleased, o)
	}
	c.finishLocked(o)
	c.mu.Unlock()
	o.markAll()
	c.wakeMu.Unlock()
	c.tell(o)
	slices.SortFunc(out, func(a, b Hold) int { return strings.Compare(a.TypeURL, b.TypeURL) })
	return out
}

// Holds lists the held removals, by type.
func (c *Cache) Holds() []Hold {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []Hold
	for tu, t := range c.types {
		if t.hold != nil {
			out = append(out, t.hold.export(tu))
		}
	}
	slices.SortFunc(out, func(a, b Hold) int { return strings.Compare(a.TypeURL, b.TypeURL) })
	return out
}

func (h *hold) export(typeURL string) Hold {
	return Hold{TypeURL: typeURL, Since: h.since, Names: slices.Sorted(maps.Keys(h.names)), Wipe: h.wipe}
}

// expireHoldLocked ends a hold that has lasted Guard.Hold (a wipe's,
// Guard.WipeHold).
func (c *Cache) expireHoldLocked(t *typeState, typeURL string, now time.Time, o *op) {
	if t.hold == nil {
		return
	}
	bound := c.guard.Hold
	if t.hold.wipe {
		bound = c.guard.WipeHold
	}
	if bound > 0 && now.Sub(t.hold.since) >= bound {
		c.endHoldLocked(t, typeURL, EndExpired, o)
	}
}

// tellGuard passes the op's guard events on, without the lock.
func (c *Cache) tellGuard(o *op) {
	if c.onGuard == nil {
		return
	}
	for _, ev := range o.guard {
		c.onGuard(ev)
	}
}

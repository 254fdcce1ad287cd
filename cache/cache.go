package cache

import (
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Resource is one resource as the relay stores and sends it. It is immutable
// once handed to the cache: its bytes are shared by every stream.
type Resource struct {
	Name    string
	Version string
	// Any is the encoded google.protobuf.Any, as a SotW response carries it.
	Any []byte
	// Wire is the encoded envoy.service.discovery.v3.Resource (name,
	// version, resource, aliases, ttl), as a delta response carries it.
	Wire []byte
	// Aliases are the resource's aliases (VHDS), if any.
	Aliases []string
	// TTL is the resource's time to live as upstream set it, zero if none.
	// With a TTL the resource is also encoded for clients that do not
	// support TTLs (WireNoTTL) and, wrapped in a Resource, for SotW clients
	// that do (SotWWrapped); without one those are nil.
	TTL         time.Duration
	WireNoTTL   []byte
	SotWWrapped []byte
}

// Heartbeat refreshes a resource's TTL without changing it ("TTL"): the
// resource's name and version, its new TTL, and its encodings for delta
// (Wire) and SotW (SotW, wrapped in a Resource) clients.
type Heartbeat struct {
	Name, Version string
	TTL           time.Duration
	Wire, SotW    []byte
}

// ResourceError is upstream's error for one resource, encoded once for the
// resource_errors field of delta (Delta) and SotW (SotW) responses.
type ResourceError struct {
	Name        string
	Delta, SotW []byte
}

// Lookup is the state of one name in the cache.
type Lookup struct {
	Name string
	// Resource is nil when the name is not present.
	Resource *Resource
	// Absent is true when upstream has said the resource does not exist.
	// A name that is neither present nor absent is still being fetched.
	Absent bool
	// Heartbeat is the last heartbeat of the present version, if any.
	Heartbeat *Heartbeat
	// Error is upstream's last error for the name, until it next sends
	// or removes the resource.
	Error *ResourceError
}

// Interest is the union of what a group wants of one type: what the upstream
// subscription for that type must be.
type Interest struct {
	Wildcard bool
	Names    []string // sorted
}

// Options configure a Cache.
type Options struct {
	// Retention is how long a resource nobody watches any more stays
	// subscribed and cached ("Union of interests" in DESIGN.md).
	Retention time.Duration
	// Now returns the current time; time.Now if nil.
	Now func() time.Time
	// MaxResources bounds how many resources the cache holds; 0 for no
	// bound. Past it, the least recently used resources nobody watches are
	// dropped (and unsubscribed upstream); a watched resource never is.
	MaxResources int
}

// Cache is one group's namespace: resources by type and name, and who watches
// them. It is safe for concurrent use.
type Cache struct {
	// Read-only after New.
	retention time.Duration
	now       func() time.Time
	interest  chan struct{} // capacity 1: the union of interests changed

	max int

	mu        sync.RWMutex
	seq       uint64                            // guarded by mu
	types     map[string]*typeState             // guarded by mu
	size      int                               // present resources; guarded by mu
	idle      *simplelru.LRU[idleKey, struct{}] // what nobody watches, least recently used first; guarded by mu
	evictions uint64                            // guarded by mu
}

// idleKey names what may be evicted: a retained name, or a type's retained
// wildcard (with the resources only it holds).
type idleKey struct {
	typeURL, name string
	wildcard      bool
}

type typeState struct {
	aliases  map[string]string // alias → resource name
	state    *State            // the complete state at version, built on demand; nil when stale
	version  uint64            // bumped on every change of this type
	entries  map[string]*entry
	wildcard map[*Watch]struct{} // wildcard watchers

	wantWildcard bool      // wildcard is part of the interest
	wildcardIdle time.Time // when the last wildcard watcher left
	synced       bool      // upstream has answered the wildcard subscription
}

type entry struct {
	res      *Resource
	hb       *Heartbeat     // last heartbeat of res's version
	err      *ResourceError // upstream's error for the name, until it is sent again
	expires  time.Time      // when res's TTL runs out; zero without a TTL
	absent   bool
	watchers map[*Watch]struct{}
	wanted   bool      // explicitly part of the interest
	idle     time.Time // when the last watcher left, while wanted
}

// New returns an empty cache.
func New(opts Options) *Cache {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	idle, _ := simplelru.NewLRU[idleKey, struct{}](math.MaxInt, nil)
	return &Cache{
		retention: opts.Retention,
		now:       opts.Now,
		max:       opts.MaxResources,
		interest:  make(chan struct{}, 1),
		types:     make(map[string]*typeState),
		idle:      idle,
	}
}

// InterestChanged is signalled whenever the union of interests changes.
func (c *Cache) InterestChanged() <-chan struct{} { return c.interest }

func (c *Cache) signalInterest() {
	select {
	case c.interest <- struct{}{}:
	default:
	}
}

func (c *Cache) typeLocked(typeURL string) *typeState {
	t := c.types[typeURL]
	if t == nil {
		t = &typeState{entries: make(map[string]*entry), wildcard: make(map[*Watch]struct{})}
		c.types[typeURL] = t
	}
	return t
}

func (w *Watch) regLocked(typeURL string) *reg {
	r := w.regs[typeURL]
	if r == nil {
		r = &reg{names: make(map[string]struct{})}
		w.regs[typeURL] = r
	}
	return r
}

// Watch registers w for the named resources of typeURL.
func (c *Cache) Watch(w *Watch, typeURL string, names ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.typeLocked(typeURL)
	r := w.regLocked(typeURL)
	changed := false
	for _, n := range names {
		e := t.entries[n]
		if e == nil {
			e = &entry{}
			t.entries[n] = e
		}
		if e.watchers == nil {
			e.watchers = make(map[*Watch]struct{})
		}
		e.watchers[w] = struct{}{}
		c.idle.Remove(idleKey{typeURL: typeURL, name: n})
		if !e.wanted {
			e.wanted = true
			changed = true
		}
		r.names[n] = struct{}{}
	}
	if changed {
		c.signalInterest()
	}
}

// Unwatch removes w's registration for the named resources of typeURL. The
// names stay in the interest for the retention period.
func (c *Cache) Unwatch(w *Watch, typeURL string, names ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unwatchLocked(w, typeURL, names)
}

func (c *Cache) unwatchLocked(w *Watch, typeURL string, names []string) {
	t := c.types[typeURL]
	r := w.regs[typeURL]
	if t == nil || r == nil {
		return
	}
	now := c.now()
	for _, n := range names {
		delete(r.names, n)
		e := t.entries[n]
		if e == nil {
			continue
		}
		delete(e.watchers, w)
		if len(e.watchers) == 0 {
			e.idle = now
			if e.wanted {
				c.idle.Add(idleKey{typeURL: typeURL, name: n}, struct{}{})
			}
		}
	}
}

// WatchWildcard registers w for every resource of typeURL.
func (c *Cache) WatchWildcard(w *Watch, typeURL string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.typeLocked(typeURL)
	t.wildcard[w] = struct{}{}
	w.regLocked(typeURL).wildcard = true
	c.idle.Remove(idleKey{typeURL: typeURL, wildcard: true})
	if !t.wantWildcard {
		t.wantWildcard = true
		c.signalInterest()
	}
}

// UnwatchWildcard removes w's wildcard registration for typeURL.
func (c *Cache) UnwatchWildcard(w *Watch, typeURL string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unwatchWildcardLocked(w, typeURL)
}

func (c *Cache) unwatchWildcardLocked(w *Watch, typeURL string) {
	t := c.types[typeURL]
	if t == nil {
		return
	}
	if r := w.regs[typeURL]; r != nil {
		r.wildcard = false
	}
	if _, ok := t.wildcard[w]; !ok {
		return
	}
	delete(t.wildcard, w)
	if len(t.wildcard) == 0 {
		t.wildcardIdle = c.now()
		c.idle.Add(idleKey{typeURL: typeURL, wildcard: true}, struct{}{})
	}
}

// Release removes every registration of w.
func (c *Cache) Release(w *Watch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for typeURL, r := range w.regs {
		if r.wildcard {
			c.unwatchWildcardLocked(w, typeURL)
		}
		c.unwatchLocked(w, typeURL, slices.Collect(maps.Keys(r.names)))
	}
	clear(w.regs)
}

// Get looks up names of typeURL.
func (c *Cache) Get(typeURL string, names []string) []Lookup {
	out := make([]Lookup, len(names))
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.types[typeURL]
	for i, n := range names {
		out[i].Name = n
		if t == nil {
			continue
		}
		e := t.entries[n]
		if target, ok := t.aliases[n]; ok && (e == nil || e.res == nil) {
			e = t.entries[target] // the name is an alias ("Resource names")
		}
		if e != nil {
			out[i].Resource, out[i].Absent, out[i].Heartbeat, out[i].Error = e.res, e.absent, e.hb, e.err
		}
		// Once upstream has answered the wildcard, the complete set of the
		// type is here: a name that is not is known not to exist ("Knowing
		// When a Requested Resource Does Not Exist"). Should upstream send
		// it after all, it is added as usual.
		if out[i].Resource == nil && t.synced {
			out[i].Absent = true
		}
	}
	return out
}

// State is a type's complete state of the world at one version: built once
// and shared by every stream that sends it, never modified.
type State struct {
	Version uint64
	// Synced is set once upstream has answered the wildcard subscription:
	// only then are the resources the complete state.
	Synced    bool
	Resources []*Resource // present resources, sorted by name
	// SotW is the resources' encoded Any fields, concatenated: the body of
	// a full-state SotW response after its header.
	SotW []byte
}

// State returns the type's complete state, building it if it changed since
// it was last built.
func (c *Cache) State(typeURL string) *State {
	c.mu.RLock()
	t := c.types[typeURL]
	if t == nil {
		c.mu.RUnlock()
		return &State{}
	}
	if st := t.state; st != nil {
		c.mu.RUnlock()
		return st
	}
	c.mu.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.state == nil {
		st := &State{Version: t.version, Synced: t.synced}
		n := 0
		for _, e := range t.entries {
			if e.res != nil {
				st.Resources = append(st.Resources, e.res)
				n += len(e.res.Any)
			}
		}
		slices.SortFunc(st.Resources, func(a, b *Resource) int { return strings.Compare(a.Name, b.Name) })
		st.SotW = make([]byte, 0, n)
		for _, r := range st.Resources {
			st.SotW = append(st.SotW, r.Any...)
		}
		t.state = st
	}
	return t.state
}

// Synced reports whether upstream has answered the wildcard subscription of
// typeURL.
func (c *Cache) Synced(typeURL string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.types[typeURL]
	return t != nil && t.synced
}

// All returns every present resource of typeURL sorted by name, and whether
// upstream has answered the wildcard subscription for it (only then is the
// list the complete state of the world). The slice is shared: do not modify.
func (c *Cache) All(typeURL string) (rs []*Resource, synced bool) {
	st := c.State(typeURL)
	return st.Resources, st.Synced
}

// Len returns how many resources the cache holds.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.size
}

// Evictions returns how many times the bound has made the cache drop
// something nobody watched.
func (c *Cache) Evictions() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.evictions
}

func (c *Cache) setLocked(e *entry, r *Resource) {
	switch {
	case e.res == nil && r != nil:
		c.size++
	case e.res != nil && r == nil:
		c.size--
	}
	e.res = r
}

func (c *Cache) deleteLocked(t *typeState, typeURL, name string) {
	if e := t.entries[name]; e != nil {
		if e.res != nil {
			t.version++
			t.state = nil
		}
		c.setLocked(e, nil)
		delete(t.entries, name)
		c.idle.Remove(idleKey{typeURL: typeURL, name: name})
	}
}

// evictLocked drops the least recently used things nobody watches until the
// cache is within its bound. It reports whether the interest changed.
func (c *Cache) evictLocked() bool {
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
			t.wantWildcard, t.synced, t.state = false, false, nil
			for n, e := range t.entries {
				if !e.wanted && len(e.watchers) == 0 {
					c.deleteLocked(t, k.typeURL, n)
				}
			}
		} else if e := t.entries[k.name]; e != nil && len(e.watchers) == 0 {
			e.wanted = false
			if !t.wantWildcard || e.res == nil {
				c.deleteLocked(t, k.typeURL, k.name)
			}
		}
		c.evictions++
		changed = true
	}
	return changed
}

// Version returns the type's version: it changes whenever a resource of the
// type changes.
func (c *Cache) Version(typeURL string) uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if t := c.types[typeURL]; t != nil {
		return t.version
	}
	return 0
}

// Update applies one upstream response for typeURL: upserts replace or add
// resources, removed names are marked absent. Watchers of the changed names,
// and wildcard watchers of the type, are marked dirty after the lock is
// released.
func (c *Cache) Update(typeURL string, upserts []*Resource, removed []string) {
	marks := make(map[*Watch][]string)
	c.mu.Lock()
	c.seq++
	seq := c.seq
	t := c.typeLocked(typeURL)
	changed := make([]string, 0, len(upserts)+len(removed))
	for _, r := range upserts {
		e := t.entries[r.Name]
		if e == nil {
			if !t.wantWildcard && !t.aliasWantedLocked(r) {
				continue // nobody asked for it (an unsubscribe in flight)
			}
			e = &entry{}
			t.entries[r.Name] = e
		}
		// "Resource names": a resource may be known by an alias (VHDS);
		// those who watch the alias watch the resource.
		for _, a := range r.Aliases {
			if t.aliases == nil {
				t.aliases = make(map[string]string)
			}
			t.aliases[a] = r.Name
			if ae := t.entries[a]; ae != nil && a != r.Name {
				for w := range ae.watchers {
					marks[w] = append(marks[w], a)
				}
			}
		}
		if e.res != nil && e.res.Version == r.Version && string(e.res.Wire) == string(r.Wire) {
			continue
		}
		c.setLocked(e, r)
		e.absent, e.hb, e.expires, e.err = false, nil, time.Time{}, nil
		if r.TTL > 0 {
			e.expires = c.now().Add(r.TTL)
		}
		changed = append(changed, r.Name)
		for w := range e.watchers {
			marks[w] = append(marks[w], r.Name)
		}
	}
	for _, n := range removed {
		e := t.entries[n]
		if e == nil || e.absent {
			continue
		}
		if !e.wanted && e.res != nil && t.wantWildcard {
			// Only the wildcard held it: forget it entirely.
			c.deleteLocked(t, typeURL, n)
		} else {
			c.setLocked(e, nil)
			e.absent, e.err = true, nil
		}
		changed = append(changed, n)
		for w := range e.watchers {
			marks[w] = append(marks[w], n)
		}
		for a, target := range t.aliases {
			if target != n {
				continue
			}
			delete(t.aliases, a)
			if ae := t.entries[a]; ae != nil {
				for w := range ae.watchers {
					marks[w] = append(marks[w], a)
				}
			}
		}
	}
	if len(changed) > 0 {
		t.version++
		t.state = nil
		for w := range t.wildcard {
			marks[w] = changed
		}
	}
	if c.evictLocked() {
		c.signalInterest()
	}
	c.mu.Unlock()
	for w, names := range marks {
		w.Mark(typeURL, seq, names...)
	}
}

// Errors records upstream's per-resource errors and marks the watchers of
// those names, so that the errors are passed on.
func (c *Cache) Errors(typeURL string, errs []*ResourceError) {
	marks := make(map[*Watch][]string)
	c.mu.Lock()
	c.seq++
	seq := c.seq
	t := c.typeLocked(typeURL)
	for _, re := range errs {
		e := t.entries[re.Name]
		if e == nil {
			continue // nobody here asked for it
		}
		e.err = re
		for w := range e.watchers {
			marks[w] = append(marks[w], re.Name)
		}
		for w := range t.wildcard {
			marks[w] = append(marks[w], re.Name)
		}
	}
	c.mu.Unlock()
	for w, names := range marks {
		w.Mark(typeURL, seq, names...)
	}
}

// Heartbeat applies heartbeats: each refreshes the TTL of the resource it
// names if that is still the present version ("TTL": a heartbeat is not an
// update), and marks the resource's watchers so that they can pass it on.
func (c *Cache) Heartbeat(typeURL string, hbs []*Heartbeat) {
	marks := make(map[*Watch][]string)
	c.mu.Lock()
	c.seq++
	seq := c.seq
	t := c.typeLocked(typeURL)
	for _, hb := range hbs {
		e := t.entries[hb.Name]
		if e == nil || e.res == nil || e.res.Version != hb.Version {
			continue
		}
		e.hb = hb
		e.expires = time.Time{}
		if hb.TTL > 0 {
			e.expires = c.now().Add(hb.TTL)
		}
		for w := range e.watchers {
			marks[w] = append(marks[w], hb.Name)
		}
		for w := range t.wildcard {
			marks[w] = append(marks[w], hb.Name)
		}
	}
	c.mu.Unlock()
	for w, names := range marks {
		w.MarkHeartbeat(typeURL, seq, names...)
	}
}

// expireLocked removes the resources whose TTL ran out without a heartbeat,
// as if upstream had removed them, and returns the watchers to mark.
func (c *Cache) expireLocked(now time.Time) (marks map[*Watch]map[string][]string, seq uint64) {
	for typeURL, t := range c.types {
		var expired []string
		for n, e := range t.entries {
			if e.res != nil && !e.expires.IsZero() && now.After(e.expires) {
				expired = append(expired, n)
			}
		}
		if len(expired) == 0 {
			continue
		}
		if marks == nil {
			c.seq++
			seq, marks = c.seq, make(map[*Watch]map[string][]string)
		}
		mark := func(w *Watch, names ...string) {
			if marks[w] == nil {
				marks[w] = make(map[string][]string)
			}
			marks[w][typeURL] = append(marks[w][typeURL], names...)
		}
		for _, n := range expired {
			e := t.entries[n]
			c.setLocked(e, nil)
			e.absent, e.hb, e.expires = true, nil, time.Time{}
			for w := range e.watchers {
				mark(w, n)
			}
		}
		t.version++
		t.state = nil
		for w := range t.wildcard {
			mark(w, expired...)
		}
	}
	return marks, seq
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

// MarkSynced records that upstream has answered the wildcard subscription of
// typeURL: from now on All returns the complete state of the world. Wildcard
// watchers are woken so that they can answer clients that were waiting.
func (c *Cache) MarkSynced(typeURL string) {
	c.mu.Lock()
	t := c.typeLocked(typeURL)
	if t.synced || !t.wantWildcard {
		c.mu.Unlock()
		return
	}
	t.synced = true
	t.state = nil
	c.seq++
	seq := c.seq
	ws := slices.Collect(maps.Keys(t.wildcard))
	c.mu.Unlock()
	for _, w := range ws {
		w.Mark(typeURL, seq)
	}
}

// Interest returns the union of interests by type URL: what is watched now
// and what is still retained.
func (c *Cache) Interest() map[string]Interest {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]Interest, len(c.types))
	for typeURL, t := range c.types {
		in := Interest{Wildcard: t.wantWildcard}
		for n, e := range t.entries {
			if e.wanted {
				in.Names = append(in.Names, n)
			}
		}
		slices.Sort(in.Names)
		if in.Wildcard || len(in.Names) > 0 {
			out[typeURL] = in
		}
	}
	return out
}

// Versions returns the version of every present resource of typeURL, as an
// upstream stream resuming reports them in initial_resource_versions.
func (c *Cache) Versions(typeURL string) map[string]string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.types[typeURL]
	if t == nil {
		return nil
	}
	out := make(map[string]string, len(t.entries))
	for n, e := range t.entries {
		if e.res != nil {
			out[n] = e.res.Version
		}
	}
	return out
}

// Sweep removes resources whose TTL ran out, and ends the retention of
// names and wildcards nobody has watched for the
// retention period, dropping their resources. It reports whether the cache
// is now empty of interest (nothing watched, nothing retained).
func (c *Cache) Sweep() (empty bool) {
	c.mu.Lock()
	now := c.now()
	expired, seq := c.expireLocked(now)
	defer func() {
		c.mu.Unlock()
		for w, byType := range expired {
			for typeURL, names := range byType {
				w.Mark(typeURL, seq, names...)
			}
		}
	}()
	changed := false
	empty = true
	for typeURL, t := range c.types {
		if t.wantWildcard && len(t.wildcard) == 0 && now.Sub(t.wildcardIdle) >= c.retention {
			t.wantWildcard, t.synced, t.state = false, false, nil
			c.idle.Remove(idleKey{typeURL: typeURL, wildcard: true})
			changed = true
		}
		for n, e := range t.entries {
			if e.wanted && len(e.watchers) == 0 && now.Sub(e.idle) >= c.retention {
				e.wanted = false
				c.idle.Remove(idleKey{typeURL: typeURL, name: n})
				changed = true
			}
			if !e.wanted && len(e.watchers) == 0 && !t.wantWildcard && (e.res == nil || !t.aliasWantedLocked(e.res)) {
				c.deleteLocked(t, typeURL, n)
			}
		}
		if t.wantWildcard || len(t.entries) > 0 {
			empty = false
		} else if len(t.wildcard) == 0 {
			delete(c.types, typeURL)
		}
	}
	if changed {
		c.signalInterest()
	}
	return empty
}

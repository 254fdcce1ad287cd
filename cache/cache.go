package cache

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The encoded forms the cache holds are the wire package's: a resource is
// encoded once, when it arrives, and its bytes are shared by every stream
// that sends it (docs/architecture.md, "Encode once"). They are immutable
// once handed to the cache.
type (
	// Resource is one resource as the relay stores and sends it.
	Resource = xds.Resource
	// Heartbeat refreshes a resource's TTL without changing it ("TTL").
	Heartbeat = xds.Heartbeat
	// ResourceError is an error for one resource (gRFC A88).
	ResourceError = xds.ResourceError
)

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
	// Error is the last error for the name, upstream's or the relay's,
	// until the resource is next sent or removed.
	Error *ResourceError
	// Referenced is set when the name is in the interest only because
	// resources point at it (Consistency): no client wants it yet.
	Referenced bool
	// Waiting is set when upstream sent a version of the name that waits
	// for what it points at (Consistency): it was answered.
	Waiting bool
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
	// subscribed and cached (docs/architecture.md, invariant 2 "Union of
	// interests").
	Retention time.Duration
	// Now returns the current time; time.Now if nil.
	Now func() time.Time
	// MaxResources bounds how many resources the cache holds; 0 for no
	// bound. Past it, the least recently used resources nobody watches are
	// dropped (and unsubscribed upstream); a watched resource never is.
	MaxResources int
	// MaxNames bounds how many names the group fetches: wanted explicitly
	// (watched, or retained after their last watcher left), and only
	// referenced (with Consistency); 0 for no bound. Past it, Watch
	// refuses with a *MaxNamesError, and a name a resource points at is
	// not fetched (OnRefused).
	MaxNames int
	// Guard holds mass removals from upstream; the zero Guard is off.
	Guard Guard
	// OnGuard, if set, is told of each hold that starts or ends, after
	// the cache's lock is released.
	OnGuard func(GuardEvent)
	// Rollout sends changes to canary watches first; the zero Rollout is
	// off.
	Rollout Rollout
	// OnRollout, if set, is told of each rollout step, after the cache's
	// lock is released.
	OnRollout func(RolloutEvent)
	// Consistency makes clients' resources whole (make before break); the
	// zero Consistency is off.
	Consistency Consistency
	// OnReference, if set, is told of each reference wait that ends,
	// after the cache's lock is released.
	OnReference func(ReferenceEvent)
	// OnUnsafeOrder, if set, is told of the first wait of each type for
	// the life of the cache: the control plane sent a resource before what
	// it points at, or removed a name something still points at. Told
	// after the cache's lock is released.
	OnUnsafeOrder func(UnsafeOrder)
	// OnRefused, if set, is told of the names resources point at that were
	// not fetched because the group's interest was at MaxNames. Told after
	// the cache's lock is released.
	OnRefused func(RefusedReferences)
	// OnRejected, if set, is told each time a version of a resource is
	// rejected by a first client (its count of rejecting clients leaves
	// zero), after the counters' lock is released (convergence.go). It
	// is called where the client's answer is counted, under the
	// downstream's lock of that client's status: it must not block.
	OnRejected func(Rejection)
}

// MaxNamesError is Watch's error when the watch would make the group want
// more than Options.MaxNames names. Nothing was registered.
type MaxNamesError struct {
	Max    int // Options.MaxNames
	Wanted int // names the group fetched before the watch: wanted, and only referenced
	Adding int // names the watch would have added
}

func (e *MaxNamesError) Error() string {
	return fmt.Sprintf("cache: the group fetches %d names (wanted or referenced) and the watch adds %d, past MaxNames %d", e.Wanted, e.Adding, e.Max)
}

// Cache is one group's namespace: resources by type and name, and who watches
// them. It is safe for concurrent use.
type Cache struct {
	// Read-only after New.
	retention time.Duration
	now       func() time.Time
	interest  chan struct{} // capacity 1: the union of interests changed

	max       int
	maxNames  int
	guard     Guard
	onGuard   func(GuardEvent)
	rollout   Rollout
	onRollout func(RolloutEvent)

	consistency   Consistency
	onReference   func(ReferenceEvent)
	onUnsafeOrder func(UnsafeOrder)
	onRefused     func(RefusedReferences)
	onRejected    func(Rejection)

	// wakeMu orders publication with waking: an op that changes what
	// readers see (c.mu) is made and marked on its watchers (op.markAll)
	// under it, so that nothing a later op publishes is readable before an
	// earlier op's marks are on every watch (docs/architecture.md,
	// invariant 7 "Order is kept"). Taken before mu, and held across
	// op.markAll only: never across a callback (tell, which wakes the
	// watches marked, once it is released).
	wakeMu lockorder.Mutex[cacheWakeMu]

	mu        lockorder.RWMutex[cacheMu]
	seq       uint64                            // guarded by mu
	igen      uint64                            // moves with each change of the interest (Generation); guarded by mu
	types     map[string]*typeState             // guarded by mu
	size      int                               // present resources; guarded by mu
	idle      *simplelru.LRU[idleKey, struct{}] // what nobody watches, least recently used first; guarded by mu
	evictions uint64                            // guarded by mu
	ilog      InterestLog                       // what entered and left the interest (InterestChanges); guarded by mu
	wanted    int                               // names with entry.wanted set; guarded by mu
	changes   []*change                         // changes waiting for release (Rollout), oldest first; guarded by mu
	// Make before break (Consistency, refs.go); guarded by mu.
	waits       int                             // resources and removals waiting for references
	waitOn      map[string]map[xds.Ref]struct{} // Cluster name → the waiting resources that point at it
	waitQ       []queuedWait                    // waits in the order they began, for MaxWait; may hold ended ones
	wokenRes    map[xds.Ref]struct{}            // waiting resources the changes since the last settle may have ended
	wokenRm     map[xds.Ref]struct{}            // waiting removals likewise
	refOnly     int                             // names in the interest only because something points at them
	refused     RefusedReferences               // references refused at MaxNames, to tell
	unsafeTold  map[string]bool                 // types whose first wait was told (OnUnsafeOrder)
	refusedTold bool                            // a refusal was told (RefusedReferences.First)
	unsafe      []UnsafeOrder                   // first waits, to tell
	// While dropIfUnheldLocked drops a resource, the names only it
	// pointed at (orphans), to drop in turn; guarded by mu.
	dropping bool
	orphans  []xds.Ref

	// Who has which version (convergence.go); its own mu, taken after mu.
	conv convergence
}

// idleKey names what may be evicted: a retained name, or a type's retained
// wildcard (with the resources only it holds).
type idleKey struct {
	typeURL, name string
	wildcard      bool
}

// typeState is one type of the cache: its resources and who watches them.
// Every field is guarded by the Cache's mu, as are its entries'; readers
// take it shared (RLock) and writers whole. A state built under the shared
// lock (State) is stored under the whole one.
type typeState struct {
	typeURL string

	// The resources and their watchers.
	aliases  map[string]string // alias → resource name
	state    *State            // the complete state at version, built on demand; nil when stale
	version  uint64            // bumped on every change of this type
	entries  map[string]*entry
	wildcard map[*Watch]struct{} // wildcard watchers
	ttl      map[string]struct{} // names whose entry has a TTL (expires set)
	// recheck asks the next Sweep to look at every entry for ones nothing
	// holds any more: set when aliases change, which the sweep cannot follow
	// name by name.
	recheck bool

	// The wildcard, and the latest response that changed the type.
	wantWildcard bool      // wildcard is part of the interest
	wildcardIdle time.Time // when the last wildcard watcher left
	synced       bool      // upstream has answered the wildcard subscription
	unavailable  string    // why upstream cannot answer the wildcard (Change.WildcardUnavailable); "" if it may
	received     time.Time // when the latest upstream response that changed the type arrived
	trace        Trace     // that response's trace; zero if not traced

	// Counts, and the guard (Guard).
	present  int       // entries with a resource
	removals []removal // upstream's removals of present resources within Guard.Window, oldest first
	hold     *hold     // held removals (Guard); nil if none

	// The rollout (Rollout): what all but the canaries read while changes
	// of the type are pending.
	held       int                 // entries with rel set: 0 when everyone reads the same
	relVersion uint64              // the released version, while held > 0
	relState   *State              // the released complete state, built on demand
	watches    map[*Watch]struct{} // watches registered for the type
	canaries   map[*Watch]struct{} // the lowest-ranked of them
	maxCanary  uint64              // the highest rank among the canaries

	globs int // entries that are glob collections (IsGlob)

	// Make before break (Consistency, refs.go).
	waiting  map[string]*waiter   // resources waiting for what they point at
	removing map[string]time.Time // removals waiting until nothing points at the name, since when
	missing  map[string]struct{}  // names present resources point at that the cache lacks
}

// entry is one name of a type; guarded by the Cache's mu.
type entry struct {
	res      *Resource
	hb       *Heartbeat     // last heartbeat of res's version
	err      *ResourceError // the error for the name, until the resource is sent or removed
	expires  time.Time      // when res's TTL runs out; zero without a TTL
	absent   bool
	watchers watchSet
	// both is how many of watchers also watch the type with the wildcard:
	// one client each (Convergence's subscribed), counted as they come
	// and go so that a query never walks the watchers.
	both   int
	wanted bool      // explicitly part of the interest
	idle   time.Time // when the last watcher left, while wanted
	rel    *released // what all but the canaries read, while a change of it is pending
	// What points at the name (Consistency): present resources, and how
	// many waiting ones. A name something points at is in the interest.
	from map[xds.Ref]struct{}
	pend int
	// refIn: something points at the name and it was let into the
	// interest (admitLocked): fetched. Counted in Cache.refOnly unless
	// wanted.
	refIn bool
	// dangling: a wait for the name ran out (Consistency.MaxWait) while
	// it had not come; nothing waits for it again until it exists
	// (lacked).
	dangling bool
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
		maxNames:  opts.MaxNames,
		guard:     opts.Guard,
		onGuard:   opts.OnGuard,
		rollout:   opts.Rollout,
		onRollout: opts.OnRollout,

		consistency:   opts.Consistency,
		onReference:   opts.OnReference,
		onUnsafeOrder: opts.OnUnsafeOrder,
		onRefused:     opts.OnRefused,
		onRejected:    opts.OnRejected,
		interest:      make(chan struct{}, 1),
		types:         make(map[string]*typeState),
		idle:          idle,
		conv:          convergence{tell: opts.OnRejected != nil},
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
		t = &typeState{typeURL: typeURL, entries: make(map[string]*entry), wildcard: make(map[*Watch]struct{})}
		c.types[typeURL] = t
	}
	return t
}

func (w *Watch) regLocked(typeURL string) *reg { return w.regs.make(typeURL) }

// Watch registers w for the named resources of typeURL. It registers
// nothing and returns a *MaxNamesError if that would make the group want
// more than Options.MaxNames names.
func (c *Cache) Watch(w *Watch, typeURL string, names ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkNamesLocked(typeURL, names); err != nil {
		return err
	}
	t := c.typeLocked(typeURL)
	r := w.regLocked(typeURL)
	changed := false
	for _, n := range names {
		e := t.entries[n]
		if e == nil {
			e = t.newEntryLocked(n)
		}
		if !e.watchers.has(w) {
			e.watchers.add(w)
			if r.wildcard {
				e.both++
			}
		}
		c.idle.Remove(idleKey{typeURL: typeURL, name: n})
		if !e.wanted {
			c.wantLocked(e, true)
			c.noteLocked(typeURL, n, true)
			changed = true
		}
		r.add(n)
	}
	c.trackLocked(t, typeURL, w)
	c.registeredLocked(w, typeURL)
	if changed {
		c.signalInterest()
	}
	return nil
}

// checkNamesLocked refuses names of typeURL if wanting them would pass
// MaxNames: the names the group fetches, wanted and only referenced alike
// (admitLocked), so that references cannot take the group past the bound.
// A name only referenced is fetched already: wanting it adds nothing.
func (c *Cache) checkNamesLocked(typeURL string, names []string) error {
	held := c.wanted + c.refOnly
	if c.maxNames <= 0 || held+len(names) <= c.maxNames {
		return nil
	}
	t := c.types[typeURL]
	adding := map[string]struct{}{}
	for _, n := range names {
		if e := t.entryLocked(n); e == nil || !e.wanted && !e.refIn {
			adding[n] = struct{}{}
		}
	}
	if held+len(adding) <= c.maxNames {
		return nil
	}
	return &MaxNamesError{Max: c.maxNames, Wanted: held, Adding: len(adding)}
}

// entryLocked is the entry of name; t may be nil.
func (t *typeState) entryLocked(name string) *entry {
	if t == nil {
		return nil
	}
	return t.entries[name]
}

// wantLocked sets whether e is explicitly part of the interest, keeping the
// count of wanted names.
func (c *Cache) wantLocked(e *entry, wanted bool) {
	if wanted != e.wanted {
		c.igen++
	}
	switch {
	case wanted && !e.wanted:
		c.wanted++
		if e.refIn {
			c.refOnly--
		}
	case !wanted && e.wanted:
		c.wanted--
		if e.refIn {
			c.refOnly++
		}
	}
	e.wanted = wanted
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
	r := w.regs.get(typeURL)
	if t == nil || r == nil {
		return
	}
	now := c.now()
	for _, n := range names {
		r.remove(n)
		e := t.entries[n]
		if e == nil {
			continue
		}
		if e.watchers.has(w) && r.wildcard {
			e.both--
		}
		e.watchers.remove(w)
		if e.watchers.len() == 0 {
			e.idle = now
			if e.wanted {
				c.idle.Add(idleKey{typeURL: typeURL, name: n}, struct{}{})
			}
		}
	}
	c.trackLocked(t, typeURL, w)
	c.registeredLocked(w, typeURL)
}

// WatchWildcard registers w for every resource of typeURL.
func (c *Cache) WatchWildcard(w *Watch, typeURL string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.typeLocked(typeURL)
	r := w.regLocked(typeURL)
	if !r.wildcard {
		t.bothLocked(w, r, 1)
	}
	t.wildcard[w] = struct{}{}
	r.wildcard = true
	c.trackLocked(t, typeURL, w)
	c.registeredLocked(w, typeURL)
	c.idle.Remove(idleKey{typeURL: typeURL, wildcard: true})
	if !t.wantWildcard {
		t.wantWildcard = true
		c.noteLocked(typeURL, "*", true)
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
	if r := w.regs.get(typeURL); r != nil {
		if r.wildcard {
			t.bothLocked(w, r, -1)
		}
		r.wildcard = false
	}
	c.trackLocked(t, typeURL, w)
	c.registeredLocked(w, typeURL)
	if _, ok := t.wildcard[w]; !ok {
		return
	}
	delete(t.wildcard, w)
	if len(t.wildcard) == 0 {
		t.wildcardIdle = c.now()
		c.idle.Add(idleKey{typeURL: typeURL, wildcard: true}, struct{}{})
	}
}

// bothLocked adds d to the count of watchers by name and with the
// wildcard of each name w watches: w's wildcard comes (1) or goes (-1).
func (t *typeState) bothLocked(w *Watch, r *reg, d int) {
	for n := range r.allNames() {
		if e := t.entries[n]; e != nil && e.watchers.has(w) {
			e.both += d
		}
	}
}

// Release removes every registration of w.
func (c *Cache) Release(w *Watch) {
	c.wakeMu.Lock()
	c.mu.Lock()
	for typeURL, r := range w.regs.all() {
		if r.wildcard {
			c.unwatchWildcardLocked(w, typeURL)
		}
		c.unwatchLocked(w, typeURL, r.names())
	}
	w.regs.clear()
	c.releasedLocked(w)
	if len(c.changes) == 0 {
		c.mu.Unlock()
		c.wakeMu.Unlock()
		return
	}
	// A canary that leaves is not waited for.
	o := c.beginLocked()
	c.advanceLocked(c.now(), o)
	c.finishLocked(o)
	c.mu.Unlock()
	o.markAll()
	c.wakeMu.Unlock()
	c.tell(o)
}

// Get looks up names of typeURL as upstream last gave them: with the
// rollout, the candidate (what the upstream side works from); streams read
// with Read.
func (c *Cache) Get(typeURL string, names []string) []Lookup {
	out := make([]Lookup, len(names))
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.types[typeURL]
	for i, n := range names {
		out[i] = t.lookupLocked(n, false)
	}
	return out
}

// lookupLocked is the state of one name, as released to the group if rel;
// t may be nil.
func (t *typeState) lookupLocked(n string, rel bool) Lookup {
	l := Lookup{Name: n}
	if t == nil {
		return l
	}
	e := t.entries[n]
	if target, ok := t.aliases[n]; ok && (e == nil || e.res == nil) {
		e = t.entries[target] // the name is an alias ("Resource names")
	}
	if e != nil {
		l.Resource, l.Absent, l.Heartbeat, l.Error = e.res, e.absent, e.hb, e.err
		l.Referenced = !e.wanted && e.referenced()
		_, l.Waiting = t.waiting[n]
		if rel && e.rel != nil {
			l.Resource, l.Absent = e.rel.res, e.rel.absent
			if l.Heartbeat != nil && (l.Resource == nil || l.Heartbeat.Version != l.Resource.Version) {
				l.Heartbeat = nil
			}
		}
	}
	// Once upstream has answered the wildcard, the complete set of the
	// type is here: a name that is not is known not to exist ("Knowing
	// When a Requested Resource Does Not Exist"). Should upstream send it
	// after all, it is added as usual.
	if l.Resource == nil && t.synced {
		l.Absent = true
	}
	return l
}

// View is one type read at one version, under one lock: whatever a stream
// builds from it is a whole upstream response, never part of one.
type View struct {
	// Version is the type's version the lookups belong to.
	Version uint64
	// Synced is set once upstream has answered the wildcard subscription.
	Synced bool
	// Held is set while resources of the type wait for what they point at
	// (Consistency): until they are released, what is present is not yet
	// the whole of what upstream sent, and a wildcard's first answer is
	// not sent empty (Cache.Held).
	Held bool
	// Received is when the latest upstream response that changed the type
	// arrived (Change.Received); zero before the first.
	Received time.Time
	// Trace is that response's trace (Change.Trace); zero if not traced.
	Trace Trace
	// Lookups are the names asked for and, if all was asked, every present
	// resource of the type: sorted by name, each once.
	Lookups []Lookup
}

// Read looks up names of typeURL, and every present resource of it if all,
// as one consistent view, as released to the group. names is the caller's
// scratch: it is sorted in place, and appended to when all is set.
func (c *Cache) Read(typeURL string, names []string, all bool) View {
	return c.ReadInto(nil, typeURL, names, all, nil)
}

// ReadFor is Read for the stream of w: a canary of the type reads the
// changes that are not released yet (Rollout).
func (c *Cache) ReadFor(w *Watch, typeURL string, names []string, all bool) View {
	return c.ReadInto(w, typeURL, names, all, nil)
}

// ReadInto is ReadFor with the lookups stored in buf's array while they fit.
// A stream reads at every change that reaches it: with storage of its own
// (on its stack) and names it built for the read, the read allocates
// nothing.
func (c *Cache) ReadInto(w *Watch, typeURL string, names []string, all bool, buf []Lookup) View {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.types[typeURL]
	if all && t != nil {
		names = slices.Grow(names, len(t.entries))
		for n, e := range t.entries {
			if e.res != nil {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if t == nil {
		return View{Lookups: (*typeState)(nil).lookupAllLocked(names, false, buf)}
	}
	rel := t.releasedView(w)
	version := t.version
	if rel {
		version = t.relVersion
	}
	return View{Version: version, Synced: t.synced, Held: len(t.waiting) > 0, Received: t.received, Trace: t.trace,
		Lookups: t.lookupAllLocked(names, rel, buf)}
}

func (t *typeState) lookupAllLocked(names []string, rel bool, buf []Lookup) []Lookup {
	out := buf[:0]
	if cap(out) < len(names) {
		out = make([]Lookup, 0, len(names))
	}
	for _, n := range names {
		out = append(out, t.lookupLocked(n, rel))
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
	Received  time.Time   // as View.Received
	Trace     Trace       // as View.Trace
	Resources []*Resource // present resources, sorted by name
	// SotW is the resources' encoded Any fields, concatenated: the body of
	// a full-state SotW response after its header.
	SotW []byte
}

// State returns the type's complete state as released to the group,
// building it if it changed since it was last built.
func (c *Cache) State(typeURL string) *State { return c.StateFor(nil, typeURL) }

// StateFor is State for the stream of w: a canary of the type gets the
// state with the changes that are not released yet (Rollout).
func (c *Cache) StateFor(w *Watch, typeURL string) *State {
	c.mu.RLock()
	t := c.types[typeURL]
	if t == nil {
		c.mu.RUnlock()
		return &State{}
	}
	rel := t.releasedView(w)
	if st := t.stateLocked(rel); st != nil {
		c.mu.RUnlock()
		return st
	}
	c.mu.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	rel = t.releasedView(w)
	if st := t.stateLocked(rel); st != nil {
		return st
	}
	st := t.buildState(rel)
	if rel {
		t.relState = st
	} else {
		t.state = st
	}
	return st
}

// stateLocked is the built state, of the released view if rel; nil if it
// needs building.
func (t *typeState) stateLocked(rel bool) *State {
	if rel {
		return t.relState
	}
	return t.state
}

// buildState builds the type's complete state, of the released view if rel.
func (t *typeState) buildState(rel bool) *State {
	st := &State{Version: t.version, Synced: t.synced, Received: t.received, Trace: t.trace}
	if rel {
		st.Version = t.relVersion
	}
	n := 0
	for _, e := range t.entries {
		r := e.res
		if rel && e.rel != nil {
			r = e.rel.res
		}
		if r != nil {
			st.Resources = append(st.Resources, r)
			n += len(r.Any)
		}
	}
	slices.SortFunc(st.Resources, func(a, b *Resource) int { return strings.Compare(a.Name, b.Name) })
	st.SotW = make([]byte, 0, n)
	for _, r := range st.Resources {
		st.SotW = append(st.SotW, r.Any...)
	}
	return st
}

// Held reports whether resources of typeURL wait for what they point at
// (View.Held). A State is built once per version, and a wait can begin
// without one: it is asked apart, by a wildcard's first answer only.
func (c *Cache) Held(typeURL string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.types[typeURL]
	return t != nil && len(t.waiting) > 0
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

// Empty reports whether the cache holds and wants nothing, as Sweep's
// answer says, without sweeping: a caller that swept with no lock of its
// own held checks again under that lock.
func (c *Cache) Empty() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, t := range c.types {
		if t.heldLocked() {
			return false
		}
	}
	return true
}

// heldLocked reports whether the type holds or wants anything: the
// wildcard, a name, or a resource waiting for what it points at (a
// wildcard's, which has no entry until it is applied; the type goes only
// once the wait has ended and let go of what it fetched).
func (t *typeState) heldLocked() bool {
	return t.wantWildcard || len(t.entries) > 0 || len(t.waiting) > 0
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

// Interest returns the union of interests by type URL: what is watched now
// and what is still retained.
func (c *Cache) Interest() map[string]Interest {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]Interest, len(c.types))
	for typeURL, t := range c.types {
		if in := t.interestLocked(); in.Wildcard || len(in.Names) > 0 {
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

// Retention is Options.Retention: how long what nobody watches is kept.
func (c *Cache) Retention() time.Duration { return c.retention }

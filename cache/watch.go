package cache

import (
	"iter"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Dirty is what changed for one type since a watcher last looked.
type Dirty struct {
	// TypeURL is the type that changed.
	TypeURL string
	// Seq is the sequence number of the earliest change recorded here; the
	// order of Seq across types is the order in which upstream sent them.
	Seq uint64
	// Names are the changed resource names.
	Names NameSet
	// Heartbeats are names whose TTL was refreshed without a change.
	Heartbeats NameSet
}

// fewNames is how many names a NameSet holds before it makes a map.
const fewNames = 4

// NameSet is a set of resource names. A change marks a stream with one name
// or a few, and a flush reads them back: they are held in the set itself,
// and a map is made only for more, so that neither touches a map. Its zero
// value is empty; a nil *NameSet reads as empty.
type NameSet struct {
	few  [fewNames]string
	more map[string]struct{} // kept, cleared, across a reset while small
	n    uint8               // names in few, while big is false
	big  bool                // the names are in more
}

// Add adds name to the set.
func (s *NameSet) Add(name string) {
	if s.big {
		s.more[name] = struct{}{}
		return
	}
	for _, n := range s.few[:s.n] {
		if n == name {
			return
		}
	}
	if s.n < fewNames {
		s.few[s.n] = name
		s.n++
		return
	}
	if s.more == nil {
		s.more = make(map[string]struct{}, 2*len(s.few))
	}
	for _, n := range s.few {
		s.more[n] = struct{}{}
	}
	s.more[name] = struct{}{}
	s.few, s.n, s.big = [fewNames]string{}, 0, true
}

// Has reports whether name is in the set.
func (s *NameSet) Has(name string) bool {
	switch {
	case s == nil:
		return false
	case s.big:
		_, ok := s.more[name]
		return ok
	}
	for _, n := range s.few[:s.n] {
		if n == name {
			return true
		}
	}
	return false
}

// Len is the number of names in the set.
func (s *NameSet) Len() int {
	switch {
	case s == nil:
		return 0
	case s.big:
		return len(s.more)
	}
	return int(s.n)
}

// AppendTo appends the names, in no particular order, to dst.
func (s *NameSet) AppendTo(dst []string) []string {
	switch {
	case s == nil:
		return dst
	case s.big:
		for n := range s.more {
			dst = append(dst, n)
		}
		return dst
	}
	return append(dst, s.few[:s.n]...)
}

// All yields the names, in no particular order.
func (s *NameSet) All() iter.Seq[string] {
	return func(yield func(string) bool) {
		if s == nil {
			return
		}
		if s.big {
			for n := range s.more {
				if !yield(n) {
					return
				}
			}
			return
		}
		for _, n := range s.few[:s.n] {
			if !yield(n) {
				return
			}
		}
	}
}

// reset empties the set. Its map is kept for reuse unless it grew past
// recycleMax: a cleared map keeps its size.
func (s *NameSet) reset() {
	clear(s.few[:s.n])
	s.n = 0
	if s.big {
		s.big = false
		if len(s.more) <= recycleMax {
			clear(s.more)
		} else {
			s.more = nil
		}
	}
}

// DirtySet is what changed since a watcher last looked, one Dirty per type.
// A stream watches a few types, most one: a short list is cheaper to mark,
// take and read than a map, and a change that reaches many streams does all
// three for each.
type DirtySet []*Dirty

// Of returns what changed of typeURL, or nil.
func (s DirtySet) Of(typeURL string) *Dirty {
	for _, d := range s {
		if d.TypeURL == typeURL {
			return d
		}
	}
	return nil
}

// maxFree is how many records a watch keeps for reuse: a stream flushes
// one type at a time, or a few.
const maxFree = 4

// Watch is one downstream stream's registration with a cache. The cache marks
// it dirty and wakes it; the stream drains it with Take when it is ready.
// A slow stream only accumulates names in its dirty set: the cache never
// waits for it.
type Watch struct {
	wake   chan struct{}
	notify func() // set by OnReady; replaces wake

	mu    lockorder.Mutex[watchMu]
	dirty DirtySet // guarded by mu
	// Given back by Recycle, for the next Take and marks: a watch that is
	// marked and flushed over and over allocates nothing. Guarded by mu.
	spare DirtySet
	free  []*Dirty

	// Storage for the usual watch, of one type: a dirty record and two
	// lists of one, one being marked while the other is flushed, and the
	// free list's array. At many streams a change finds every stream's
	// memory cold in the CPU's caches: held here, beside the mutex, a mark
	// and a take touch the watch's own lines rather than objects of their
	// own. A second record, for a mark that comes while the first is
	// being flushed, is made then and kept in the free list: an idle
	// stream does not hold it. Guarded by mu, as what points into them.
	own     [1]Dirty
	ownList [2][1]*Dirty
	freeArr [2]*Dirty // the free list's first array; it grows to maxFree for a stream of more types

	// regs records what this watch is registered for: guarded by the
	// owning Cache's mu, not by w.mu.
	regs regSet

	// owner is the counters of the cache it is registered with (nil
	// before, and once released), told of its marks and takes
	// (clients.go): guarded by mu. conv is its standing with each type
	// there, the first type's in convOne: guarded by owner's mu.
	owner   *convergence
	conv    []clientRec
	convOne [1]clientRec

	rank  uint64 // orders the canaries (Rollout); set before registering
	first bool   // woken before the others (SetFirst); set before registering
	peer  bool   // a fleet peer's, counted apart (SetPeer); set before registering
}

// SetFirst makes the watch woken before the others at each change it is
// marked in: a stream that fans out to many clients of its own (a relay
// below) is flushed first. Call it before the watch is registered with a
// cache.
func (w *Watch) SetFirst(first bool) { w.first = first }

// SetPeer marks the watch a fleet peer's stream (relay/fleet.go): a
// member relaying the group to clients of its own, counted apart from the
// clients (ClientCounts.Peers). Call it before the watch is registered
// with a cache.
func (w *Watch) SetPeer(peer bool) { w.peer = peer }

// SetRank sets the watch's rank among its type's watches: the lowest
// ranked are the canaries of the rollout (Rollout). A hash of the client's
// node id keeps a client a canary across its streams and reconnects. Call
// it before the watch is registered with a cache.
func (w *Watch) SetRank(rank uint64) { w.rank = rank }

// reg is a watch's registration for one type: with the wildcard, and by
// name. The first name is held in the record itself, a map made only for
// a second: a stream names one resource of a type, or a few, and a Go map
// of one entry costs a group of eight slots.
type reg struct {
	wildcard bool
	hasOne   bool
	made     bool                // made by regSet.make (the set's own record is in use)
	one      string              // the first name, while hasOne
	more     map[string]struct{} // the names besides one
}

func (r *reg) add(name string) {
	switch {
	case r.hasOne && r.one == name:
	case !r.hasOne:
		if _, ok := r.more[name]; !ok {
			r.one, r.hasOne = name, true
		}
	default:
		if r.more == nil {
			r.more = make(map[string]struct{})
		}
		r.more[name] = struct{}{}
	}
}

func (r *reg) remove(name string) {
	if r.hasOne && r.one == name {
		r.one, r.hasOne = "", false
		return
	}
	delete(r.more, name)
}

// named is how many names the registration holds.
func (r *reg) named() int {
	n := len(r.more)
	if r.hasOne {
		n++
	}
	return n
}

// in reports whether the watch is registered for the type at all.
func (r *reg) in() bool { return r != nil && (r.wildcard || r.named() > 0) }

// names returns the registration's names, in no order.
func (r *reg) names() []string {
	out := make([]string, 0, r.named())
	if r.hasOne {
		out = append(out, r.one)
	}
	for n := range r.more {
		out = append(out, n)
	}
	return out
}

// allNames yields the registration's names.
func (r *reg) allNames() iter.Seq[string] {
	return func(yield func(string) bool) {
		if r.hasOne && !yield(r.one) {
			return
		}
		for n := range r.more {
			if !yield(n) {
				return
			}
		}
	}
}

// regSet is a watch's registrations by type: the first type's held in the
// set itself, a map made only for a second (a stream asks for one type,
// or a few). A registration, once made, stays at its address until the
// set is cleared.
type regSet struct {
	oneType string // own's type, while own.made
	own     reg
	more    map[string]*reg
}

// get is the registration of typeURL; nil if none.
func (s *regSet) get(typeURL string) *reg {
	if s.own.made && s.oneType == typeURL {
		return &s.own
	}
	return s.more[typeURL]
}

// make returns the registration of typeURL, made if need be.
func (s *regSet) make(typeURL string) *reg {
	if r := s.get(typeURL); r != nil {
		return r
	}
	if !s.own.made {
		s.oneType, s.own = typeURL, reg{made: true}
		return &s.own
	}
	if s.more == nil {
		s.more = make(map[string]*reg)
	}
	r := &reg{made: true}
	s.more[typeURL] = r
	return r
}

// all yields each type's registration.
func (s *regSet) all() iter.Seq2[string, *reg] {
	return func(yield func(string, *reg) bool) {
		if s.own.made && !yield(s.oneType, &s.own) {
			return
		}
		for t, r := range s.more {
			if !yield(t, r) {
				return
			}
		}
	}
}

// clear forgets every registration.
func (s *regSet) clear() { *s = regSet{} }

// NewWatch returns a watch with nothing registered.
func NewWatch() *Watch {
	w := &Watch{
		wake: make(chan struct{}, 1),
	}
	w.dirty, w.spare = w.ownList[0][:0], w.ownList[1][:0]
	w.free = append(w.freeArr[:0], &w.own[0])
	return w
}

// Ready is signalled when the watch has become dirty since the last Take.
// It is not, once OnReady has set a function: it is then nil, and the
// watch holds no channel (a stream's watch, one per stream).
func (w *Watch) Ready() <-chan struct{} { return w.wake }

// OnReady makes every mark call f, after the mark, instead of signalling
// Ready. f runs on the goroutine that marks (the cache's writer, often),
// with no lock of the cache held, and must not block. Call it before the
// watch is registered with a cache.
func (w *Watch) OnReady(f func()) { w.notify, w.wake = f, nil }

// Take returns and clears the dirty sets, one per type; nil if none.
func (w *Watch) Take() DirtySet {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.dirty) == 0 {
		return nil
	}
	d := w.dirty
	w.dirty, w.spare = w.spare, nil
	w.takenLocked(d)
	return d
}

// TakeBelow moves into dst, and clears, what changed of the types that go
// before rank in the spec's order (xds.Rank), and returns dst; dst
// unchanged if none. A flush that has read a type calls it before it
// sends: what the cache released meanwhile of a type that goes first is
// sent first (see downstream/order.go). Give the records back with
// RecycleRecords.
func (w *Watch) TakeBelow(rank int, dst DirtySet) DirtySet {
	w.mu.Lock()
	defer w.mu.Unlock()
	keep := w.dirty[:0]
	taken := len(dst)
	for _, d := range w.dirty {
		if xds.Rank(d.TypeURL) < rank {
			dst = append(dst, d)
		} else {
			keep = append(keep, d)
		}
	}
	clear(w.dirty[len(keep):])
	w.dirty = keep
	w.takenLocked(dst[taken:])
	return dst
}

// recycleMax bounds the maps Recycle keeps: a cleared map keeps its size,
// and a watch should not hold on to the memory of one large change.
const recycleMax = 64

// Recycle gives back what Take returned, once the caller is done with it and
// keeps nothing of it: its sets are cleared and reused by later marks.
func (w *Watch) Recycle(d DirtySet) {
	if d == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recycleLocked(d)
	if w.spare == nil && cap(d) <= recycleMax {
		w.spare = d[:0]
	}
}

// RecycleRecords gives back the records of d, which TakeBelow returned,
// and keeps nothing of d itself, the caller's.
func (w *Watch) RecycleRecords(d DirtySet) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recycleLocked(d)
}

func (w *Watch) recycleLocked(d DirtySet) {
	for i, x := range d {
		// Reset even when not kept: a record may be one of the watch's
		// own, which would otherwise hold a large change's names.
		x.Names.reset()
		x.Heartbeats.reset()
		x.TypeURL = ""
		if len(w.free) < maxFree {
			w.free = append(w.free, x)
		}
		d[i] = nil
	}
}

// Mark records names of typeURL as dirty at seq and wakes the watch. It is
// what the cache calls on a change; a stream may also call it to schedule
// work for itself (a new subscription, for instance).
func (w *Watch) Mark(typeURL string, seq uint64, names ...string) {
	w.record(typeURL, seq, false, names)
	w.Wake()
}

// MarkHeartbeat records heartbeats of names of typeURL at seq and wakes the
// watch.
func (w *Watch) MarkHeartbeat(typeURL string, seq uint64, names ...string) {
	w.record(typeURL, seq, true, names)
	w.Wake()
}

// record records names (or heartbeats) of typeURL as dirty at seq, and
// wakes no one.
func (w *Watch) record(typeURL string, seq uint64, heartbeat bool, names []string) {
	w.mu.Lock()
	d := w.dirty.Of(typeURL)
	if d == nil {
		if n := len(w.free); n > 0 {
			d, w.free = w.free[n-1], w.free[:n-1]
			d.TypeURL, d.Seq = typeURL, seq
		} else {
			d = &Dirty{TypeURL: typeURL, Seq: seq}
		}
		w.dirty = append(w.dirty, d)
		w.markedLocked(typeURL)
	} else if seq < d.Seq {
		d.Seq = seq
	}
	set := &d.Names
	if heartbeat {
		set = &d.Heartbeats
	}
	for _, n := range names {
		set.Add(n)
	}
	w.mu.Unlock()
}

// Wake wakes the watch as a mark does, marking nothing: a stream that
// keeps marks of its own back wakes itself to flush them.
func (w *Watch) Wake() {
	if w.notify != nil {
		w.notify()
		return
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

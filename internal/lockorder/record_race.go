//go:build race

package lockorder

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/petermattis/goid"
)

// The recorder of a race build. Its shared state (the goroutines' held
// locks, the pairs seen) is touched only in //go:norace functions, with the
// race detector's synchronization events off (runtime.RaceDisable): the
// detector neither sees the recorder's memory nor learns an order between
// goroutines from the recorder's own mutexes. Atomics under RaceDisable
// order nothing either.

const enabled = true

const (
	maxHeld    = maxHeldAll  // locks one goroutine may hold at once and be recorded
	siteDepth  = 4           // frames kept of where a lock was taken
	shardCount = 64          // goroutines' held sets, spread by goroutine id
	seenSlots  = 4096        // the pairs seen, by their names' addresses
	maxEdges   = maxEdgesAll // pairs recorded
)

type site [siteDepth]uintptr

type heldLock struct {
	lock unsafe.Pointer
	name string
	at   site
}

// gstate is one goroutine's held locks, innermost last. Only its goroutine
// changes it, but for an Unlock on another goroutine, always under its
// shard's mu.
type gstate struct {
	gid  int64
	n    int
	held [maxHeld]heldLock
	next *gstate
}

type shard struct {
	mu   sync.Mutex
	live *gstate // goroutines holding at least one lock
	free *gstate
}

var shards [shardCount]shard

// seen holds the pairs recorded, as the addresses of their names' bytes
// (a class's name is a constant: one address). Written under edges.mu,
// read without it.
var seen [seenSlots]struct{ held, taken atomic.Uintptr }

type edgeRec struct {
	held, taken     string
	heldAt, takenAt site
}

var edges struct {
	mu     sync.Mutex
	list   [maxEdges]edgeRec
	n      int
	seenN  int // slots of seen in use
	strays int // unlocks of a lock no goroutine was recorded holding
	deep   int // locks taken past maxHeld held
	full   int // pairs past maxEdges
}

// expected is the order that a pair is told against as it is first seen
// (Expect), nil until set.
var expected atomic.Pointer[Order]

func expect(o *Order) { expected.Store(o) }

func noteLock(lock unsafe.Pointer, name string) {
	var at site
	runtime.Callers(3, at[:])
	gid := goid.Get()
	runtime.RaceDisable()
	fresh := push(gid, lock, name, &at, true)
	var news []edgeRec
	if fresh {
		news = recordFresh(gid, name, &at)
	}
	runtime.RaceEnable()
	tell(news)
}

func noteTry(lock unsafe.Pointer, name string) {
	var at site
	runtime.Callers(3, at[:])
	gid := goid.Get()
	runtime.RaceDisable()
	push(gid, lock, name, &at, false)
	runtime.RaceEnable()
}

func noteUnlock(lock unsafe.Pointer) {
	gid := goid.Get()
	runtime.RaceDisable()
	if !pop(gid, lock) {
		popAnywhere(lock)
	}
	runtime.RaceEnable()
}

// tell writes to stderr, as each is first seen, the pairs the expected
// order does not allow: a test that then deadlocks on the inversion has
// said why before it hangs.
func tell(news []edgeRec) {
	o := expected.Load()
	if o == nil {
		return
	}
	for _, e := range news {
		if !o.Allows(e.held, e.taken) {
			fmt.Fprintf(os.Stderr, "lockorder: %s → %s, which the lock order does not list:\n%s", e.held, e.taken, e.edge().where())
		}
	}
}

func keyOf(s string) uintptr { return uintptr(unsafe.Pointer(unsafe.StringData(s))) }

func slotOf(held, taken uintptr) uintptr {
	h := held*0x9E3779B97F4A7C15 ^ taken*0xC2B2AE3D27D4EB4F
	return (h ^ h>>29) & (seenSlots - 1)
}

//go:norace
func isSeen(held, taken uintptr) bool {
	for i := slotOf(held, taken); ; i = (i + 1) & (seenSlots - 1) {
		h := seen[i].held.Load()
		if h == 0 {
			return false
		}
		if h == held && seen[i].taken.Load() == taken {
			return true
		}
	}
}

// markSeen adds a pair to seen; the caller holds edges.mu. Past half the
// slots it adds nothing: the pairs are then looked for in edges.list.
//
//go:norace
func markSeen(held, taken uintptr) {
	if edges.seenN >= seenSlots/2 {
		return
	}
	for i := slotOf(held, taken); ; i = (i + 1) & (seenSlots - 1) {
		if seen[i].held.Load() == 0 {
			seen[i].taken.Store(taken)
			seen[i].held.Store(held)
			edges.seenN++
			return
		}
	}
}

//go:norace
func (sh *shard) find(gid int64, create bool) *gstate {
	for g := sh.live; g != nil; g = g.next {
		if g.gid == gid {
			return g
		}
	}
	if !create {
		return nil
	}
	g := sh.free
	if g != nil {
		sh.free = g.next
	} else {
		g = new(gstate)
	}
	g.gid, g.n, g.next = gid, 0, sh.live
	sh.live = g
	return g
}

//go:norace
func (sh *shard) retire(g *gstate) {
	for p := &sh.live; *p != nil; p = &(*p).next {
		if *p == g {
			*p = g.next
			g.next = sh.free
			sh.free = g
			return
		}
	}
}

// push records that the goroutine gid holds lock, and says whether a pair
// of a lock it already held and this one is not seen yet (when order).
//
//go:norace
func push(gid int64, lock unsafe.Pointer, name string, at *site, order bool) (fresh bool) {
	sh := &shards[uint64(gid)%shardCount]
	sh.mu.Lock()
	g := sh.find(gid, true)
	if order {
		taken := keyOf(name)
		for i := 0; i < g.n && !fresh; i++ {
			fresh = !isSeen(keyOf(g.held[i].name), taken)
		}
	}
	if g.n < maxHeld {
		g.held[g.n] = heldLock{lock: lock, name: name, at: *at}
		g.n++
	} else {
		edges.mu.Lock()
		edges.deep++
		edges.mu.Unlock()
	}
	sh.mu.Unlock()
	return fresh
}

// recordFresh records the pairs of the locks gid held before its last one
// and that one, named name and taken at at, that were not recorded yet,
// and returns them.
//
//go:norace
func recordFresh(gid int64, name string, at *site) []edgeRec {
	sh := &shards[uint64(gid)%shardCount]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	g := sh.find(gid, false)
	if g == nil {
		return nil
	}
	edges.mu.Lock()
	defer edges.mu.Unlock()
	var news []edgeRec
	taken := keyOf(name)
	for i := 0; i < g.n-1; i++ {
		h := &g.held[i]
		if isSeen(keyOf(h.name), taken) {
			continue
		}
		markSeen(keyOf(h.name), taken)
		if recorded(h.name, name) {
			continue
		}
		if edges.n == maxEdges {
			edges.full++
			continue
		}
		e := edgeRec{held: h.name, taken: name, heldAt: h.at, takenAt: *at}
		edges.list[edges.n] = e
		edges.n++
		if news == nil {
			news = make([]edgeRec, 0, 4)
		}
		news = append(news, e)
	}
	return news
}

// recorded says whether the pair held → taken is in edges.list; the caller
// holds edges.mu.
//
//go:norace
func recorded(held, taken string) bool {
	for i := 0; i < edges.n; i++ {
		if edges.list[i].held == held && edges.list[i].taken == taken {
			return true
		}
	}
	return false
}

// pop removes lock from what gid holds, innermost first, and says whether
// gid held it.
//
//go:norace
func pop(gid int64, lock unsafe.Pointer) bool {
	sh := &shards[uint64(gid)%shardCount]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	g := sh.find(gid, false)
	return g != nil && sh.drop(g, lock)
}

//go:norace
func (sh *shard) drop(g *gstate, lock unsafe.Pointer) bool {
	for i := g.n - 1; i >= 0; i-- {
		if g.held[i].lock != lock {
			continue
		}
		for j := i; j < g.n-1; j++ {
			g.held[j] = g.held[j+1]
		}
		g.n--
		g.held[g.n] = heldLock{}
		if g.n == 0 {
			sh.retire(g)
		}
		return true
	}
	return false
}

// popAnywhere removes lock from the goroutine that holds it: an Unlock on
// a goroutine other than the one that locked.
//
//go:norace
func popAnywhere(lock unsafe.Pointer) {
	for i := range shards {
		sh := &shards[i]
		sh.mu.Lock()
		for g := sh.live; g != nil; g = g.next {
			if sh.drop(g, lock) {
				sh.mu.Unlock()
				return
			}
		}
		sh.mu.Unlock()
	}
	edges.mu.Lock()
	edges.strays++
	edges.mu.Unlock()
}

//go:norace
func snapshot() (list []edgeRec, strays, deep, full int) {
	edges.mu.Lock()
	defer edges.mu.Unlock()
	list = make([]edgeRec, edges.n)
	for i := range list {
		list[i] = edges.list[i]
	}
	return list, edges.strays, edges.deep, edges.full
}

func observed() Observation {
	runtime.RaceDisable()
	list, strays, deep, full := snapshot()
	runtime.RaceEnable()
	o := Observation{Strays: strays, Deep: deep, Dropped: full}
	for _, e := range list {
		o.Edges = append(o.Edges, e.edge())
	}
	return o
}

func (e edgeRec) edge() Edge {
	return Edge{Held: e.held, Taken: e.taken, HeldAt: frames(e.heldAt), TakenAt: frames(e.takenAt)}
}

func frames(s site) []string {
	n := 0
	for n < len(s) && s[n] != 0 {
		n++
	}
	var out []string
	fs := runtime.CallersFrames(s[:n])
	for {
		f, more := fs.Next()
		if f.Function != "" {
			out = append(out, fmt.Sprintf("%s (%s:%d)", shortFunc(f.Function), shortFile(f.File), f.Line))
		}
		if !more {
			return out
		}
	}
}

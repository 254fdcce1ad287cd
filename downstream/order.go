package downstream

import (
	"slices"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Order within a flush ("Eventual consistency considerations";
// docs/architecture.md, invariant 7 "Order is kept"): Clusters and
// endpoints before the Listeners and Routes that use them, and a stale
// resource removed only once nothing points at it. Changes that pile up on
// a stream (a slow client, a flush waiting on a send) coalesce per type and
// a type's flush sends its latest state, so the order in which upstream
// sent the changes says nothing about the order of those states: a Route's
// latest may point at a Cluster added after the Route's first pending
// change, and a Cluster's latest may lack one a Route still used when the
// Cluster's first pending change arrived. So a flush sends each type's
// additions and changes in the spec's order (xds.Rank: CDS, EDS, LEDS,
// LDS, RDS, ...), whatever the order upstream sent them in, and what the
// types remove last, in the reverse order: a Listener or Route stops
// pointing at a name before the name goes. A stream that keeps up flushes
// each change on its own, in the order upstream sent it, and the cache
// releases a removal only after the change that ended its references
// (invariant 18 "Make before break, whatever the order upstream"), so
// that order holds across flushes too.
//
// The endpoints of a Cluster new to the stream go out only once the
// client asks for them, after it reads the Cluster: on ADS the flushes
// keep the Listeners and Routes back behind such a Cluster until the
// client answers the response that carried it, bounded (warmorder.go),
// so that an Envoy has the Cluster warmed before a Route points at it.
//
// An incremental flush of a type that adds and removes, followed by
// another type, sends its removals in a trailing response (heldRemovals).
// A SotW response is the type's whole state, so its removals cannot be
// split out: a Listener or Cluster state that only removes goes after the
// other types (removesOnly; sotwStream.flushFull and flushWildcard hold
// it); one that adds and removes goes in the spec's order, with its
// removals. A flush of one type sends one response, as it would anyway:
// the last type of a flush holds nothing back.
//
// A flush reads its types one after another, and what the cache releases
// between two reads (a Cluster, then the Route that waited for it) would
// reach the client Route first: before a flush sends a type it has read,
// it sends what was marked meanwhile of the types of lower rank, and reads
// its type again (readOrdered). The cache makes nothing readable before
// the marks of what came earlier are on every watch (cache.Apply: an op is
// marked before the next is made, and the Route a Cluster's arrival
// releases is an op of its own, after the Cluster's), so the look finds
// the Cluster's mark. An incremental flush reads only the names it was
// marked for, so a removal released after it took its marks goes in the
// next flush, with the change that released it; the edge that remains (a
// SotW read is the whole state) is in docs/architecture.md, invariant 7
// "Order is kept".

// typeSet is a set of types, a bit each by xds.Rank: the types a stream
// has asked for, so that a flush of one type can tell in a bit test that
// the stream holds nothing it orders against, and skip what ordering
// costs (a look at the watch's marks at every read).
type typeSet uint32

// rankBit is the bit of a type of rank r; unknown types share the last.
func rankBit(r int) typeSet { return 1 << min(r, 31) }

// add adds typeURL.
func (s *typeSet) add(typeURL string) { *s |= rankBit(xds.Rank(typeURL)) }

// below reports whether s holds a type of lower rank than r.
func (s typeSet) below(r int) bool { return s&(rankBit(r)-1) != 0 }

// heldTypes are the types that a new Cluster's warming holds back
// (heldByWarming).
var heldTypes = func() typeSet {
	var s typeSet
	for _, t := range xds.Types {
		if heldByWarming(t) {
			s.add(t)
		}
	}
	return s
}()

// ordered sorts the dirty types in place into the spec's order and returns
// them.
func ordered(dirty cache.DirtySet) cache.DirtySet {
	if len(dirty) > 1 {
		slices.SortFunc(dirty, func(a, b *cache.Dirty) int {
			return xds.Rank(a.TypeURL) - xds.Rank(b.TypeURL)
		})
	}
	return dirty
}

// heldRemovals is what an incremental flush of a type removed, sent after
// the flush's other types: a response of removals alone, of the version
// the flush read. It keeps nothing of the flush's view but values: the
// view's lookups may be on the flush's stack.
type heldRemovals struct {
	ds       *deltaStream
	typeURL  string
	version  uint64
	trace    cache.Trace
	received int64 // Unix nanoseconds
	names    []string
}

func (h heldRemovals) send() error {
	v := cache.View{Version: h.version, Trace: h.trace, Received: fromUnix(h.received)}
	return h.ds.respond(h.typeURL, h.ds.types.get(h.typeURL), &v, nil, h.names)
}

// holdRemovals returns the send of names removed of typeURL at v, for
// flushAll to call after the other types; nil if there are none.
func (ds *deltaStream) holdRemovals(typeURL string, v *cache.View, names []string) func() error {
	if len(names) == 0 {
		return nil
	}
	h := heldRemovals{ds: ds, typeURL: typeURL, version: v.Version, trace: v.Trace,
		received: unixNano(v.Received), names: names}
	return h.send
}

// removesOnly reports whether st is what the client was last sent of a
// wildcard-only subscription less some resources: the state only removes.
func (t *sotwType) removesOnly(st *cache.State) bool {
	if !t.responded {
		return false
	}
	if t.sentState == nil {
		if len(st.Resources) >= t.sent.len() {
			return false
		}
		for _, r := range st.Resources {
			if holding(&t.sent, r.Name, r) != holdsCurrent {
				return false
			}
		}
		return true
	}
	prev := t.sentState.Resources
	if len(st.Resources) >= len(prev) {
		return false
	}
	i := 0 // both are sorted by name
	for _, r := range st.Resources {
		for i < len(prev) && prev[i].Name < r.Name {
			i++
		}
		if i == len(prev) || prev[i].Name != r.Name || prev[i].Version != r.Version {
			return false
		}
	}
	return true
}

// heldSend is a response a flush held back, of a type of rank (xds.Rank).
type heldSend struct {
	rank int
	send func() error
}

// sendHeld sends what the flush held back, the removals: the types in the
// reverse of the spec's order, a type's in the order the flush read them,
// each followed by what it warms.
func (b *streamBase) sendHeld(f flusher) error {
	if len(b.held) > 1 {
		slices.SortStableFunc(b.held, func(x, y heldSend) int { return y.rank - x.rank })
	}
	for _, h := range b.held {
		if err := h.send(); err != nil {
			return err
		}
		if err := b.flushWarm(f); err != nil {
			return err
		}
	}
	return nil
}

// dropHeld ends a flush: it keeps nothing of what the flush held back.
func (b *streamBase) dropHeld() {
	clear(b.held)
	b.held, b.flushing = nil, nil
}

// maxLowerRounds bounds how many times a flush reads a type again because
// a type of lower rank was marked meanwhile: a stream whose Clusters change
// without pause still gets its Routes, the last read as it is.
const maxLowerRounds = 4

// readOrdered reads a type of the flush with read, which stores what it
// read in its caller's variables (they may point at the caller's stack),
// until nothing of a type of lower rank waits: "Eventual consistency
// considerations", a Cluster before the Route that points at it. The flush
// reads one type after another, not all at one instant, and the cache may
// release a Cluster and a Route that points at it (make before break:
// cache/refs.go) between its read of the Clusters and its read of the
// Routes. So, once it has read a type, the flush looks at the stream's
// marks: if a type of lower rank was marked meanwhile, it sends that first
// (lowerFirst) and reads its own type again, for a state at least as
// recent as what it just sent. One look at the marks per read; nothing
// more when nothing lower waits. The look is enough: the cache makes a
// released Route readable only once the Cluster's mark is on every watch
// (cache.Apply; docs/architecture.md, invariant 7 "Order is kept").
func (b *streamBase) readOrdered(typeURL string, read func()) error {
	for round := 0; ; round++ {
		read()
		if round == maxLowerRounds {
			return nil
		}
		sent, err := b.lowerFirst(typeURL)
		if err != nil || !sent {
			return err
		}
	}
}

// lowerFirst sends, while a flush sends its types' additions, what changed
// of the types of lower rank than typeURL since the flush took its marks,
// each with what it warms and holding back its removals as the flush does;
// it reports whether there was any. A per-type stream has one type.
func (b *streamBase) lowerFirst(typeURL string) (bool, error) {
	if b.flushing == nil || b.fixed != "" {
		return false, nil
	}
	rank := xds.Rank(typeURL)
	if !b.asked.below(rank) { // nothing the stream holds goes before it
		return false, nil
	}
	var buf [2]*cache.Dirty
	lower := b.watch.TakeBelow(rank, buf[:0])
	if len(lower) == 0 {
		return false, nil
	}
	defer b.watch.RecycleRecords(lower)
	return true, b.flushTypes(ordered(lower), true)
}

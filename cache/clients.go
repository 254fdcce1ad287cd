package cache

import (
	"slices"
	"strings"
)

// Clients counted as clients (docs/architecture.md, invariant 19 "Count as
// it happens"): beside the per-resource counters (convergence.go), which
// count a client once per resource it holds, each client (a Watch) has one
// standing per type, and the group counts its clients per type by
// standing. The standing follows from what the events tell: the client's
// moves (how many of the type's resources it stands with, pending,
// accepted or rejected: Mover.Client), its registration for the type, a
// change of the type marked on it and not yet taken (a flush is owed), and
// the changes of the type the rollout holds from it. Each event updates
// one client's record and at most two counts, under the counters' mu; a
// query reads the counts, in O(types), and never visits a client.

// ClientCounts is how many of a group's clients stand where with a type,
// each client counted once, whatever the number of resources it holds: in
// the first that applies of rejected, behind, pending, accepted and
// waiting.
type ClientCounts struct {
	Type string
	// Subscribed is every client counted: those registered for the type,
	// and those leaving it that still hold some of it.
	Subscribed int
	Rejected   int // rejected a resource it holds (CSDS: NACKED)
	Behind     int // owed a change of the type not sent yet: a slow client, a held rollout
	Pending    int // sent something not answered yet
	Accepted   int // holds the type's resources it was sent, every one acknowledged
	Waiting    int // holds nothing of the type yet and is owed nothing
	// Peers are the fleet peers' streams of the type (Watch.SetPeer),
	// left out of the counts above: each is a member relaying the group
	// to clients of its own, counted there.
	Peers int
}

// clientClass is where a client stands with a type, as ClientCounts
// counts it.
type clientClass uint8

const (
	classNone clientClass = iota // not counted
	classWaiting
	classPending
	classAccepted
	classRejected
	classBehind
	numClasses
)

// clientRec is one client's record of one type; guarded by the counters'
// mu of the cache the watch is registered with. 40 bytes: a watch holds
// one per type, the first in itself (Watch.convOne).
type clientRec struct {
	typeURL string
	n       [3]int32    // resources it stands with pending, accepted and rejected
	held    int32       // changes of the type the rollout holds from it
	reg     bool        // registered for the type, by name or with the wildcard
	dirty   bool        // marked with a change of the type it has not taken
	class   clientClass // as counted
}

// count is the number of resources it stands with at a (not Unsent).
func (r *clientRec) count(a Answer) *int32 { return &r.n[a-Pending] }

// classify is where the record stands.
func (r *clientRec) classify() clientClass {
	switch {
	case *r.count(Rejected) > 0:
		return classRejected
	case r.dirty || r.held > 0:
		return classBehind
	case *r.count(Pending) > 0:
		return classPending
	case *r.count(Accepted) > 0:
		return classAccepted
	case r.reg:
		return classWaiting
	}
	return classNone
}

// counted reports whether a standing counts in a client's record: a
// version held, pending, accepted or rejected.
func counted(s Standing) bool { return s.Answer != Unsent && s.Version != "" }

// recLocked is w's record of typeURL; made if make and there is none, else
// nil. The pointer holds until the next record is made or dropped. Call
// with the counters' mu held.
func recLocked(w *Watch, typeURL string, make bool) *clientRec {
	for i := range w.conv {
		if w.conv[i].typeURL == typeURL {
			return &w.conv[i]
		}
	}
	if !make {
		return nil
	}
	if w.conv == nil {
		w.conv = w.convOne[:0]
	}
	w.conv = append(w.conv, clientRec{typeURL: typeURL})
	return &w.conv[len(w.conv)-1]
}

// total is how many a type's counts count; 0 for none.
func total(n *[numClasses]int) int {
	if n == nil {
		return 0
	}
	t := 0
	for _, c := range n[classNone+1:] {
		t += c
	}
	return t
}

// classLocked counts w's record where it stands now, and drops it once it
// counts nowhere (r is then no longer w's). Call with the counters' mu
// held.
func (cv *convergence) classLocked(w *Watch, r *clientRec) {
	c := r.classify()
	if c == r.class {
		return
	}
	byType := &cv.clients
	if w.peer {
		byType = &cv.peers
	}
	if *byType == nil {
		*byType = make(map[string]*[numClasses]int)
	}
	counts := (*byType)[r.typeURL]
	if counts == nil {
		counts = new([numClasses]int)
		(*byType)[r.typeURL] = counts
	}
	if r.class != classNone {
		counts[r.class]--
	}
	if c != classNone {
		counts[c]++
	}
	r.class = c
	if c == classNone {
		last := len(w.conv) - 1
		*r = w.conv[last]
		w.conv[last] = clientRec{}
		w.conv = w.conv[:last]
	}
}

// tallyLocked moves n resources of client w's type from standing from to
// to, as the per-resource counters moved them. Call with the counters' mu
// held; nothing for a nil w.
func (cv *convergence) tallyLocked(w *Watch, typeURL string, from Standing, nFrom int, to Standing, nTo int) {
	if w == nil || (!counted(from) || nFrom == 0) && (!counted(to) || nTo == 0) {
		return
	}
	r := recLocked(w, typeURL, true)
	if counted(from) {
		*r.count(from.Answer) = max(*r.count(from.Answer)-int32(nFrom), 0)
	}
	if counted(to) {
		*r.count(to.Answer) += int32(nTo)
	}
	cv.classLocked(w, r)
}

// registeredLocked records whether w is registered for typeURL, as its
// registrations now say. Call with the cache's mu held.
func (c *Cache) registeredLocked(w *Watch, typeURL string) {
	in := w.regs.get(typeURL).in()
	w.mu.Lock()
	defer w.mu.Unlock()
	if in {
		w.owner = &c.conv
	}
	cv := &c.conv
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if r := recLocked(w, typeURL, in); r != nil {
		r.reg = in
		cv.classLocked(w, r)
	}
}

// releasedLocked forgets what w is owed: it left the cache, which marks
// and holds nothing for it any more. What it holds leaves with its moves.
// Call with the cache's mu held.
func (c *Cache) releasedLocked(w *Watch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.owner = nil
	cv := &c.conv
	cv.mu.Lock()
	defer cv.mu.Unlock()
	for i := len(w.conv) - 1; i >= 0; i-- { // from the last: a record dropped takes the last's place
		r := &w.conv[i]
		r.reg, r.dirty, r.held = false, false, 0
		cv.classLocked(w, r)
	}
}

// markedLocked records that w was marked with a change of typeURL, which
// it owes its client until it takes it. Call with w.mu held: the marks and
// takes of a watch are counted in their order.
func (w *Watch) markedLocked(typeURL string) {
	if cv := w.owner; cv != nil {
		cv.mu.Lock()
		cv.dirtyLocked(w, typeURL, true)
		cv.mu.Unlock()
	}
}

// takenLocked records that w took what d holds. Call with w.mu held.
func (w *Watch) takenLocked(d DirtySet) {
	if cv := w.owner; cv != nil && len(d) > 0 {
		cv.mu.Lock()
		for _, x := range d {
			cv.dirtyLocked(w, x.TypeURL, false)
		}
		cv.mu.Unlock()
	}
}

// dirtyLocked sets whether w owes its client a change of typeURL. Call with
// the counters' mu held.
func (cv *convergence) dirtyLocked(w *Watch, typeURL string, on bool) {
	if r := recLocked(w, typeURL, on); r != nil && r.dirty != on {
		r.dirty = on
		cv.classLocked(w, r)
	}
}

// heldLocked adds d to the changes of typeURL the rollout holds from each
// of ws. Call with the cache's mu held.
func (c *Cache) heldLocked(typeURL string, ws []*Watch, d int) {
	if len(ws) == 0 {
		return
	}
	cv := &c.conv
	cv.mu.Lock()
	defer cv.mu.Unlock()
	for _, w := range ws {
		r := recLocked(w, typeURL, d > 0)
		if r == nil {
			continue
		}
		r.held = max(r.held+int32(d), 0)
		cv.classLocked(w, r)
	}
}

// unheldLocked takes a released change of typeURL out of what the rollout
// holds from ws: those the release marks (in marked) are owed it until
// they take it, as if marked already, so that none looks up to date
// before its mark. Call with the cache's mu held.
func (c *Cache) unheldLocked(typeURL string, ws []*Watch, marked map[*Watch][]string) {
	if len(ws) == 0 {
		return
	}
	cv := &c.conv
	cv.mu.Lock()
	defer cv.mu.Unlock()
	for _, w := range ws {
		r := recLocked(w, typeURL, false)
		if r == nil {
			continue
		}
		r.held = max(r.held-1, 0)
		if _, ok := marked[w]; ok && r.reg {
			r.dirty = true
		}
		cv.classLocked(w, r)
	}
}

// ClientSummary is, per type, where the group's clients stand, each counted
// once; sorted by type. It costs a visit of the types.
func (c *Cache) ClientSummary() []ClientCounts {
	cv := &c.conv
	cv.mu.Lock()
	defer cv.mu.Unlock()
	out := make([]ClientCounts, 0, len(cv.clients))
	for typeURL, n := range cv.clients {
		cc := ClientCounts{Type: typeURL, Rejected: n[classRejected], Behind: n[classBehind], Pending: n[classPending],
			Accepted: n[classAccepted], Waiting: n[classWaiting], Peers: total(cv.peers[typeURL])}
		cc.Subscribed = cc.Rejected + cc.Behind + cc.Pending + cc.Accepted + cc.Waiting
		if cc.Subscribed > 0 || cc.Peers > 0 {
			out = append(out, cc)
		}
	}
	for typeURL, n := range cv.peers {
		if _, ok := cv.clients[typeURL]; !ok && total(n) > 0 {
			out = append(out, ClientCounts{Type: typeURL, Peers: total(n)})
		}
	}
	slices.SortFunc(out, func(a, b ClientCounts) int { return strings.Compare(a.Type, b.Type) })
	return out
}

package cache

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// Convergence: who has which version of each resource, counted as it
// happens (docs/architecture.md, invariant 19 "Count as it happens"). The
// downstream tells the cache each time a client's standing with a resource
// changes (sent a version, ACKed or NACKed it, left); the cache keeps, per
// type, name and version, how many clients stand where. Reading them
// (Convergence) costs what the answer costs and never visits a stream.
//
// The counters sit beside the versions, not in the cache's lock: they have
// their own, which Move takes alone, so that a send or an ACK never waits
// on an upstream change.

// Answer is where a client stands with the version of a resource it holds.
type Answer uint8

// The answers, as a client's per-resource status (CSDS) shows them.
const (
	Unsent   Answer = iota // holds no version: not sent yet, told it does not exist, or gone
	Pending                // sent, not answered yet (CSDS: REQUESTED with a version)
	Accepted               // ACKed (CSDS: ACKED)
	Rejected               // NACKed (CSDS: NACKED)
)

// Standing is a client's version of a resource and its answer to it.
type Standing struct {
	Version string
	Answer  Answer
}

// Mover is who moves, told to Move.
type Mover struct {
	// Client is the client's watch, whose own standing with the type
	// (ClientSummary) the move changes; nil: counted per resource only.
	Client *Watch
	Node   string // the client's node id, clipped; kept for a NACK
	Error  string // the NACK's message, clipped
	// Since is when the client last accepted anything of the type (or its
	// stream opened): an ACK counts towards a version's time to accept
	// only if the version arrived after it, so that a version sent again
	// unchanged is not timed twice.
	Since time.Time
}

// Bounds of what a version keeps of its clients.
const (
	// MaxRejectedBy is how many node ids a version keeps of those that
	// rejected it.
	MaxRejectedBy = 8
	// maxAckSample is how many times to accept a version keeps, a uniform
	// sample of all, for its percentiles.
	maxAckSample = 1024
)

// convergence is every type's counters; guarded by its mu, which is taken
// after the Cache's mu when both are held.
type convergence struct {
	mu    lockorder.Mutex[convergenceMu]
	types map[string]map[string]*convName // type → name → its versions
	// shared counts the clients that stand with a whole complete state
	// (MoveShared), pending or accepted, once per state rather than once
	// per resource of it.
	shared map[*State]*convShared
	// lastSent is, per type, the counted state whose versions are their
	// names' latest (convName.latest) as of its last send: sending it
	// again changes none.
	lastSent map[string]*convShared
	// tell is whether first rejections are told (Options.OnRejected);
	// firsts holds those a move made, until its caller lets the lock go.
	tell   bool
	firsts []Rejection
	// clients counts, per type, the clients in each class (clients.go).
	clients map[string]*[numClasses]int
	// peers counts, per type, the fleet peers' streams (Watch.SetPeer),
	// apart from the clients.
	peers map[string]*[numClasses]int
}

// convName is what clients hold of one name: the versions any of them
// stands with, and the latest one sent (kept even when nobody stands with
// it, for its time to accept).
type convName struct {
	versions map[string]*convVersion
	latest   string
}

// convVersion counts the clients that stand with one version.
type convVersion struct {
	received     time.Time // when the change that brought it arrived, as the first send of it read it
	pending      int
	accepted     int
	rejected     int
	pendingSince time.Time // when pending last rose from zero
	firstError   string    // the first NACK's message
	rejectedBy   []string  // node ids of clients that rejected it, up to MaxRejectedBy
	acks         []time.Duration
	acksFirst    [2]time.Duration // acks' first array: the first ACKs of a version cost no allocation
	ackCount     int              // acks timed; acks is a uniform sample of them
	acksSorted   bool             // acks is in order (the sample is a set: its order is free)
	maxAck       time.Duration
	// states are the counted complete states that hold this version: their
	// clients count here too (see convShared).
	states []*convShared
}

// zero says nobody stands with the version, by name or through a state.
func (v *convVersion) zero() bool {
	return v.pending == 0 && v.accepted == 0 && v.rejected == 0 && len(v.states) == 0
}

// counts is how many clients stand with the version, by name and through
// the complete states that hold it, and since when the count of pending
// ones has been above zero: the earliest rise from zero of its parts, as
// no pending client of any part came before it.
func (v *convVersion) counts() (pending, accepted, rejected int, pendingSince time.Time) {
	pending, accepted, rejected = v.pending, v.accepted, v.rejected
	if v.pending > 0 {
		pendingSince = v.pendingSince
	}
	for _, s := range v.states {
		if s.pending > 0 && (pendingSince.IsZero() || s.pendingSince.Before(pendingSince)) {
			pendingSince = s.pendingSince
		}
		pending += s.pending
		accepted += s.accepted
	}
	return pending, accepted, rejected, pendingSince
}

func (v *convVersion) count(a Answer) *int {
	switch a {
	case Pending:
		return &v.pending
	case Accepted:
		return &v.accepted
	case Rejected:
		return &v.rejected
	}
	return nil
}

// Move records that a client's standing with name moved from from to
// to; received is when the change that brought to's version arrived (zero
// if unknown), read at the send. It returns the time to accept if the
// move is an ACK that counts (see Mover.Since), else 0. O(1).
func (c *Cache) Move(typeURL, name string, from, to Standing, received, now time.Time, m Mover) time.Duration {
	if from == to {
		return 0
	}
	cv := &c.conv
	cv.mu.Lock()
	took := cv.moveLocked(typeURL, cv.byName(typeURL), name, from, to, received, now, m)
	cv.tallyLocked(m.Client, typeURL, from, 1, to, 1)
	firsts := cv.takeFirstsLocked()
	cv.mu.Unlock()
	c.tellRejected(firsts)
	return took
}

// MoveAll is Move for every resource of from, which a client stood with
// at answer fa, and of to, at answer ta (each sorted by name; a resource
// in both moves once): a complete state sent in place of another, or
// answered. Under one lock; observe is told each time to accept once it
// is let go.
func (c *Cache) MoveAll(typeURL string, from []*Resource, fa Answer, to []*Resource, ta Answer, received, now time.Time, m Mover, observe func(time.Duration)) {
	if len(from) == 0 && len(to) == 0 {
		return
	}
	var took []time.Duration
	firsts := c.moveAllLocked(typeURL, from, fa, to, ta, received, now, m, &took)
	if observe != nil {
		for _, d := range took {
			observe(d)
		}
	}
	c.tellRejected(firsts)
}

// moveAllLocked is MoveAll under the counters' mu, appending the times to
// accept to took; it returns the first rejections to tell.
func (c *Cache) moveAllLocked(typeURL string, from []*Resource, fa Answer, to []*Resource, ta Answer, received, now time.Time, m Mover, took *[]time.Duration) []Rejection {
	cv := &c.conv
	cv.mu.Lock()
	defer cv.mu.Unlock()
	byName := cv.byName(typeURL)
	move := func(name string, f, t Standing) {
		if f == t {
			return
		}
		if d := cv.moveLocked(typeURL, byName, name, f, t, received, now, m); d > 0 {
			*took = append(*took, d)
		}
		cv.tallyLocked(m.Client, typeURL, f, 1, t, 1)
	}
	at := func(r *Resource, a Answer) Standing { return Standing{Version: r.Version, Answer: a} }
	i, j := 0, 0
	for i < len(from) || j < len(to) {
		switch {
		case i < len(from) && j < len(to) && from[i] == to[j]:
			// The same resource, unchanged (a cached one is never changed in place).
			if fa != ta {
				move(to[j].Name, at(from[i], fa), at(to[j], ta))
			} else if n := byName[to[j].Name]; ta == Pending && n != nil && n.latest != to[j].Version {
				delete(cv.lastSent, typeURL)
				n.makeLatest(to[j].Version) // sent again: the latest sent, as MoveShared counts it
			}
			i, j = i+1, j+1
		case j == len(to) || i < len(from) && from[i].Name < to[j].Name:
			move(from[i].Name, at(from[i], fa), Standing{})
			i++
		case i == len(from) || to[j].Name < from[i].Name:
			move(to[j].Name, Standing{}, at(to[j], ta))
			j++
		default:
			move(to[j].Name, at(from[i], fa), at(to[j], ta))
			i, j = i+1, j+1
		}
	}
	return cv.takeFirstsLocked()
}

// convShared counts the clients that stand with every resource of one
// complete state at once, pending or accepted: wildcard SotW streams sent
// the type's shared state (built once, Cache.State), or answering it. A
// client moves in O(1) however many resources the state holds, instead of
// once per resource; the state's versions count its clients through their
// states (convVersion.counts). A state is counted from its first client
// to its last, and holds its versions in the counters meanwhile.
type convShared struct {
	typeURL      string
	pending      int
	accepted     int
	pendingSince time.Time      // when pending last rose from zero
	names        []*convName    // of the state's resources, in order
	versions     []*convVersion // of the state's resources, in order
	newest       []int32        // indexes of versions, latest received first: what an ACK times
	unsorted     bool           // newest is out of order: a version's received was set since
	unreceived   bool           // a version has no received yet: the next send with one sets it
}

// MoveShared records that a client moved from standing with every
// resource of the complete state from, at answer fa, to every resource of
// to, at ta (nil: none): a wildcard SotW client sent the shared state, or
// answering it. The counts are those MoveAll of the states' resources
// makes, and what CSDS shows per resource; pending and accepted are
// counted once per state, in O(1), a rejection once per resource as Move
// counts it, with the node and the error. observe is told each time to
// accept once the counters' lock is let go.
func (c *Cache) MoveShared(typeURL string, from *State, fa Answer, to *State, ta Answer, received, now time.Time, m Mover, observe func(time.Duration)) {
	if from == to && fa == ta && ta != Pending { // sent again, it is a send all the same
		return
	}
	var buf [8]time.Duration
	cv := &c.conv
	cv.mu.Lock()
	took := cv.enterState(typeURL, to, ta, received, now, m, buf[:0]) // first: a state moved to itself stays counted
	cv.leaveState(typeURL, from, fa, now, m)
	cv.tallyLocked(m.Client, typeURL, sharedStanding(from, fa), stateLen(from), sharedStanding(to, ta), stateLen(to))
	firsts := cv.takeFirstsLocked()
	cv.recountLocked(firsts)
	cv.mu.Unlock()
	if observe != nil {
		for _, d := range took {
			observe(d)
		}
	}
	c.tellRejected(firsts)
}

// sharedStanding is a client's standing with each resource of a complete
// state it stands with at a, for its record (clients.go): the answer is
// what counts there.
func sharedStanding(st *State, a Answer) Standing {
	if st == nil {
		return Standing{}
	}
	return Standing{Version: "state", Answer: a}
}

// stateLen is how many resources st holds; 0 for nil.
func stateLen(st *State) int {
	if st == nil {
		return 0
	}
	return len(st.Resources)
}

// Unshare turns one client counted with the whole of st at a (see
// MoveShared) into one counted with each of its resources by name at a,
// as Move counts it; nothing is timed. A rejection is counted by name
// already.
func (c *Cache) Unshare(typeURL string, st *State, a Answer) {
	if st == nil || a != Pending && a != Accepted {
		return
	}
	cv := &c.conv
	cv.mu.Lock()
	defer cv.mu.Unlock()
	s := cv.shared[st]
	if s == nil || *s.count(a) == 0 {
		return
	}
	for _, v := range s.versions {
		if a == Pending && v.pending == 0 {
			v.pendingSince = s.pendingSince
		}
		*v.count(a)++
	}
	cv.leaveState(typeURL, st, a, time.Time{}, Mover{})
}

func (s *convShared) count(a Answer) *int {
	if a == Pending {
		return &s.pending
	}
	return &s.accepted
}

// enterState counts a client in st at a, appending to took the times to
// accept; call with mu held.
func (cv *convergence) enterState(typeURL string, st *State, a Answer, received, now time.Time, m Mover, took []time.Duration) []time.Duration {
	if st == nil || len(st.Resources) == 0 || a == Unsent {
		return took
	}
	if a == Rejected {
		byName := cv.byName(typeURL)
		for _, r := range st.Resources {
			cv.moveLocked(typeURL, byName, r.Name, Standing{}, Standing{Version: r.Version, Answer: a}, received, now, m)
		}
		return took
	}
	s := cv.shared[st]
	if s == nil {
		s = cv.countState(typeURL, st)
	}
	if a == Accepted {
		s.accepted++
		return s.timed(m.Since, now, took)
	}
	if s.pending == 0 {
		s.pendingSince = now
	}
	if cv.lastSent[typeURL] != s || s.unreceived && !received.IsZero() {
		s.sent(st, received)
		if cv.lastSent == nil {
			cv.lastSent = make(map[string]*convShared)
		}
		cv.lastSent[typeURL] = s
	}
	s.pending++
	return took
}

// leaveState takes a client out of st at a; call with mu held.
func (cv *convergence) leaveState(typeURL string, st *State, a Answer, now time.Time, m Mover) {
	if st == nil || len(st.Resources) == 0 || a == Unsent {
		return
	}
	if a == Rejected {
		byName := cv.byName(typeURL)
		for _, r := range st.Resources {
			cv.moveLocked(typeURL, byName, r.Name, Standing{Version: r.Version, Answer: a}, Standing{}, time.Time{}, now, m)
		}
		return
	}
	s := cv.shared[st]
	if s == nil || *s.count(a) == 0 {
		return
	}
	*s.count(a)--
	if s.pending == 0 && s.accepted == 0 {
		cv.uncount(st, s)
	}
}

// countState starts counting clients of st: its resources' versions hold
// it, made if need be. O(resources), once per state.
func (cv *convergence) countState(typeURL string, st *State) *convShared {
	byName := cv.byName(typeURL)
	s := &convShared{typeURL: typeURL, names: make([]*convName, len(st.Resources)),
		versions: make([]*convVersion, len(st.Resources)), newest: make([]int32, len(st.Resources))}
	for i, r := range st.Resources {
		n := byName[r.Name]
		if n == nil {
			n = &convName{versions: make(map[string]*convVersion, 1)}
			byName[r.Name] = n
		}
		v := n.versions[r.Version]
		if v == nil {
			v = &convVersion{}
			n.versions[r.Version] = v
		}
		v.states = append(v.states, s)
		s.names[i], s.versions[i], s.newest[i] = n, v, int32(i)
	}
	s.unsorted = true
	if cv.shared == nil {
		cv.shared = make(map[*State]*convShared)
	}
	cv.shared[st] = s
	return s
}

// uncount stops counting clients of st, which has none left: a version
// nobody else holds goes, as a client's leave and move to nothing make
// it go by name (convName.leave, enter). O(resources), once per state.
func (cv *convergence) uncount(st *State, s *convShared) {
	delete(cv.shared, st)
	if cv.lastSent[s.typeURL] == s {
		delete(cv.lastSent, s.typeURL)
	}
	byName := cv.types[s.typeURL]
	for i, v := range s.versions {
		n, r := s.names[i], st.Resources[i]
		if j := slices.Index(v.states, s); j >= 0 {
			v.states = slices.Delete(v.states, j, j+1)
		}
		if v.zero() && r.Version != n.latest {
			delete(n.versions, r.Version)
		}
		n.forgetLatest()
		if len(n.versions) == 0 && byName[r.Name] == n {
			delete(byName, r.Name)
		}
	}
}

// sent is a send of the state that changes what it holds: its first, one
// after another version of one of its names was sent (convergence.
// lastSent), or one that brings a time of arrival it lacked. As a send
// of each resource would (convName.enter), each version takes received if
// it had no time yet, and becomes its name's latest. O(resources), not
// once per client but once per state, and again only if the type's
// latest versions moved on in between (a canary's state and the released
// one, sent in turn).
func (s *convShared) sent(st *State, received time.Time) {
	s.unreceived = false
	for i, v := range s.versions {
		n, version := s.names[i], st.Resources[i].Version
		if v.received.IsZero() && !received.IsZero() {
			v.received = received
			v.resort()
		}
		s.unreceived = s.unreceived || v.received.IsZero()
		n.makeLatest(version)
	}
}

// resort tells the states that hold the version that its received
// changed.
func (v *convVersion) resort() {
	for _, s := range v.states {
		s.unsorted = true
	}
}

// timed is an ACK of the state: each version that arrived after the
// client's last ACK (Mover.Since) is timed, as convName.enter times it;
// only those are visited.
func (s *convShared) timed(since, now time.Time, took []time.Duration) []time.Duration {
	if s.unsorted {
		slices.SortFunc(s.newest, func(a, b int32) int { return s.versions[b].received.Compare(s.versions[a].received) })
		s.unsorted = false
	}
	for _, i := range s.newest {
		v := s.versions[i]
		if v.received.IsZero() || !v.received.After(since) {
			break
		}
		d := max(now.Sub(v.received), 0)
		v.timed(d)
		if d > 0 {
			took = append(took, d)
		}
	}
	return took
}

// Rejection is a version of a resource that a first client of the group
// rejected (Options.OnRejected): its count of rejecting clients left zero.
type Rejection struct {
	Type, Name, Version string
	Node                string // the rejecting client's node id, clipped
	Error               string // its NACK's message, clipped
	// Clients is how many clients stood with the version, the rejecting
	// one counted, when it rejected it.
	Clients int
}

// takeFirstsLocked hands over the first rejections the moves made since
// it was last called; call with the counters' mu held.
func (cv *convergence) takeFirstsLocked() []Rejection {
	f := cv.firsts
	cv.firsts = nil
	return f
}

// recountLocked sets the Clients of first rejections to the counts as
// they stand now: MoveShared counts a NACK of a state by name before the
// client leaves the state, where moveLocked would count it twice. Call
// with the counters' mu held.
func (cv *convergence) recountLocked(firsts []Rejection) {
	for i := range firsts {
		r := &firsts[i]
		if n := cv.types[r.Type][r.Name]; n != nil && n.versions[r.Version] != nil {
			p, a, rj, _ := n.versions[r.Version].counts()
			r.Clients = p + a + rj
		}
	}
}

// tellRejected tells Options.OnRejected of first rejections, once the
// counters' lock is let go.
func (c *Cache) tellRejected(firsts []Rejection) {
	for _, r := range firsts {
		c.onRejected(r)
	}
}

// byName is a type's counters by name, made if need be; call with mu held.
func (cv *convergence) byName(typeURL string) map[string]*convName {
	if cv.types == nil {
		cv.types = make(map[string]map[string]*convName)
	}
	byName := cv.types[typeURL]
	if byName == nil {
		byName = make(map[string]*convName)
		cv.types[typeURL] = byName
	}
	return byName
}

// moveLocked is Move in a type's counters, byName; call with the
// counters' mu held.
func (cv *convergence) moveLocked(typeURL string, byName map[string]*convName, name string, from, to Standing, received, now time.Time, m Mover) time.Duration {
	n := byName[name]
	if n == nil {
		n = &convName{versions: make(map[string]*convVersion, 1)}
		byName[name] = n
	}
	if to.Answer == Pending && to.Version != n.latest {
		delete(cv.lastSent, typeURL) // the next send of a state sets its names' latest again
	}
	first := cv.tell && to.Answer == Rejected && to.Version != "" &&
		(n.versions[to.Version] == nil || n.versions[to.Version].rejected == 0)
	// Entered first: a version the client stays with is never empty for a
	// moment, so that it keeps its time of arrival and its first error, as
	// MoveShared keeps them.
	took := n.enter(to, received, now, m)
	n.leave(from, m.Node)
	if first {
		r := Rejection{Type: typeURL, Name: name, Version: to.Version, Node: m.Node, Error: m.Error}
		if v := n.versions[to.Version]; v != nil {
			p, a, rj, _ := v.counts()
			r.Clients = p + a + rj
		}
		cv.firsts = append(cv.firsts, r)
	}
	if to.Answer == Unsent || to.Version == "" {
		n.forgetLatest()
	}
	if len(n.versions) == 0 {
		delete(byName, name)
	}
	return took
}

// leave takes a client out of the count of its standing.
func (n *convName) leave(s Standing, node string) {
	v := n.versions[s.Version]
	p := (*int)(nil)
	if v != nil {
		p = v.count(s.Answer)
	}
	if p == nil || *p == 0 {
		return
	}
	*p--
	if s.Answer == Rejected {
		if i := slices.Index(v.rejectedBy, node); i >= 0 {
			v.rejectedBy = slices.Delete(v.rejectedBy, i, i+1)
		}
	}
	if v.zero() && s.Version != n.latest {
		delete(n.versions, s.Version)
	}
}

// forgetLatest drops the latest version sent if it is all that is left
// and nobody holds it: nobody holds the name any more.
func (n *convName) forgetLatest() {
	if l := n.versions[n.latest]; len(n.versions) == 1 && l != nil && l.zero() {
		delete(n.versions, n.latest)
	}
}

// makeLatest makes version, just sent, the name's latest, dropping the
// one before it if nobody holds it.
func (n *convName) makeLatest(version string) {
	if n.latest != version {
		if old := n.versions[n.latest]; old != nil && old.zero() {
			delete(n.versions, n.latest)
		}
		n.latest = version
	}
}

// enter counts a client in its new standing.
func (n *convName) enter(s Standing, received, now time.Time, m Mover) time.Duration {
	if s.Answer == Unsent || s.Version == "" {
		return 0
	}
	v := n.versions[s.Version]
	if v == nil {
		v = &convVersion{}
		n.versions[s.Version] = v
	}
	switch s.Answer {
	case Pending:
		if v.received.IsZero() && !received.IsZero() {
			v.received = received
			v.resort()
		}
		n.makeLatest(s.Version)
		if v.pending == 0 {
			v.pendingSince = now
		}
		v.pending++
	case Accepted:
		v.accepted++
		if !v.received.IsZero() && v.received.After(m.Since) {
			took := max(now.Sub(v.received), 0)
			v.timed(took)
			return took
		}
	case Rejected:
		v.rejected++
		if v.firstError == "" {
			v.firstError = m.Error
		}
		if len(v.rejectedBy) < MaxRejectedBy {
			v.rejectedBy = append(v.rejectedBy, m.Node)
		}
	}
	return 0
}

// timed adds a time to accept to the version's sample (reservoir
// sampling: every ACK is as likely to be kept).
func (v *convVersion) timed(d time.Duration) {
	v.acksSorted = false
	v.ackCount++
	v.maxAck = max(v.maxAck, d)
	if v.acks == nil {
		v.acks = v.acksFirst[:0]
	}
	if len(v.acks) < maxAckSample {
		v.acks = append(v.acks, d)
		return
	}
	if i := rand.IntN(v.ackCount); i < maxAckSample {
		v.acks[i] = d
	}
}

// VersionCount is how many clients stand with one version of a resource.
type VersionCount struct {
	Version  string
	Received time.Time // when the change that brought it arrived; zero if unknown
	Pending  int
	Accepted int
	Rejected int
	// PendingSince is when the count of pending clients last rose from
	// zero: the oldest pending client has waited at most since then.
	PendingSince time.Time
	FirstError   string   // the first NACK's message
	RejectedBy   []string // node ids of rejecting clients, at most MaxRejectedBy
	// Times to accept, from Received to each client's ACK (of clients
	// connected before the change arrived): how many, and the sample's
	// p50, p99 and the maximum.
	Acks          int
	P50, P99, Max time.Duration
}

// ResourceConvergence is where a group's clients stand with one resource.
type ResourceConvergence struct {
	Type, Name string
	// Current is the cache's version of the resource; empty if the cache
	// does not hold it (removed, or not arrived).
	Current string
	// Upstream is the version of the upstream response Current came in
	// (Resource.Upstream); empty if none or if the cache holds none.
	Upstream string
	// Subscribed is how many clients watch the name, by name or with the
	// type's wildcard.
	Subscribed int
	// Behind is how many of them have not been sent Current: a held
	// rollout or guard, a slow client, or one that just came.
	Behind int
	// Versions are the versions clients stand with, Current first.
	Versions []VersionCount
}

// At is the count of Current; zero if no client stands with it.
func (r ResourceConvergence) At() VersionCount {
	if len(r.Versions) > 0 && r.Versions[0].Version == r.Current {
		return r.Versions[0]
	}
	return VersionCount{Version: r.Current}
}

// Convergence reports, for the types (every one if types is empty) and
// names (every one if empty), where the clients stand: the resources the
// cache holds that clients watch, and those clients still hold, sorted by
// type and name, each once. It costs what the answer costs: the resources
// it reports.
func (c *Cache) Convergence(types, names []string) []ResourceConvergence {
	c.mu.RLock()
	defer c.mu.RUnlock()
	c.conv.mu.Lock()
	defer c.conv.mu.Unlock()
	if len(types) == 0 {
		for t := range c.types {
			types = append(types, t)
		}
		for t := range c.conv.types {
			if c.types[t] == nil {
				types = append(types, t)
			}
		}
	}
	var out []ResourceConvergence
	for _, typeURL := range types {
		out = c.convergenceLocked(out, typeURL, names)
	}
	slices.SortFunc(out, func(a, b ResourceConvergence) int {
		return cmp.Or(strings.Compare(a.Type, b.Type), strings.Compare(a.Name, b.Name))
	})
	// A type or name asked for twice is reported once.
	return slices.CompactFunc(out, func(a, b ResourceConvergence) bool { return a.Type == b.Type && a.Name == b.Name })
}

// convergenceLocked appends one type's resources; call with c.mu and the
// counters' mu held.
func (c *Cache) convergenceLocked(out []ResourceConvergence, typeURL string, names []string) []ResourceConvergence {
	t, byName := c.types[typeURL], c.conv.types[typeURL]
	seen := func(name string) bool { return byName[name] != nil }
	add := func(name string) {
		out = append(out, c.resourceLocked(t, typeURL, name, byName[name]))
	}
	if len(names) > 0 {
		for _, n := range names {
			if seen(n) || t != nil && t.entries[n] != nil {
				add(n) // a name of another type is not this one's
			}
		}
		return out
	}
	if t != nil {
		for n, e := range t.entries {
			if t.watchedLocked(e) && !seen(n) {
				add(n)
			}
		}
	}
	for n := range byName {
		add(n)
	}
	return out
}

// watchedLocked reports whether Convergence reports e though no client
// holds a version of it: the cache holds it and a client watches it.
func (t *typeState) watchedLocked(e *entry) bool {
	return e.res != nil && (e.watchers.len() > 0 || len(t.wildcard) > 0)
}

// resourceLocked reports one name; t and n may be nil.
func (c *Cache) resourceLocked(t *typeState, typeURL, name string, n *convName) ResourceConvergence {
	sums := c.resourceCountsLocked(t, name, n)
	r := ResourceConvergence{Type: typeURL, Name: name, Subscribed: sums.Subscribed, Behind: sums.Behind}
	if t != nil && t.entries[name] != nil && t.entries[name].res != nil {
		r.Current, r.Upstream = t.entries[name].res.Version, t.entries[name].res.Upstream
	}
	if n != nil {
		for ver, v := range n.versions {
			if v.zero() && ver != r.Current {
				continue
			}
			r.Versions = append(r.Versions, v.snapshot(ver))
		}
	}
	slices.SortFunc(r.Versions, func(a, b VersionCount) int {
		switch {
		case a.Version == r.Current:
			return -1
		case b.Version == r.Current:
			return 1
		}
		return b.Received.Compare(a.Received)
	})
	return r
}

// snapshot copies the version's counts, with the percentiles of its
// sample, sorted in place once after it changed (a query that follows
// no new ACK sorts nothing).
func (v *convVersion) snapshot(version string) VersionCount {
	vc := VersionCount{Version: version, Received: v.received, FirstError: v.firstError,
		RejectedBy: slices.Clone(v.rejectedBy), Acks: v.ackCount, Max: v.maxAck}
	vc.Pending, vc.Accepted, vc.Rejected, vc.PendingSince = v.counts()
	if s := v.acks; len(s) > 0 {
		if !v.acksSorted {
			slices.Sort(s)
			v.acksSorted = true
		}
		vc.P50, vc.P99 = s[(len(s)-1)*50/100], s[(len(s)-1)*99/100]
	}
	return vc
}

// TypeConvergence sums a type's resources: how many clients, summed over
// the resources, stand where with each one's current version.
type TypeConvergence struct {
	Type       string
	Resources  int // resources reported (see Convergence)
	Subscribed int // clients subscribed, summed over the resources
	Pending    int // sent the current version, not answered yet
	Accepted   int // accepted the current version
	Rejected   int // rejected the current version
	Behind     int // subscribed and not sent the current version
	Older      int // clients standing with another version (accepted, rejected or pending)
}

// ConvergenceSummary sums Convergence per type, sorted by type; it costs
// a visit of the resources, with no copy of them.
func (c *Cache) ConvergenceSummary() []TypeConvergence {
	c.mu.RLock()
	defer c.mu.RUnlock()
	c.conv.mu.Lock()
	defer c.conv.mu.Unlock()
	byType := map[string]*TypeConvergence{}
	sum := func(typeURL string) *TypeConvergence {
		s := byType[typeURL]
		if s == nil {
			s = &TypeConvergence{Type: typeURL}
			byType[typeURL] = s
		}
		return s
	}
	for typeURL, t := range c.types {
		byName := c.conv.types[typeURL]
		for n, e := range t.entries {
			if t.watchedLocked(e) && byName[n] == nil {
				sum(typeURL).add(c.resourceCountsLocked(t, n, nil))
			}
		}
	}
	for typeURL, byName := range c.conv.types {
		for n, cn := range byName {
			sum(typeURL).add(c.resourceCountsLocked(c.types[typeURL], n, cn))
		}
	}
	out := make([]TypeConvergence, 0, len(byType))
	for _, s := range byType {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b TypeConvergence) int { return strings.Compare(a.Type, b.Type) })
	return out
}

func (s *TypeConvergence) add(r TypeConvergence) {
	s.Resources++
	s.Subscribed += r.Subscribed
	s.Pending += r.Pending
	s.Accepted += r.Accepted
	s.Rejected += r.Rejected
	s.Behind += r.Behind
	s.Older += r.Older
}

// resourceCountsLocked is one resource's counts, as resourceLocked
// reports them, without copying its versions.
func (c *Cache) resourceCountsLocked(t *typeState, name string, n *convName) TypeConvergence {
	var r TypeConvergence
	current := ""
	if t != nil {
		if e := t.entries[name]; e != nil {
			if e.res != nil {
				current = e.res.Version
				r.Subscribed = len(t.wildcard)
			}
			r.Subscribed += e.watchers.len()
			if e.res != nil {
				r.Subscribed -= e.both // by name and with the wildcard: one client
			}
		}
	}
	if n != nil {
		for ver, v := range n.versions {
			p, a, rj, _ := v.counts()
			if ver == current {
				r.Pending, r.Accepted, r.Rejected = p, a, rj
			} else {
				r.Older += p + a + rj
			}
		}
	}
	if current != "" {
		r.Behind = max(r.Subscribed-r.Pending-r.Accepted-r.Rejected, 0)
	}
	return r
}

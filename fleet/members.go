package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// Peer is another member as a member dials it.
type Peer struct {
	Addr string // ip:port, as the view names it
	// Name is the host of the fleet.peers entry the address came from:
	// the name a dialer verifies in the member's certificate.
	Name string
}

// Options configure Members.
type Options struct {
	Config
	// Timeout is how long a member may go without answering before it is
	// out of the view (upstream.connect_timeout); required.
	Timeout time.Duration
	// Ask makes the exchange with a peer (Ask over the relay's connection
	// to it); required.
	Ask func(ctx context.Context, p Peer, mine Report) (Report, error)
	// Clients is how many clients this member holds; required.
	Clients func() int
	// Fingerprint is what of this member's configuration the others must
	// share (the relay's group_by and control planes), at most 256 bytes:
	// a member that answers with another is said once (MsgConfigDiffers).
	Fingerprint string
	// Resolve resolves a host name to addresses;
	// net.DefaultResolver.LookupHost if nil.
	Resolve func(ctx context.Context, host string) ([]string, error)
	Logger  *slog.Logger // slog.Default() if nil
}

// Members is one member's view of the fleet. Run keeps it; the relay reads
// it (Owner, View, Excess) and is woken when the view changes (Changed).
type Members struct {
	// Read-only after New.
	opts     Options
	log      *slog.Logger
	every    time.Duration // the probe period
	changed  chan struct{} // capacity 1: the view changed
	instance string        // this process, in its reports (Report.Instance)

	mu      lockorder.Mutex[membersMu]
	self    string             // guarded by mu: this member as the view names it
	selves  map[string]bool    // guarded by mu: every address fleet.self resolves to
	known   map[string]*member // guarded by mu: the other members resolved, by address
	ring    *Ring              // guarded by mu: the view: self and the live members
	since   time.Time          // guarded by mu: when the view last changed
	stale   time.Time          // guarded by mu: the counts answered before it are stale (a shed)
	heard   map[string]bool    // guarded by mu: callers not in fleet.peers, already logged
	refresh time.Time          // owned by Run: when to resolve again
}

// member is another member as this one knows it: guarded by Members.mu.
type member struct {
	peer     Peer
	answered time.Time // its last answer; zero if none yet
	report   Report    // in its last answer
	live     bool      // in the view
	err      string    // why its last ask failed; "" once it answers
	warned   []string  // the errors logged since it last answered (at most maxWarnings)
	me       bool      // it answered as this process: fleet.self is wrong
	says     string    // the self it gave, where that is not its address (logged once)
	config   string    // its fingerprint, where that is not this one's (logged once)
}

// New checks opts and returns the members, this one alone in the view
// until Run hears from the others.
func New(opts Options) (*Members, error) {
	switch {
	case !opts.On():
		return nil, errors.New("fleet: no peers")
	case opts.Timeout <= 0 || opts.Ask == nil || opts.Clients == nil:
		return nil, errors.New("fleet: Options.Timeout, Ask and Clients are required")
	}
	if opts.Resolve == nil {
		opts.Resolve = net.DefaultResolver.LookupHost
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &Members{opts: opts, log: opts.Logger.With("component", "fleet"), changed: make(chan struct{}, 1),
		known: map[string]*member{}, selves: map[string]bool{}, heard: map[string]bool{}, since: time.Now(),
		instance: fmt.Sprintf("%016x", rand.Uint64())}
	m.every = max(min(opts.Refresh, opts.Timeout/4), 10*time.Millisecond)
	if a, ok := canonical(opts.Self); ok {
		m.self, m.selves[a] = a, true
	} else {
		m.self = opts.Self // a name until Run resolves it
	}
	m.ring = NewRing([]string{m.self})
	return m, nil
}

// Changed is signalled (capacity 1) when the view changes.
func (m *Members) Changed() <-chan struct{} { return m.changed }

// Self is this member as the view names it.
func (m *Members) Self() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.self
}

// Owner is the member that owns key in the current view, and whether it
// is this one.
func (m *Members) Owner(key string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.ring.Owner(key)
	return o, o == m.self
}

// Ring is the current view's ring, for many lookups at once.
func (m *Members) Ring() (r *Ring, self string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ring, m.self
}

// Peer is the member at addr as the relay dials it; false if it is not
// known (or is this member).
func (m *Members) Peer(addr string) (Peer, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k := m.known[addr]; k != nil {
		return k.peer, true
	}
	return Peer{}, false
}

// Known are the other members resolved now, live or not.
func (m *Members) Known() []Peer {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Peer, 0, len(m.known))
	for _, k := range m.known {
		out = append(out, k.peer)
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// Run keeps the view until ctx is done: the peers resolved every Refresh,
// every other member asked every probe period, and a member out of the
// view once it has not answered for Timeout less a period (so that it is
// out within Timeout of its last answer).
func (m *Members) Run(ctx context.Context) {
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		m.Round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round resolves the peers if due, asks every other member once and
// judges the view. Run calls it every probe period; a relay calls it once
// as it starts, so that its first view has the members that answer.
func (m *Members) Round(ctx context.Context) {
	if now := time.Now(); !now.Before(m.refresh) {
		m.resolve(ctx)
		m.refresh = now.Add(m.opts.Refresh)
	}
	m.askAll(ctx)
	m.judge(time.Now())
}

// resolve resolves fleet.peers and fleet.self. An entry that fails to
// resolve keeps what it resolved to before: a name server's hiccup is not
// the fleet's end.
func (m *Members) resolve(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	selves, selfOK := m.lookup(ctx, m.opts.Self)
	found := map[string]Peer{}
	failed := map[string]bool{}
	for _, entry := range m.opts.Peers {
		host, _, _ := net.SplitHostPort(entry)
		addrs, ok := m.lookup(ctx, entry)
		if !ok {
			failed[host] = true
			continue
		}
		for _, a := range addrs {
			found[a] = Peer{Addr: a, Name: host}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if selfOK && len(selves) > 0 {
		m.selves = map[string]bool{}
		for _, a := range selves {
			m.selves[a] = true
		}
		if !m.selves[m.self] {
			m.self = selves[0]
		}
	}
	for a, k := range m.known {
		if _, ok := found[a]; !ok && !failed[k.peer.Name] {
			delete(m.known, a)
		}
	}
	for a, p := range found {
		if m.selves[a] {
			continue
		}
		if m.known[a] == nil {
			m.known[a] = &member{peer: p}
		}
	}
}

// lookup resolves a host:port entry to canonical addresses; false if its
// name does not resolve now.
func (m *Members) lookup(ctx context.Context, entry string) ([]string, bool) {
	if a, ok := canonical(entry); ok {
		return []string{a}, true
	}
	host, port, err := net.SplitHostPort(entry)
	if err != nil {
		return nil, false
	}
	ips, err := m.opts.Resolve(ctx, host)
	if err != nil {
		m.log.Warn("a fleet.peers name did not resolve; its last addresses are kept", "name", host, "error", err)
		return nil, false
	}
	var out []string
	for _, ip := range ips {
		if a, ok := canonical(net.JoinHostPort(ip, port)); ok {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), true
}

// canonical is addr (ip:port) as views name it; false if its host is not
// an IP address.
func canonical(addr string) (string, bool) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", false
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String(), true
}

// askAll asks every known member at once, each within a probe period.
func (m *Members) askAll(ctx context.Context) {
	mine := m.report()
	peers := m.Known()
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			actx, cancel := context.WithTimeout(ctx, m.every)
			defer cancel()
			r, err := m.opts.Ask(actx, p, mine)
			if err != nil {
				m.failed(p.Addr, err)
				return
			}
			m.answered(p.Addr, r)
		})
	}
	wg.Wait() // each ask is bounded by its context
}

// report is what this member says of itself.
func (m *Members) report() Report {
	clients := m.opts.Clients()
	m.mu.Lock()
	defer m.mu.Unlock()
	return Report{Self: m.self, Instance: m.instance, Config: m.opts.Fingerprint, Clients: clients, View: m.ring.Members()}
}

// Answer is this member's report, for the exchange's answer.
func (m *Members) Answer() Report { return m.report() }

// answered records a member's answer. An answer from this process is
// no member's: the address is this one's, and fleet.self is not.
func (m *Members) answered(addr string, r Report) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.known[addr]
	switch {
	case k == nil:
	case r.Instance == m.instance:
		if !k.me {
			m.log.Warn(MsgThisReplica, "fleet.self", m.opts.Self, "address", addr)
		}
		k.me, k.err = true, "this replica: fleet.self ("+m.opts.Self+") is not its address"
	default:
		if r.Self != addr && r.Self != k.says {
			m.log.Warn(MsgOtherName, "member", addr, "its fleet.self", r.Self)
		}
		k.says = ""
		if r.Self != addr {
			k.says = r.Self
		}
		if r.Config != m.opts.Fingerprint && r.Config != k.config {
			m.log.Warn(MsgConfigDiffers, "member", addr, "its config", r.Config, "this config", m.opts.Fingerprint)
		}
		k.config = ""
		if r.Config != m.opts.Fingerprint {
			k.config = r.Config
		}
		k.answered, k.report, k.err, k.warned = time.Now(), r, "", nil
	}
}

// The fleet's warnings, as they are logged.
const (
	// MsgThisReplica: a fleet.peers address answered as this replica.
	MsgThisReplica = "fleet.self is not this replica's address: a fleet.peers address answers as this replica; it is left out of the view (no peer stream to itself)"
	// MsgNoAnswer: a member not in the view failed its first ask.
	MsgNoAnswer = "a fleet member does not answer: until it does, this replica fetches from the control plane the groups it would own"
	// MsgLeft: a member in the view stopped answering.
	MsgLeft = "a fleet member stopped answering: it is out of the view"
	// MsgJoined: a member answers and is in the view.
	MsgJoined = "a fleet member answers: it is in the view"
	// MsgOtherName: a member answers with another fleet.self than its
	// address.
	MsgOtherName = "a fleet member names itself otherwise than the address it is reached at: its fleet.self is wrong"
	// MsgConfigDiffers: a member's fingerprint is not this one's.
	MsgConfigDiffers = "a fleet member is configured otherwise than this one (upstream.group_by, the control planes): they group and fetch differently"
	// MsgUnlisted: a caller is not in this member's fleet.peers.
	MsgUnlisted = "a replica not in this one's fleet.peers asks the exchange: the replicas' fleet.peers differ"
)

// maxWarnings bounds the warnings of one member that does not answer.
const maxWarnings = 4

// failed records that a member did not answer. A member not in the view
// is logged at its first failure, and again for each new error (a peer
// that comes up with its TLS set up wrong first refuses, then fails the
// handshake), at most maxWarnings times until it answers; a member in the
// view is logged as it leaves it (judge).
func (m *Members) failed(addr string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.known[addr]
	if k == nil || k.me {
		return
	}
	k.err = err.Error()
	if k.live || len(k.warned) >= maxWarnings || slices.Contains(k.warned, k.err) {
		m.log.Debug("a fleet member did not answer", "member", addr, "error", err)
		return
	}
	k.warned = append(k.warned, k.err)
	m.log.Warn(MsgNoAnswer, "member", addr, "name", k.peer.Name, "error", err)
}

// Heard notes a caller's report, from the exchange it asked: a caller
// that is not in fleet.peers is logged once (the fleet is set up
// differently on the two).
func (m *Members) Heard(caller Report) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if caller.Instance == m.instance || caller.Self == "" || m.heard[caller.Self] || len(m.heard) >= maxReportView {
		return
	}
	if m.known[caller.Self] == nil && !m.selves[caller.Self] {
		m.heard[caller.Self] = true
		m.log.Warn(MsgUnlisted, "caller", caller.Self)
	}
}

// grace is how long after its last answer a member stays in the view.
func (m *Members) grace() time.Duration { return max(m.opts.Timeout-m.every, m.every) }

// judge sets each member in or out of the view by its last answer, and
// signals Changed if the view changed.
func (m *Members) judge(now time.Time) {
	m.mu.Lock()
	view := []string{m.self}
	for a, k := range m.known {
		was := k.live
		k.live = !k.me && !k.answered.IsZero() && now.Sub(k.answered) < m.grace()
		switch {
		case was && !k.live:
			k.warned = append(k.warned[:0], k.err)
			m.log.Warn(MsgLeft, "member", a, "last_answer", k.answered, "error", k.err)
		case !was && k.live:
			m.log.Info(MsgJoined, "member", a)
		}
		if k.live {
			view = append(view, a)
		}
	}
	slices.Sort(view)
	view = slices.Compact(view)
	if slices.Equal(view, m.ring.Members()) {
		m.mu.Unlock()
		return
	}
	m.ring, m.since = NewRing(view), now
	m.mu.Unlock()
	m.log.Info("fleet view changed", "members", view)
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// View is a member's view, as /debug/fleet shows it.
type View struct {
	Self    string       `json:"self"`
	Config  string       `json:"config,omitempty"` // this member's fingerprint (Options.Fingerprint)
	Members []string     `json:"members"`          // live, this one included, sorted
	Since   time.Time    `json:"since"`            // when the view last changed
	Peers   []PeerStatus `json:"peers"`            // every other member resolved
}

// PeerStatus is another member as this one knows it.
type PeerStatus struct {
	Addr     string     `json:"address"`
	Name     string     `json:"name"`
	Live     bool       `json:"live"`
	Answered *time.Time `json:"last_answer,omitempty"`
	Clients  int        `json:"clients"`
	View     []string   `json:"view,omitempty"` // its own view, in its last answer
	Agrees   bool       `json:"agrees"`         // its view is this one's
	// LastError is why the last ask failed; empty once it answers.
	LastError string `json:"last_error,omitempty"`
	// ThisReplica says the address answers as this replica: fleet.self
	// is not this replica's address.
	ThisReplica bool `json:"this_replica,omitempty"`
	// NamesItself is the fleet.self it gave, where that is not its
	// address (its fleet.self is wrong).
	NamesItself string `json:"names_itself,omitempty"`
	// ConfigDiffers is its configuration's fingerprint, where that is not
	// this one's (View.Config): upstream.group_by, the control planes.
	ConfigDiffers string `json:"config_differs,omitempty"`
}

// View is the current view.
func (m *Members) View() View {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := View{Self: m.self, Config: m.opts.Fingerprint, Members: m.ring.Members(), Since: m.since}
	for a, k := range m.known {
		ps := PeerStatus{Addr: a, Name: k.peer.Name, Live: k.live, Clients: k.report.Clients, View: k.report.View,
			Agrees: k.live && slices.Equal(k.report.View, v.Members), LastError: k.err, ThisReplica: k.me, NamesItself: k.says,
			ConfigDiffers: k.config}
		if !k.answered.IsZero() {
			at := k.answered
			ps.Answered = &at
		}
		v.Peers = append(v.Peers, ps)
	}
	slices.SortFunc(v.Peers, func(a, b PeerStatus) int { return strings.Compare(a.Addr, b.Addr) })
	return v
}

// Unreachable counts the members resolved that are not in the view (this
// replica left out, if fleet.peers resolves to it under another address).
func (m *Members) Unreachable() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, k := range m.known {
		if !k.live && !k.me {
			n++
		}
	}
	return n
}

// Disagreeing counts the live members whose view is not this one's.
func (m *Members) Disagreeing() int {
	n := 0
	for _, p := range m.View().Peers {
		if p.Live && !p.Agrees {
			n++
		}
	}
	return n
}

// Excess is how many of its clients this member holds past the bound
// (Bound) of the fleet's mean, from the counts the live members last
// reported: 0 within it, with balance off, alone, or while a count is
// stale (a live member has not answered since this one last shed: Shed).
func (m *Members) Excess(clients int) int {
	if !m.opts.Balance {
		return 0
	}
	m.mu.Lock()
	n, total, fresh := 1, clients, true
	for _, k := range m.known {
		if k.live {
			n++
			total += k.report.Clients
			fresh = fresh && k.answered.After(m.stale)
		}
	}
	m.mu.Unlock()
	if n == 1 || !fresh {
		return 0
	}
	return max(clients-Bound(total, n, m.opts.BalanceSlack), 0)
}

// Bound is the most clients a member of n holding total between them
// keeps: (1 + slack) times the mean, and never less than the mean rounded
// up, plus one. Some member must hold ceil(mean) whenever the mean is not
// whole, and with few clients (a mean under 1/slack) (1 + slack) times
// the mean is below that: every member over it would shed forever, each
// client landing on another that then holds as many. The one more is
// room for a client on its way: shed by one member, counted by another
// before the first hears of it, or reconnecting to the member that shed
// it (a client that dials a member, not a Service).
func Bound(total, n int, slack float64) int {
	mean := float64(total) / float64(n)
	return max(int(math.Floor((1+slack)*mean)), int(math.Ceil(mean))+1)
}

// Shed records that this member closed a client connection to balance the
// fleet: the counts the others reported so far are stale, since the
// client is on its way to one of them, until each has answered again a
// probe period on (the client's time to reconnect). Excess is 0 until then.
func (m *Members) Shed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stale = time.Now().Add(m.every)
}

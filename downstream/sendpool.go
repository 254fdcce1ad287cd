package downstream

import (
	"context"
	"net"
	"reflect"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// How a stream runs on few goroutines.
//
// A stream's gRPC handler goroutine reads its requests and handles them; it
// is the stream's only goroutine while the stream is idle. What the cache
// marks for the stream is flushed by a pool of send workers shared by every
// stream, so a change fanned out to many streams is sent by a few busy
// goroutines rather than by waking a goroutine per stream. A request that
// marks its own stream (a new subscription) is flushed right away on the
// handler's goroutine.
//
// A stream's pump admits one flush at a time, from a worker or from the
// handler, and its mutex keeps handle and flush apart: the protocol state
// is one stream's, whichever goroutine runs it. A send that fails has gRPC
// end the stream, which ends the handler's Recv; Drain closes connections
// (see endStreams); the first request is waited for apart (see
// firstRequest).
//
// A slow client hurts only itself (docs/architecture.md, invariant 5): a
// worker whose send stays blocked for
// slowSend is counted out of the pool and another worker starts, so the
// other streams keep their workers; the stuck send ends at the send timeout,
// when the client's connection is closed (see sendGuard).

// Flush states of a pump.
const (
	pumpIdle    int32 = iota
	pumpQueued        // waiting for a worker (or for the handler)
	pumpRunning       // a flush is running
	pumpRerun         // running, and marked again since the flush started
)

// pump runs one stream's protocol: handle on the handler's goroutine,
// flush wherever the pump is run.
type pump struct {
	pool  *sendPool
	conn  *sendConn // the client connection's queue in the pool
	state atomic.Int32

	mu     lockorder.Mutex[pumpMu] // serializes handle and flush
	flush  func() error            // the protocol's flush; called with mu held
	guard  *sendGuard              // the stream's sends; told which worker flushes (nil in tests)
	stream *streamBase             // the protocol's state, for the first answer (nil in tests); set before the first request
	ended  bool                    // guarded by mu: no flush runs once set
	err    error                   // guarded by mu: the flush error that ended the stream
}

// ready is the stream's watch notification: the cache, or a request, marked
// it. It queues the pump unless a flush is queued or will run again.
func (p *pump) ready() {
	for {
		switch p.state.Load() {
		case pumpIdle:
			if p.state.CompareAndSwap(pumpIdle, pumpQueued) {
				p.pool.submit(p)
				return
			}
		case pumpRunning:
			if p.state.CompareAndSwap(pumpRunning, pumpRerun) {
				return
			}
		default: // queued, or running again: that flush takes the marks
			return
		}
	}
}

// runQueued is a worker's turn: it flushes once, and queues the pump again
// if it was marked meanwhile, behind the streams already waiting.
func (p *pump) runQueued(slot *sendSlot) {
	if !p.state.CompareAndSwap(pumpQueued, pumpRunning) {
		return // the handler flushed it already
	}
	p.flushOnce(slot)
	if !p.state.CompareAndSwap(pumpRunning, pumpIdle) {
		p.state.Store(pumpQueued)
		p.pool.submit(p)
	}
}

// runInline flushes on the calling goroutine (the handler's) what a request
// marked, until nothing is marked. It returns the error that ended the
// stream, if a flush failed.
func (p *pump) runInline() error {
	if !p.state.CompareAndSwap(pumpQueued, pumpRunning) {
		return nil
	}
	for {
		if err := p.flushOnce(nil); err != nil {
			p.state.Store(pumpIdle)
			return err
		}
		if p.state.CompareAndSwap(pumpRunning, pumpIdle) {
			return nil
		}
		p.state.Store(pumpRunning)
	}
}

// flushOnce runs the protocol's flush unless the stream has ended, on the
// worker whose slot is slot (nil: the handler's goroutine). A flush fails
// only when its send does, and gRPC ends a stream whose SendMsg failed (it
// writes the status), which ends the handler's Recv; the handler then
// returns err (see failure).
func (p *pump) flushOnce(slot *sendSlot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return p.err
	}
	if p.guard != nil {
		p.guard.slot = slot
	}
	err := p.flush()
	if err != nil {
		p.ended, p.err = true, err
	}
	if b := p.stream; b != nil && b.first != nil && (b.spoke || p.ended) {
		close(b.first) // the handler's awaitFirst returns
		b.first = nil
	}
	if b := p.stream; b != nil && b.holdWake != nil {
		close(b.holdWake) // the handler's awaitHeld looks again
		b.holdWake = nil
	}
	return err
}

// canEnd says whether the handler returns a flush's error (see
// onlyErrors): while it handles the first request and waits for its
// answer, and never again once it reads requests. It returns the error a
// flush ended the stream with, if one did: one that came after the wait
// and before the handler said no is still the handler's to return.
func (p *pump) canEnd(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stream != nil {
		p.stream.endable = on
	}
	return p.err
}

// awaitFirst holds the handler, after a first request that names what the
// client waits for, until the stream's first response is sent, a flush
// ends the stream, ctx ends or bound passes. A stream ended by a flush
// that ran on a worker ends here, with the flush's error: the handler
// returns it, which only the handler can do. The client sends nothing more
// before it is answered, so no request waits meanwhile (one that does is
// read once this returns). bound 0 waits for nothing.
func (p *pump) awaitFirst(ctx context.Context, bound time.Duration) error {
	p.mu.Lock()
	b := p.stream
	if p.ended || b == nil || b.spoke || bound <= 0 {
		err := p.err
		p.mu.Unlock()
		return err
	}
	b.first = make(chan struct{})
	ch := b.first
	p.mu.Unlock()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b.first = nil
	return p.err
}

// failure is the flush error that ended the stream, if one did.
func (p *pump) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// handle runs the protocol's handle for a request, then flushes what it
// marked. An error ends the stream.
func handle[Req any](p *pump, proto protocol[Req], req *Req) error {
	p.mu.Lock()
	err := p.err
	if !p.ended {
		if err = proto.handle(req); err != nil {
			p.ended, p.err = true, err
		}
	}
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return p.runInline()
}

// end is the handler's last word: no flush runs any more. A flush blocked
// on the client holds mu until it returns: the handler returns because the
// stream's context ended (which ends the send too) or because handle
// failed, which set ended before a flush could start.
func (p *pump) end() {
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
}

// slowSend is how long a send may block a worker before the pool stops
// counting on it and starts another.
const slowSend = 20 * time.Millisecond

// sendPool runs queued pumps on at most size workers that are not blocked
// on a slow client. Workers start when pumps are queued and end when the
// queue is empty, so an idle relay has none.
//
// Pumps queue by connection: a worker takes a connection and flushes the
// pumps queued on it back to back, so that streams sharing a connection
// hand gRPC's writer for that connection a burst it writes in few system
// calls (and their client reads in few), rather than one response per
// wake-up. A connection's pumps have a lock of their own, so that the
// goroutine marking a change for many streams takes the pool's lock once
// per connection rather than once per stream.
//
// Who guards what: size is read-only; the watched slots are guarded by
// watchMu, the queue, the workers' counts and the connections by mu; a
// connection's own queue by its mu. Lock order: a connection's mu, then
// the pool's (enqueue after submit releases the first); watchMu is taken
// alone.
type sendPool struct {
	size int // read-only

	// The sends in progress, watched for slow and stuck clients (see
	// watchdog): a slot per worker, and one per send on a handler's
	// goroutine while it lasts. Guarded by watchMu.
	watchMu  lockorder.Mutex[sendPoolWatchMu]
	slots    map[*sendSlot]struct{}
	watching bool // the watchdog runs

	// The queue and the workers. Guarded by mu.
	mu      lockorder.Mutex[sendPoolMu]
	queue   []*sendConn // connections with pumps queued, FIFO from head
	head    int
	running int // workers running
	blocked int // workers in a send that has been blocked for slowSend
	conns   map[net.Addr]*sendConn
}

// sendConn is the pumps queued for one client connection.
type sendConn struct {
	addr    net.Addr // the key in the pool's conns; nil: the stream's own; read-only
	streams int      // streams registered on the connection; guarded by the pool's mu

	// The connection's queue. Guarded by mu.
	mu      lockorder.Mutex[sendConnMu]
	pumps   []*pump  // queued; in one while a single pump waits
	one     [1]*pump // the usual queue: a connection's one stream
	queued  bool     // in the pool's queue
	serving int      // workers taking its pumps
	blocked int      // of those, blocked in a slow send

	// The connection's per-type EDS streams, which its CDS streams (cds
	// of them) warm (warming.go). Guarded by warmMu.
	warmMu lockorder.Mutex[sendConnWarmMu]
	eds    []*streamBase
	cds    int
}

func newSendPool(size int) *sendPool {
	return &sendPool{size: max(size, 1), conns: map[net.Addr]*sendConn{}, slots: map[*sendSlot]struct{}{}}
}

// sendSlot is where a goroutine that sends shows the send in progress to
// the watchdog.
type sendSlot struct {
	g atomic.Pointer[sendGuard] // nil between sends
}

// watch registers a slot, and starts the watchdog if it is not running.
func (sp *sendPool) watch(s *sendSlot) {
	sp.watchMu.Lock()
	sp.slots[s] = struct{}{}
	start := !sp.watching
	sp.watching = true
	sp.watchMu.Unlock()
	if start {
		go sp.watchdog()
	}
}

func (sp *sendPool) unwatch(s *sendSlot) {
	sp.watchMu.Lock()
	delete(sp.slots, s)
	sp.watchMu.Unlock()
}

// watchdog looks at the sends in progress every watchEvery, while there
// are slots: a send blocked for slowSend is reported to the pool, one
// blocked for the send timeout has its client's connection closed (see
// sendGuard). One ticker for every send, running only while something
// sends, rather than a timer armed and stopped for every send of every
// stream: at many streams the timer's memory is another cold line per
// push.
func (sp *sendPool) watchdog() {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	var due []*sendGuard
	for range t.C {
		sp.watchMu.Lock()
		if len(sp.slots) == 0 {
			sp.watching = false
			sp.watchMu.Unlock()
			return
		}
		for s := range sp.slots {
			if g := s.g.Load(); g != nil {
				due = append(due, g)
			}
		}
		sp.watchMu.Unlock()
		now := time.Now()
		for i, g := range due {
			g.check(now)
			due[i] = nil
		}
		due = due[:0]
	}
}

// watchEvery is how often the watchdog looks: a slow send is noticed
// between slowSend and slowSend+watchEvery after it started.
const watchEvery = slowSend / 2

// conn returns the queue of the connection from addr, for one more stream;
// call release when the stream ends. Streams whose connection is unknown
// (nil), or whose address type cannot be a map key, get one of their own.
// Addresses are compared as values of net.Addr: gRPC gives every stream of
// a connection the connection's own RemoteAddr, so no string is built per
// stream.
func (sp *sendPool) conn(addr net.Addr) *sendConn {
	if addr == nil || !reflect.TypeOf(addr).Comparable() {
		return &sendConn{} // a map key must be comparable
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	c := sp.conns[addr]
	if c == nil {
		c = &sendConn{addr: addr}
		sp.conns[addr] = c
	}
	c.streams++
	return c
}

func (sp *sendPool) release(c *sendConn) {
	if c.addr == nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if c.streams--; c.streams == 0 && sp.conns[c.addr] == c {
		delete(sp.conns, c.addr)
	}
}

func (sp *sendPool) submit(p *pump) {
	c := p.conn
	c.mu.Lock()
	c.pumps = append(c.pumps, p)
	enqueue := !c.queued && c.serving == c.blocked // else a worker serving c takes p too
	c.queued = c.queued || enqueue
	c.mu.Unlock()
	if enqueue {
		sp.enqueue(c, false)
	}
}

// enqueue puts c in the queue, and starts a worker if one may start; a
// worker blocked in a slow send (blocked) no longer counts.
func (sp *sendPool) enqueue(c *sendConn, blocked bool) {
	sp.mu.Lock()
	if blocked {
		sp.blocked++
	}
	if c != nil {
		sp.queue = append(sp.queue, c)
	}
	start := sp.head < len(sp.queue) && sp.running < sp.size+sp.blocked
	if start {
		sp.running++
	}
	sp.mu.Unlock()
	if start {
		go sp.work()
	}
}

func (sp *sendPool) work() {
	slot := &sendSlot{}
	sp.watch(slot)
	defer sp.unwatch(slot)
	for {
		sp.mu.Lock()
		if sp.head == len(sp.queue) {
			sp.queue, sp.head = sp.queue[:0], 0
			sp.running--
			sp.mu.Unlock()
			return
		}
		c := sp.queue[sp.head]
		sp.queue[sp.head] = nil
		sp.head++
		if sp.head > 4096 && sp.head*2 > len(sp.queue) {
			sp.queue, sp.head = sp.queue[:copy(sp.queue, sp.queue[sp.head:])], 0
		}
		sp.mu.Unlock()
		c.mu.Lock()
		c.queued = false
		c.serving++
		c.mu.Unlock()
		c.serve(slot)
	}
}

// serve flushes the pumps queued on c one after the other until none is
// left, those queued meanwhile included. Normally one worker serves a
// connection at a time; another joins when a send on it is slow (see
// slow).
func (c *sendConn) serve(slot *sendSlot) {
	for {
		c.mu.Lock()
		if len(c.pumps) == 0 {
			c.pumps = c.one[:0] // a queue that grew is let go
			c.serving--
			c.mu.Unlock()
			return
		}
		p := c.pumps[0]
		c.pumps[0] = nil
		c.pumps = c.pumps[1:]
		c.mu.Unlock()
		p.runQueued(slot)
	}
}

// slow is called when a send to a stream on c has been blocked for
// slowSend: its worker no longer counts, c goes back in the queue if it
// has other streams waiting (a stream its client stopped reading holds up
// neither the connection's other streams nor other connections), and a
// worker starts in the blocked one's place if any is waiting.
func (sp *sendPool) slow(c *sendConn) {
	requeue := false
	if c != nil {
		c.mu.Lock()
		c.blocked++
		requeue = len(c.pumps) > 0 && !c.queued
		c.queued = c.queued || requeue
		c.mu.Unlock()
	}
	if !requeue {
		c = nil
	}
	sp.enqueue(c, true)
}

// unblocked undoes slow once the send returns.
func (sp *sendPool) unblocked(c *sendConn) {
	if c != nil {
		c.mu.Lock()
		c.blocked--
		c.mu.Unlock()
	}
	sp.mu.Lock()
	sp.blocked--
	sp.mu.Unlock()
}

// liveSet is the streams Drain ends.
type liveSet struct {
	mu       lockorder.Mutex[liveSetMu]
	draining bool
	live     map[*liveStream]struct{}
}

// liveStream is a stream as Drain sees it.
type liveStream struct {
	addr net.Addr // the client's address; nil if unknown
}

// goLive registers a stream that has sent its first request with the
// streams Drain ends (LRS and xDS alike); errDraining once draining. The
// caller removes it when the stream ends.
func (s *Server) goLive(ctx context.Context) (*liveStream, error) {
	ls := &liveStream{}
	if p, ok := peer.FromContext(ctx); ok {
		ls.addr = p.Addr
	}
	if !s.live.add(ls) {
		return nil, errDraining
	}
	return ls, nil
}

// add registers a stream; false once draining.
func (st *liveSet) add(ls *liveStream) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.draining {
		return false
	}
	if st.live == nil {
		st.live = map[*liveStream]struct{}{}
	}
	st.live[ls] = struct{}{}
	return true
}

func (st *liveSet) remove(ls *liveStream) {
	st.mu.Lock()
	delete(st.live, ls)
	st.mu.Unlock()
}

// drain refuses new streams and returns the registered ones.
func (st *liveSet) drain() []*liveStream {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.draining = true
	out := make([]*liveStream, 0, len(st.live))
	for ls := range st.live {
		out = append(out, ls)
	}
	st.live = nil
	return out
}

// endStreams ends every live stream for Drain. A stream's handler is in
// Recv, which only the end of the stream's connection or context ends, and
// gRPC lets nothing else end the context: the connections are closed, and
// clients see UNAVAILABLE and reconnect. A stream on a connection the
// server does not know (not served on Listen) ends when the gRPC server
// stops.
func (s *Server) endStreams() {
	closed := map[string]bool{}
	for _, ls := range s.live.drain() {
		if ls.addr == nil {
			continue
		}
		if addr := ls.addr.String(); !closed[addr] {
			closed[addr] = true
			s.conns.close(addr)
		}
	}
}

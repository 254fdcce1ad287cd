// Package faultproxy is a TCP proxy that injects the faults networks do
// not announce: it forwards connections to a backend and, on command,
// goes silent (connections stay open and carry nothing, as after a
// partition or a lost conntrack entry), trickles (forwards at a bounded
// rate), resets every connection, or accepts new connections without
// answering. Tests and the load tool put it between the relay and its
// control plane.
//
// Given several backends it is also a TCP balancer: each new connection
// goes to the next backend in turn that accepts it, and a backend that
// refuses (a relay that stopped listening to drain) is skipped, as an L4
// load balancer sends new connections away from a backend that left its
// endpoints (a Kubernetes Service drops a pod that is terminating). The
// load tool puts it in front of two relays restarted in turn.
package faultproxy

import (
	"context"
	"errors"
	"maps"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"
)

// Mode is what the proxy does with the bytes of its connections.
type Mode int

const (
	// Pass forwards everything.
	Pass Mode = iota
	// Silent keeps every connection open and forwards nothing, either
	// way; new connections are accepted and dialled through, and carry
	// nothing either: a half-open network, or a hung peer.
	Silent
	// Trickle forwards at a bounded rate: bytesPerSecond, for every
	// connection and direction together, as a slow link would.
	Trickle
)

// Proxy forwards connections accepted on Addr to its backends.
type Proxy struct {
	Addr string // where clients connect

	// Read-only after Start.
	backends []string
	source   *net.TCPAddr // the address dialled from; nil: the system's choice
	ln       net.Listener
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	next atomic.Uint64 // counts connections: the next one tries backends[next%len] first

	mu      sync.Mutex
	mode    Mode                  // guarded by mu
	limit   *rate.Limiter         // for Trickle; guarded by mu
	changed chan struct{}         // closed and replaced at every change of mode and reset; guarded by mu
	conns   map[net.Conn]struct{} // both ends of every pair not reset; guarded by mu
	open    map[string]int        // pairs open per backend; guarded by mu
}

// Start listens on 127.0.0.1:0 and forwards to backends until Close. Each
// new connection goes to the next backend in turn that accepts it: a
// backend that refuses is skipped, and a connection that no backend
// accepts is closed.
func Start(backends ...string) (*Proxy, error) {
	return StartFrom(nil, backends...)
}

// StartFrom is Start with every backend dialled from the address source
// (port 0), as a proxy that binds its own address does: Istio's sidecar
// forwards inbound connections from 127.0.0.6. nil is the system's
// choice, as Start.
func StartFrom(source net.IP, backends ...string) (*Proxy, error) {
	if len(backends) == 0 {
		return nil, errors.New("faultproxy: no backend to forward to")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{Addr: ln.Addr().String(), backends: backends, ln: ln, ctx: ctx, cancel: cancel,
		changed: make(chan struct{}), conns: map[net.Conn]struct{}{}, open: map[string]int{}}
	if source != nil {
		p.source = &net.TCPAddr{IP: source}
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Open returns how many connections are open to each backend that has
// any: where the clients are.
func (p *Proxy) Open() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.open)
}

// Set switches the proxy to mode; bytesPerSecond is the rate for Trickle.
func (p *Proxy) Set(mode Mode, bytesPerSecond int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	p.limit = nil
	if mode == Trickle {
		p.limit = rate.NewLimiter(rate.Limit(bytesPerSecond), max(bytesPerSecond/10, 1))
	}
	p.notifyLocked()
}

// notifyLocked wakes the forwards held while Silent.
func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Reset closes every connection (a reset, as a restarted middlebox
// does); new ones are accepted as before. A pair held while Silent ends
// too: closed, its connections would only show it when the mode changes.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.notifyLocked()
	p.mu.Unlock()
	for c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not FIN
		}
		c.Close()
	}
}

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() {
	p.cancel()
	p.ln.Close()
	p.Reset()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.pair(c)
	}
}

// pair dials a backend for client c and forwards both ways.
func (p *Proxy) pair(c net.Conn) {
	defer p.wg.Done()
	b, backend, err := p.dial()
	if err != nil {
		c.Close()
		return
	}
	if !p.track(backend, c, b) {
		return
	}
	done, closed := make(chan struct{}, 2), make(chan struct{})
	go func() { p.copy(b, c, closed); done <- struct{}{} }()
	go func() { p.copy(c, b, closed); done <- struct{}{} }()
	<-done
	close(closed) // a direction held by Silent gives up too
	c.Close()
	b.Close()
	<-done
	p.untrack(backend, c, b)
}

// dial connects to the next backend in turn that accepts, trying each
// once, and returns which it is.
func (p *Proxy) dial() (net.Conn, string, error) {
	n := uint64(len(p.backends))
	first := p.next.Add(1) - 1
	var err error
	for k := range n {
		backend := p.backends[(first+k)%n]
		d := net.Dialer{}
		if p.source != nil {
			d.LocalAddr = p.source
		}
		c, derr := d.DialContext(p.ctx, "tcp", backend)
		if derr == nil {
			return c, backend, nil
		}
		err = errors.Join(err, derr)
	}
	return nil, "", err
}

func (p *Proxy) track(backend string, cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	p.open[backend]++
	return true
}

func (p *Proxy) untrack(backend string, cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
	if p.open[backend]--; p.open[backend] == 0 {
		delete(p.open, backend)
	}
}

// copy forwards src to dst, as the mode says, until either fails or the
// pair is closed.
func (p *Proxy) copy(dst, src net.Conn, closed <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.forward(dst, buf[:n], closed) != nil {
			return
		}
		if err != nil {
			return
		}
	}
}

// forward writes b to dst once the mode lets it: held while Silent (the
// bytes are not lost: a partition that heals delivers them late, as TCP
// would until it gives up), paced while Trickle; it gives up once the
// pair is closed or reset.
func (p *Proxy) forward(dst net.Conn, b []byte, closed <-chan struct{}) error {
	for len(b) > 0 {
		p.mu.Lock()
		mode, limit, changed := p.mode, p.limit, p.changed
		_, live := p.conns[dst] // not reset
		p.mu.Unlock()
		switch {
		case !live:
			return net.ErrClosed
		case mode == Silent:
			select {
			case <-changed:
				continue
			case <-closed:
				return net.ErrClosed
			case <-p.ctx.Done():
				return p.ctx.Err()
			}
		case mode == Trickle:
			n := min(len(b), limit.Burst())
			if err := limit.WaitN(p.ctx, n); err != nil {
				return err
			}
			select {
			case <-closed:
				return net.ErrClosed
			default:
			}
			if _, err := dst.Write(b[:n]); err != nil {
				return err
			}
			b = b[n:]
		default:
			_, err := dst.Write(b)
			return err
		}
	}
	return nil
}

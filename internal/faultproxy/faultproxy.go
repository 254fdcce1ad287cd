// Package faultproxy is a TCP proxy that injects the faults networks do
// not announce: it forwards connections to a backend and, on command,
// goes silent (connections stay open and carry nothing, as after a
// partition or a lost conntrack entry), trickles (forwards at a bounded
// rate), resets every connection, or accepts new connections without
// answering. Tests and the load tool put it between the relay and its
// control plane.
package faultproxy

import (
	"context"
	"net"
	"sync"

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

// Proxy forwards connections accepted on Addr to a backend.
type Proxy struct {
	Addr    string // where clients connect
	backend string
	ln      net.Listener
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu      sync.Mutex
	mode    Mode                  // guarded by mu
	limit   *rate.Limiter         // for Trickle; guarded by mu
	changed chan struct{}         // closed and replaced at every change of mode; guarded by mu
	conns   map[net.Conn]struct{} // both ends of every pair; guarded by mu
}

// Start listens on 127.0.0.1:0 and forwards to backend until Close.
func Start(backend string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return Serve(ln, backend), nil
}

// Serve forwards the connections ln accepts to backend until Close.
func Serve(ln net.Listener, backend string) *Proxy {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{Addr: ln.Addr().String(), backend: backend, ln: ln, ctx: ctx, cancel: cancel,
		changed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p
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
	close(p.changed)
	p.changed = make(chan struct{})
}

// Mode is the proxy's mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Reset closes every connection (a reset, as a restarted middlebox
// does); new ones are accepted as before.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
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

// pair dials the backend for client c and forwards both ways.
func (p *Proxy) pair(c net.Conn) {
	defer p.wg.Done()
	var d net.Dialer
	b, err := d.DialContext(p.ctx, "tcp", p.backend)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, b) {
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
	p.untrack(c, b)
}

func (p *Proxy) track(cs ...net.Conn) bool {
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
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
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
// would until it gives up), paced while Trickle.
func (p *Proxy) forward(dst net.Conn, b []byte, closed <-chan struct{}) error {
	for len(b) > 0 {
		p.mu.Lock()
		mode, limit, changed := p.mode, p.limit, p.changed
		p.mu.Unlock()
		switch mode {
		case Silent:
			select {
			case <-changed:
				continue
			case <-closed:
				return net.ErrClosed
			case <-p.ctx.Done():
				return p.ctx.Err()
			}
		case Trickle:
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

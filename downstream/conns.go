package downstream

import (
	"net"
	"syscall"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// Listen returns lis with every connection it accepts known to the server,
// so that the connection of a client that reads nothing can be closed (see
// guard). Serve the gRPC server on the result. The connections themselves
// are handed to gRPC unwrapped: its transport reads a bare *net.TCPConn
// only when data is ready, holding no read buffer while a stream is idle.
func (s *Server) Listen(lis net.Listener) net.Listener {
	return &trackingListener{Listener: lis, set: &s.conns}
}

// connSet is the accepted connections by remote address. Closed ones are
// pruned as new ones arrive, once they could be half of the set.
type connSet struct {
	mu        lockorder.Mutex[connSetMu]
	m         map[string]net.Conn // guarded by mu
	pruneSize int                 // guarded by mu; prune when m grows past it
}

// minPrune is the smallest set that is pruned.
const minPrune = 1024

func (cs *connSet) add(c net.Conn) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m, cs.pruneSize = map[string]net.Conn{}, minPrune
	}
	cs.m[c.RemoteAddr().String()] = c
	if len(cs.m) > cs.pruneSize {
		for k, c := range cs.m {
			if closed(c) {
				delete(cs.m, k)
			}
		}
		cs.pruneSize = max(2*len(cs.m), minPrune)
	}
}

// close closes the connection from addr, reporting whether there was one.
func (cs *connSet) close(addr string) bool {
	cs.mu.Lock()
	c := cs.m[addr]
	delete(cs.m, addr)
	cs.mu.Unlock()
	if c == nil {
		return false
	}
	c.Close()
	return true
}

// closed reports whether c has been closed: its descriptor is gone.
func closed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	return raw.Control(func(uintptr) {}) != nil
}

type trackingListener struct {
	net.Listener
	set *connSet
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.set.add(c)
	return c, nil
}

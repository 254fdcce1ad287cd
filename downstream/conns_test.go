package downstream

import (
	"net"
	"testing"
)

// dialPair returns the server side of a new loopback connection to ln.
func dialPair(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The set closes a connection by its remote address, and forgets closed
// connections once they could be half of it.
func TestConnSetClosesAndPrunes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cs := &connSet{m: map[string]net.Conn{}, pruneSize: 3}
	var conns []net.Conn
	for range 3 {
		c := dialPair(t, ln)
		cs.add(c)
		conns = append(conns, c)
	}
	if !cs.close(conns[0].RemoteAddr().String()) {
		t.Fatal("close of a known connection reported none")
	}
	if !closed(conns[0]) {
		t.Error("the connection is still open")
	}
	if cs.close(conns[0].RemoteAddr().String()) {
		t.Error("a second close found the connection again")
	}
	conns[1].Close() // closed elsewhere (by gRPC): pruned later
	cs.add(dialPair(t, ln))
	cs.add(dialPair(t, ln)) // past pruneSize: the closed one goes
	if n := len(cs.m); n != 3 {
		t.Errorf("%d connections in the set, want 3 (the closed one pruned)", n)
	}
	if _, ok := cs.m[conns[1].RemoteAddr().String()]; ok {
		t.Error("the closed connection is still in the set")
	}
}

package loadtest

import "testing"

// Clients share connections by groups of perConn; a connection is dialed
// by the first client that needs it and closed with the last.
func TestConnPoolShares(t *testing.T) {
	p := newConnPool("127.0.0.1:1", 5, 2, &byteCounter{})
	if len(p.conns) != 3 {
		t.Fatalf("%d connection slots for 5 clients at 2, want 3", len(p.conns))
	}
	c0, err := p.acquire(0)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := p.acquire(1)
	c2, _ := p.acquire(2)
	if c0 != c1 || c0 == c2 || p.connections() != 2 {
		t.Errorf("clients 0 and 1 share, 2 does not: %p %p %p, %d dialed", c0, c1, c2, p.connections())
	}
	p.release(0)
	if p.conns[0].conn == nil {
		t.Error("connection closed while client 1 holds it")
	}
	p.release(1)
	p.release(2)
	for i, sc := range p.conns {
		if sc.conn != nil || sc.refs != 0 {
			t.Errorf("slot %d still held: %+v", i, sc)
		}
	}
	c0again, _ := p.acquire(0)
	defer p.release(0)
	if c0again == c0 || p.connections() != 3 {
		t.Errorf("reacquired after the last release: same connection %v, %d dialed; want a new one, 3", c0again == c0, p.connections())
	}
}

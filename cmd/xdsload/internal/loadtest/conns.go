package loadtest

import (
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// connPool shares gRPC connections among clients: client i uses connection
// i/perConn, dialed by the first client that needs it and closed when the
// last one that holds it lets go.
type connPool struct {
	// Read-only after newConnPool.
	target  string
	perConn int
	bytes   *byteCounter

	dialed atomic.Int64 // connections made, over the run

	mu    sync.Mutex
	conns []sharedConn // guarded by mu
}

// sharedConn is one connection and how many clients hold it.
type sharedConn struct {
	conn *grpc.ClientConn
	refs int
}

func newConnPool(target string, clients, perConn int, bytes *byteCounter) *connPool {
	perConn = max(perConn, 1)
	return &connPool{target: target, perConn: perConn, bytes: bytes,
		conns: make([]sharedConn, (clients+perConn-1)/perConn)}
}

// acquire returns client i's connection, dialing it if no client holds it.
// Every acquire is matched by a release.
func (p *connPool) acquire(i int) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sc := &p.conns[i/p.perConn]
	if sc.conn == nil {
		conn, err := p.dial()
		if err != nil {
			return nil, err
		}
		sc.conn = conn
		p.dialed.Add(1)
	}
	sc.refs++
	return sc.conn, nil
}

// release lets go of client i's connection, closing it if no client holds
// it any more.
func (p *connPool) release(i int) {
	p.mu.Lock()
	sc := &p.conns[i/p.perConn]
	sc.refs--
	var conn *grpc.ClientConn
	if sc.refs == 0 {
		conn, sc.conn = sc.conn, nil
	}
	p.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// dial makes a connection as Envoy's to an xDS server: see envoyStreamWindow.
// grpc.NewClient connects lazily, so holding mu across it costs nothing.
func (p *connPool) dial() (*grpc.ClientConn, error) {
	return grpc.NewClient(p.target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(p.bytes),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)),
		grpc.WithStaticStreamWindowSize(envoyStreamWindow),
		grpc.WithStaticConnWindowSize(envoyConnWindow))
}

// connections is how many connections were dialed.
func (p *connPool) connections() int { return int(p.dialed.Load()) }

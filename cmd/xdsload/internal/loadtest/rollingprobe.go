package loadtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// probe is an incremental client of the tool's own on one relay, not
// through the balancer: it subscribes to every name of the pool and holds
// what the relay sends.
type probe struct {
	// Read-only after openProbe.
	conn    *grpc.ClientConn
	s       deltaStream
	cancel  context.CancelFunc // ends the stream
	coding  seqCoding
	st      *soakTracker
	index   map[string]int
	typeURL string

	// Owned by the caller of until.
	held []int // per name of the pool: the update held, -1: none
}

// probeBackoff spaces the probe's attempts to reach a relay that is
// starting.
var probeBackoff = backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 50 * time.Millisecond}

// openProbe subscribes to every name of the pool on the relay at addr,
// waiting for it to listen.
func openProbe(ctx context.Context, addr string, cfg *Config, coding seqCoding, st *soakTracker) (*probe, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)),
		// The relay is starting: try again soon, not after gRPC's 1s.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: probeBackoff, MinConnectTimeout: time.Second}))
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	p := &probe{conn: conn, cancel: cancel, coding: coding, st: st, index: map[string]int{},
		typeURL: coding.kind.typeURL, held: make([]int, st.pool)}
	for j, n := range st.names {
		p.index[n], p.held[j] = j, -1
	}
	if p.s, err = openDelta(sctx, conn, cfg.Type, cfg.ADS, grpc.WaitForReady(true)); err == nil {
		err = p.s.Send(&discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "xdsload-probe", Cluster: cfg.NodeCluster},
			TypeUrl: p.typeURL, ResourceNamesSubscribe: st.names})
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("probe: %w", err)
	}
	return p, nil
}

// until reads the relay's responses, and ACKs them, until done says what
// the probe holds is enough; bound at most, after which the probe's stream
// is ended.
func (p *probe) until(bound time.Duration, done func(held []int) bool) error {
	timer := time.AfterFunc(bound, p.cancel)
	defer timer.Stop()
	for !done(p.held) {
		resp, err := p.s.Recv()
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		for _, r := range resp.GetResources() {
			if j, ok := p.index[r.GetName()]; ok {
				p.held[j] = p.st.version(p.coding, r.GetResource())
			}
		}
		for _, n := range resp.GetRemovedResources() {
			if j, ok := p.index[n]; ok {
				p.held[j] = -1
			}
		}
		if err := p.s.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: p.typeURL, ResponseNonce: resp.GetNonce()}); err != nil {
			return fmt.Errorf("probe: %w", err)
		}
	}
	if !timer.Stop() {
		return errors.New("probe: out of time")
	}
	return nil
}

func (p *probe) close() {
	p.cancel()
	p.conn.Close()
}

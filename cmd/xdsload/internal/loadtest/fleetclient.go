package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// fleetClient is one client of a fleet run: a delta ADS stream to a relay,
// subscribed to the run's names (every resource if none) as a client of
// group g, ACKing what it is sent. When its stream ends it opens another
// on a relay picked at random, as a client behind a Service does: the
// relay balance closed its connection, or was killed.
type fleetClient struct {
	// Read-only after newFleetClients.
	i     int
	group string
	first int // the relay of its first stream

	mu sync.Mutex
	// Guarded by mu: where it is and what it holds.
	relay   int            // the relay of its stream; -1 between streams
	held    map[string]int // name → the update it holds
	got     []time.Time    // by update seq: when it first held it
	streams int            // streams opened that were answered
	// Counted since the last reset (fleetClients.reset): removals it was
	// told of, resources sent again at the update it held on a stream
	// that had answered, and streams that ended.
	removals, resent, ends int
}

// fleetClients are a fleet run's clients.
type fleetClients struct {
	coding  seqCoding
	names   []string // subscribed; empty: every resource
	relays  []string // the relays' xDS addresses
	clients []*fleetClient
	wg      sync.WaitGroup
	// perGroup: each update changes one group (the control plane's
	// snapshot cache, a snapshot per group: updateGroup); else every group
	// (its LinearCache, one for all).
	perGroup bool
	groups   int
}

func newFleetClients(cfg *Config, coding seqCoding, relays []string) *fleetClients {
	fc := &fleetClients{coding: coding, names: cfg.Names, relays: relays, perGroup: cfg.CPCache != CacheLinear, groups: cfg.Fleet.Groups}
	for i := range cfg.Clients {
		fc.clients = append(fc.clients, &fleetClient{i: i, group: groupName(i / len(relays) % cfg.Fleet.Groups), first: i % len(relays),
			relay: -1, held: map[string]int{}, got: make([]time.Time, cfg.Updates+2)}) // the updates, and one after the kill
	}
	return fc
}

// start runs every client until ctx ends, at rate streams a second.
func (fc *fleetClients) start(ctx context.Context, rate float64) {
	launch(ctx, len(fc.clients), rate, func(i int) { fc.wg.Go(func() { fc.run(ctx, fc.clients[i]) }) })
}

// run keeps c on a stream until ctx ends.
func (fc *fleetClients) run(ctx context.Context, c *fleetClient) {
	k := c.first
	for ctx.Err() == nil {
		fc.stream(ctx, c, k)
		c.mu.Lock()
		c.ends++
		c.relay = -1
		c.mu.Unlock()
		k = rand.IntN(len(fc.relays))
		_ = pause(ctx, 20*time.Millisecond) // a client's reconnect backoff
	}
}

// stream holds one stream to relay k until it ends.
func (fc *fleetClients) stream(ctx context.Context, c *fleetClient, k int) {
	conn, err := grpc.NewClient(fc.relays[k], grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return
	}
	defer conn.Close()
	sctx, cancel := streamContext(ctx)
	defer cancel()
	s, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(sctx)
	if err != nil {
		return
	}
	node := &corepb.Node{Id: "xdsload-" + strconv.Itoa(c.i), Cluster: c.group}
	if s.Send(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: fc.coding.kind.typeURL, ResourceNamesSubscribe: fc.names}) != nil {
		return
	}
	c.mu.Lock()
	c.relay = k
	c.mu.Unlock()
	for answered := false; ; answered = true {
		resp, err := s.Recv()
		if err != nil {
			return
		}
		fc.observe(c, resp, answered, time.Now())
		if s.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}) != nil {
			return
		}
	}
}

// observe records a response of c's stream received at t; answered says
// the stream had answered before.
func (fc *fleetClients) observe(c *fleetClient, resp *discoverypb.DeltaDiscoveryResponse, answered bool, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !answered {
		c.streams++
	}
	c.removals += len(resp.GetRemovedResources())
	for _, r := range resp.GetResources() {
		seq := fc.coding.seqOf(r.GetResource())
		if seq < 0 {
			continue
		}
		if held, ok := c.held[r.GetName()]; ok && held == seq && answered {
			c.resent++
		}
		c.held[r.GetName()] = seq
		if seq < len(c.got) && c.got[seq].IsZero() {
			c.got[seq] = t
		}
	}
}

// changes reports whether update seq changes c's group (0, the first
// config, changes every group).
func (fc *fleetClients) changes(c *fleetClient, seq int) bool {
	return seq == 0 || !fc.perGroup || c.group == groupName(updateGroup(seq, fc.groups))
}

// have counts the clients update seq changes that hold it, and those it
// changes.
func (fc *fleetClients) have(seq int) (n, of int) {
	for _, c := range fc.clients {
		if !fc.changes(c, seq) {
			continue
		}
		of++
		c.mu.Lock()
		if !c.got[seq].IsZero() {
			n++
		}
		c.mu.Unlock()
	}
	return n, of
}

// waitHave waits until every client update seq changes holds it, bound at
// most.
func (fc *fleetClients) waitHave(ctx context.Context, seq int, bound time.Duration) error {
	return waitFor(ctx, bound, func() bool { n, of := fc.have(seq); return n == of },
		func() string {
			n, of := fc.have(seq)
			return strconv.Itoa(n) + " of " + strconv.Itoa(of) + " clients hold update " + strconv.Itoa(seq)
		})
}

// reset zeroes the counts since the last reset.
func (fc *fleetClients) reset() {
	for _, c := range fc.clients {
		c.mu.Lock()
		c.removals, c.resent, c.ends = 0, 0, 0
		c.mu.Unlock()
	}
}

// counts sums the counts since the last reset over the clients keep
// selects, and the most stream ends of one client.
func (fc *fleetClients) counts(keep func(*fleetClient) bool) (removals, resent, maxEnds int) {
	for _, c := range fc.clients {
		c.mu.Lock()
		if keep(c) {
			removals += c.removals
			resent += c.resent
			maxEnds = max(maxEnds, c.ends)
		}
		c.mu.Unlock()
	}
	return removals, resent, maxEnds
}

// on counts the clients whose stream is on each relay.
func (fc *fleetClients) on() []int {
	out := make([]int, len(fc.relays))
	for _, c := range fc.clients {
		c.mu.Lock()
		if c.relay >= 0 {
			out[c.relay]++
		}
		c.mu.Unlock()
	}
	return out
}

// waitFor is waitUntil, bound at most, whose error says how far it got
// (what) when the bound passed.
func waitFor(ctx context.Context, bound time.Duration, cond func() bool, what func() string) error {
	if err := waitUntil(ctx, cond, bound); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("after %s: %s", bound, what())
	}
	return nil
}

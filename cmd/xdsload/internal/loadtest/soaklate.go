package loadtest

import (
	"context"
	"fmt"
	"sync"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// lateAsker is an incremental client of the relay, on a connection of its
// own, that asks at the start of each silence of a soak with faults for a
// name no one asked the relay for before: a late name, which the control
// plane serves from the start and no other client subscribes to. The
// relay cannot have it cached when its link goes quiet, and must not say
// that it does not exist (docs/architecture.md, "15. Silence is not an
// answer"): it may say UNAVAILABLE, and must send the name once its link
// is back. The asker holds what arrives and counts what it is told.
type lateAsker struct {
	// Read-only after newLateAsker.
	cfg   *Config
	names []string    // the late names, asked in this order
	first string      // a name of the pool, asked from the start: a first request must name something
	asks  chan string // to the session: capacity len(names)
	node  *corepb.Node

	mu          sync.Mutex
	asked       []string        // guarded by mu
	held        map[string]bool // guarded by mu: late names received
	unavailable int64           // guarded by mu: UNAVAILABLE resource errors for late names
	removals    int64           // guarded by mu: late names told removed, or NOT_FOUND
	firstRm     string          // guarded by mu
}

func newLateAsker(cfg *Config, pool []string) *lateAsker {
	names := lateNames(kinds[cfg.Type], cfg.Soak.lateNames())
	return &lateAsker{cfg: cfg, names: names, first: pool[0], asks: make(chan string, len(names)),
		node: &corepb.Node{Id: "xdsload-late", Cluster: cfg.NodeCluster}, held: map[string]bool{}}
}

// ask asks for the next late name, if one is left.
func (l *lateAsker) ask() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.asked) == len(l.names) {
		return
	}
	name := l.names[len(l.asked)]
	l.asked = append(l.asked, name)
	l.asks <- name
}

// run keeps a stream to the relay at target until ctx ends, opening it
// again after envoyBackoff when it fails.
func (l *lateAsker) run(ctx context.Context, target string) {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return
	}
	defer conn.Close()
	for n := 0; ctx.Err() == nil; n++ {
		if l.session(ctx, conn) {
			n = 0
		}
		if pause(ctx, backoffDelay(envoyBackoff, n)) != nil {
			return
		}
	}
}

// session runs one stream until it fails or ctx ends; it tells whether a
// response came.
func (l *lateAsker) session(ctx context.Context, conn *grpc.ClientConn) (got bool) {
	sctx, cancel := streamContext(ctx)
	defer cancel()
	s, err := openDelta(sctx, conn, l.cfg.Type, l.cfg.ADS)
	if err != nil {
		return false
	}
	// ask sends under mu: what the channel holds is in asked, and a name
	// asked after this is both sent and not in names.
	l.mu.Lock()
	for len(l.asks) > 0 { // asked already: in names
		<-l.asks
	}
	names := append([]string{l.first}, l.asked...)
	l.mu.Unlock()
	typeURL := kinds[l.cfg.Type].typeURL
	if s.Send(&discoverypb.DeltaDiscoveryRequest{Node: l.node, TypeUrl: typeURL, ResourceNamesSubscribe: names}) != nil {
		return false
	}
	resps, errc, done := receive(sctx, s.Recv)
	defer func() {
		cancel()
		<-done
	}()
	for {
		select {
		case <-ctx.Done():
			return got
		case name := <-l.asks:
			if s.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: []string{name}}) != nil {
				return got
			}
		case r := <-resps:
			got = true
			l.record(r)
			if s.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: r.GetNonce()}) != nil {
				return got
			}
		case <-errc:
			return got
		}
	}
}

// record notes the late names a response brings, removes or reports.
func (l *lateAsker) record(r *discoverypb.DeltaDiscoveryResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, res := range r.GetResources() {
		l.held[res.GetName()] = true
	}
	for _, name := range r.GetRemovedResources() {
		l.removedLocked(name, "in removed_resources")
	}
	for _, e := range r.GetResourceErrors() {
		name := e.GetResourceName().GetName()
		switch codes.Code(e.GetErrorDetail().GetCode()) {
		case codes.NotFound:
			l.removedLocked(name, "NOT_FOUND in resource_errors")
		case codes.Unavailable:
			l.unavailable++
		}
	}
}

// removedLocked counts a removal of a late name asked for: spurious, the
// control plane serves it all along.
func (l *lateAsker) removedLocked(name, how string) {
	if name == l.first {
		return // the pool's: the soak's clients tell of it
	}
	delete(l.held, name)
	l.removals++
	if l.firstRm == "" {
		l.firstRm = fmt.Sprintf("%s, asked during a silence, told removed: %s", name, how)
	}
}

// allHeld reports whether every late name asked has arrived.
func (l *lateAsker) allHeld() bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.asked {
		if !l.held[n] {
			return false
		}
	}
	return true
}

// end adds to e what the asker saw.
func (l *lateAsker) end(e *Ending) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Late = len(l.asked)
	for _, n := range l.asked {
		if l.held[n] {
			e.LateHeld++
		}
	}
	e.LateUnavailable, e.Removals = l.unavailable, e.Removals+l.removals
	if e.FirstRemoval == "" {
		e.FirstRemoval = l.firstRm
	}
}

package upstream

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/serviceconfig"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// A connection that cannot reach its server stays in TRANSIENT_FAILURE
// between gRPC's attempts (pick_first's sticky TRANSIENT_FAILURE, gRFC
// A62), and every stream opened meanwhile fails at once with the last
// attempt's error: a stream retried on the client's backoff would report
// one attempt several times. Attempts follows the connection's attempts,
// as pick_first reports them to the channel, so that the client reports
// each failed attempt once and retries after gRPC's next one (see
// Client.repeated and Client.awaitAttempt).

// Attempts counts the failed attempts of one connection to its server.
type Attempts struct {
	id uint64 // its key in the attempts registry; read-only

	mu       lockorder.Mutex[attemptsMu]
	tracked  bool               // the connection's balancer has reported here; guarded by mu
	failed   uint64             // attempts failed (TRANSIENT_FAILURE reported); guarded by mu
	state    connectivity.State // as last reported; guarded by mu
	reported chan struct{}      // closed and replaced once the channel has each report; guarded by mu
}

// TrackAttempts returns an Attempts and the dial option that makes the
// connection report to it (its load-balancing policy: pick_first, whose
// reports are counted on their way to the channel). A service config from
// the name resolver that names another policy leaves it untracked: the
// client then retries on its own backoff alone.
func TrackAttempts() (*Attempts, grpc.DialOption) {
	a := &Attempts{id: nextAttempts.Add(1), reported: make(chan struct{})}
	attemptsByID.Store(a.id, a)
	cfg := fmt.Sprintf(`{"loadBalancingConfig":[{%q:{"id":%d}}]}`, attemptsPolicy, a.id)
	return a, grpc.WithDefaultServiceConfig(cfg)
}

// Release forgets a once its connection is closed; nil is a no-op.
func (a *Attempts) Release() {
	if a != nil {
		attemptsByID.Delete(a.id)
	}
}

// now returns the failed attempts so far, whether the connection is in
// TRANSIENT_FAILURE, and a channel closed at its next report; tracked is
// false if the connection does not report to a.
func (a *Attempts) now() (failed uint64, failing bool, next <-chan struct{}, tracked bool) {
	if a == nil {
		return 0, false, nil, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.failed, a.state == connectivity.TransientFailure, a.reported, a.tracked
}

// record records a state the connection's balancer is giving the
// channel, before the channel has it: a stream that failed on the
// attempt's error finds the attempt counted.
func (a *Attempts) record(s connectivity.State) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tracked = true
	if s == connectivity.TransientFailure {
		a.failed++
	}
	a.state = s
}

// wake wakes those waiting for a report, once the channel has it: a
// stream they open then meets the attempt's error, not the one before.
func (a *Attempts) wake() {
	a.mu.Lock()
	defer a.mu.Unlock()
	close(a.reported)
	a.reported = make(chan struct{})
}

const attemptsPolicy = "xdsrelay_counted_pick_first"

var (
	nextAttempts atomic.Uint64
	attemptsByID sync.Map // id → *Attempts, until Release
)

func init() { balancer.Register(countedBuilder{}) }

// countedBuilder builds pick_first with its reports to the channel
// counted in the Attempts its configuration names.
type countedBuilder struct{}

type countedConfig struct {
	serviceconfig.LoadBalancingConfig
	ID uint64 `json:"id"`
}

func (countedBuilder) Name() string { return attemptsPolicy }

func (countedBuilder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	var cfg countedConfig
	if err := json.Unmarshal(js, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", attemptsPolicy, err)
	}
	return &cfg, nil
}

func (countedBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &countedPickFirst{cc: &countingConn{ClientConn: cc}}
	b.Balancer = balancer.Get(pickfirst.Name).Build(b.cc, opts)
	return b
}

// countedPickFirst is pick_first, reporting through countingConn.
type countedPickFirst struct {
	balancer.Balancer
	cc *countingConn // its Attempts found by the first configuration
}

func (b *countedPickFirst) UpdateClientConnState(s balancer.ClientConnState) error {
	if cfg, ok := s.BalancerConfig.(*countedConfig); ok && b.cc.attempts.Load() == nil {
		if a, ok := attemptsByID.Load(cfg.ID); ok {
			b.cc.attempts.Store(a.(*Attempts))
		}
	}
	s.BalancerConfig = nil // pick_first's defaults
	return b.Balancer.UpdateClientConnState(s)
}

// Close is the channel's going IDLE (gRPC closes the balancer after
// idle_timeout, and builds another on the next call, which finds the same
// Attempts) or its closing: either way, no attempt is failing any more.
func (b *countedPickFirst) Close() {
	b.Balancer.Close()
	if a := b.cc.attempts.Load(); a != nil {
		a.record(connectivity.Idle)
		a.wake()
	}
}

// countingConn records the balancer's states in its Attempts as they go
// to the channel.
type countingConn struct {
	balancer.ClientConn
	attempts atomic.Pointer[Attempts]
}

func (c *countingConn) UpdateState(s balancer.State) {
	a := c.attempts.Load()
	if a == nil {
		c.ClientConn.UpdateState(s)
		return
	}
	a.record(s.ConnectivityState)
	c.ClientConn.UpdateState(s)
	a.wake()
}

// SilentServer names the failure of a connection attempt to a server that
// accepted the TCP connection and sent nothing (no HTTP/2 settings) before
// upstream.connect_timeout closed it: a hung process, or a port that is
// not the control plane's gRPC one.
const SilentServer = "the server accepted TCP but never spoke HTTP/2 within upstream.connect_timeout"

// SilentTLSServer is SilentServer over TLS: the server did not answer the
// TLS handshake before upstream.connect_timeout.
const SilentTLSServer = "the server accepted TCP but never completed the TLS handshake within upstream.connect_timeout"

// Silent returns SilentServer or SilentTLSServer if err, as gRPC words a
// connection attempt's failure (google.golang.org/grpc/internal/transport),
// is that case: the server's HTTP/2 preface still being read when the
// connect deadline closed the connection ("error reading server preface:
// ... use of closed network connection"), or the TLS handshake still under
// way ("authentication handshake failed: context deadline exceeded"); ""
// if it is neither.
func Silent(err string) string {
	switch {
	case strings.Contains(err, "error reading server preface") && strings.Contains(err, "use of closed network connection"):
		return SilentServer
	case strings.Contains(err, "authentication handshake failed: context deadline exceeded"):
		return SilentTLSServer
	}
	return ""
}

// Explain returns err with the name of its case before it, when Silent
// names one.
func Explain(err string) string {
	if kind := Silent(err); kind != "" {
		return kind + ": " + err
	}
	return err
}

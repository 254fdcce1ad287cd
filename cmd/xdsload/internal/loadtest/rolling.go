package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
)

// A rolling restart (RunRolling, xdsload --rolling): two xdsrelay
// processes, the built binary (Config.RelayBin), behind one address (a TCP
// balancer, internal/faultproxy, that sends each new connection to the
// next relay that accepts it), each in front of the tool's control plane
// through a faultproxy of its own, with cache.persist_dir. The clients are
// a soak's (even ones delta, odd ones SotW, each subscribed to half the
// names), without churn or NACKs. Once every client is configured, the
// control plane changes a resource every Config.UpdateEvery (1s) all
// along, and each relay in turn is restarted:
//
//   - SIGTERM once the last change has settled; the relay must exit 0;
//   - every stream it held must end, after a GOAWAY (its clients read
//     "received prior goaway" in the stream's status), and its client get
//     a response on a new stream: reconnected through the balancer to the
//     other relay, which must then hold every client's stream;
//   - the relay is started again with its link to the control plane
//     silent, and a client of its own must get every name from it at once
//     (bounded), no older than the relay held at SIGTERM: its saved cache;
//   - the link passes again, and the relay must catch up with the control
//     plane and answer /readyz; rollingDwell later (as a rolling update
//     waits for a pod to stay ready) the other relay is restarted.
//
// At the end every client must hold the control plane's last version of
// every name it subscribes to, and none may have been told that one was
// removed (Ending).

// Bounds of a rolling restart's waits.
const (
	rejoinBound     = time.Minute      // every client of a restarted relay back on the other
	savedCacheBound = 10 * time.Second // the restarted relay serving its saved cache
	catchUpBound    = time.Minute      // the restarted relay at the control plane's versions, and ready
	rollingEndBound = time.Minute      // every client at the last versions
	// rollingDwell is how long a relay back and ready serves before the
	// other is restarted, and the last one before the changes stop.
	rollingDwell = 5 * time.Second
)

// rollingSetup is what a rolling restart runs: the control plane, the two
// relays, each reaching it through a link of its own, and the balancer in
// front of them.
type rollingSetup struct {
	cp       *controlPlane
	dir      string // the relays' configurations, saved caches and logs
	relays   [2]*relayProc
	links    [2]*faultproxy.Proxy
	balancer *faultproxy.Proxy
}

// startRolling starts the control plane, the relays and the balancer;
// cfg.Target becomes the balancer's address.
func startRolling(cfg *Config, coding seqCoding) (s *rollingSetup, err error) {
	s = &rollingSetup{}
	defer func() {
		if err != nil {
			s.stop(true)
		}
	}()
	if s.cp, err = startControlPlane(cfg, coding); err != nil {
		return s, err
	}
	if s.dir, err = os.MkdirTemp("", "xdsload-rolling-"); err != nil {
		return s, err
	}
	var addrs []string
	ports, err := freePorts(2 * len(s.relays)) // xDS and admin of each
	if err != nil {
		return s, err
	}
	for k, name := range []string{"a", "b"} {
		if s.links[k], err = faultproxy.Start(s.cp.addr); err != nil {
			return s, err
		}
		if s.relays[k], err = newRelayProc(name, cfg.Rolling.RelayBin, s.dir, s.links[k].Addr, ports[2*k], ports[2*k+1]); err != nil {
			return s, err
		}
		if err = s.relays[k].start(); err != nil {
			return s, err
		}
		addrs = append(addrs, s.relays[k].addr)
	}
	for _, r := range s.relays {
		if err = r.waitReady(context.Background(), catchUpBound); err != nil {
			return s, err
		}
	}
	if s.balancer, err = faultproxy.Start(addrs...); err != nil {
		return s, err
	}
	cfg.Target = s.balancer.Addr
	return s, nil
}

// stop ends everything; the directory stays if keep (the relays' logs).
func (s *rollingSetup) stop(keep bool) {
	if s.balancer != nil {
		s.balancer.Close()
	}
	for k := range s.relays {
		if s.relays[k] != nil {
			s.relays[k].kill()
		}
		if s.links[k] != nil {
			s.links[k].Close()
		}
	}
	if s.cp != nil {
		s.cp.stop()
	}
	if s.dir != "" && !keep {
		os.RemoveAll(s.dir)
	}
}

// RunRolling runs the rolling restart cfg describes (cfg.Rolling) and
// returns what it measured; it fails if any check above did not hold.
func RunRolling(ctx context.Context, cfg Config) (*Rolling, error) {
	cfg, err := prepare(cfg, (*Config).ValidateRolling)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	coding := newSeqCoding(kinds[cfg.Type], soakMarks)
	coding.wrap = true
	s, err := startRolling(&cfg, coding)
	if err != nil {
		if s.dir != "" {
			return nil, fmt.Errorf("rolling: %w (the relays' logs are in %s)", err, s.dir)
		}
		return nil, fmt.Errorf("rolling: %w", err)
	}
	rl := &Rolling{Config: cfg, Dir: s.dir}
	err = rl.run(ctx, &cfg, s, coding)
	rl.judge(err)
	if !rl.Passed {
		err = errors.Join(err, fmt.Errorf("rolling: %s (the relays' logs are in %s)", strings.Join(rl.Failures, "; "), s.dir))
	} else {
		rl.Dir = ""
	}
	s.stop(!rl.Passed)
	return rl, err
}

// run opens the clients, waits for their first config, changes the
// control plane all along while it restarts each relay in turn, and
// checks how the clients ended.
func (rl *Rolling) run(ctx context.Context, cfg *Config, s *rollingSetup, coding seqCoding) error {
	x := newXDSClients(cfg, coding)
	pool, width := soakPool(cfg, coding)
	st := newSoakTracker(cfg.Clients, pool, width)
	log := newRejoinLog()
	clients := newSoakClients(cfg, x, st, 0)
	clients.obs = log
	cctx, stopClients := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopClients()
	launch(cctx, cfg.Clients, cfg.Rate, func(i int) { wg.Go(func() { clients.run(cctx, i) }) })
	stopProgress := progress(cfg, func(elapsed time.Duration) string { return st.rollingLine(elapsed, cfg.Clients) }, time.Now())
	defer stopProgress()
	if err := st.waitConfigured(ctx); err != nil {
		return fmt.Errorf("rolling: waiting for every client's first config: %w", err)
	}
	dctx, stopDriver := context.WithCancel(ctx)
	d := newCPDriver(cfg, s.cp, nil, st, nil)
	var driveErr error
	var dwg sync.WaitGroup
	dwg.Go(func() { driveErr = d.run(dctx) })
	var err error
	for k := range s.relays {
		r := &rollingRestart{cfg: cfg, s: s, k: k, d: d, st: st, log: log, coding: coding}
		rr, rerr := r.run(ctx)
		rl.Restarts = append(rl.Restarts, rr)
		if err = rerr; err == nil {
			err = pause(ctx, rollingDwell)
		}
		if err != nil {
			break
		}
	}
	stopDriver()
	dwg.Wait()
	if err == nil && driveErr == nil {
		rl.Ending = endCheck(ctx, st, nil, rollingEndBound)
		rl.Ended = true
	}
	rl.Changes, rl.StreamFailures = st.changes.Load(), st.failures.Load()
	return errors.Join(err, driveErr)
}

// rollingRestart restarts relay k of s while the control plane changes.
type rollingRestart struct {
	cfg    *Config
	s      *rollingSetup
	k      int
	d      *cpDriver
	st     *soakTracker
	log    *rejoinLog
	coding seqCoding
}

// run restarts the relay and checks where its clients went and what it
// serves when it comes back.
func (r *rollingRestart) run(ctx context.Context) (RollingRestart, error) {
	relay, other := r.s.relays[r.k], r.s.relays[1-r.k]
	rr := RollingRestart{Relay: relay.name}
	var want []int64 // the control plane's versions when the relay got SIGTERM
	var sigterm time.Time
	err := r.d.settled(ctx, func() (err error) {
		if rr.Streams, err = relay.streams(); err != nil {
			return err
		}
		want = r.st.latestNow()
		r.log.begin()
		sigterm = time.Now()
		return relay.terminate()
	})
	if err != nil {
		return rr, fmt.Errorf("rolling: relay %s: %w", relay.name, err)
	}
	rr.Exit, err = relay.wait(relayExit)
	rr.ShutdownTook = relay.exitedAt.Sub(sigterm)
	if err != nil {
		return rr, fmt.Errorf("rolling: %w", err)
	}
	rejoins, err := r.log.wait(ctx, rr.Streams, rejoinBound)
	rr.fill(rejoins, sigterm)
	if err != nil {
		return rr, fmt.Errorf("rolling: relay %s's clients: %w", relay.name, err)
	}
	if rr.Other, err = other.streams(); err != nil {
		return rr, fmt.Errorf("rolling: relay %s: %w", other.name, err)
	}
	rr.LeftOn = r.s.balancer.Open()[relay.addr]
	return rr, r.restartWarm(ctx, relay, want, &rr)
}

// restartWarm starts the relay again with its link to the control plane
// silent, and looks how soon a client of its own holds every name, and
// how old; then lets the link pass and waits for the relay to catch up
// with the control plane and be ready.
func (r *rollingRestart) restartWarm(ctx context.Context, relay *relayProc, want []int64, rr *RollingRestart) error {
	link := r.s.links[r.k]
	link.Set(faultproxy.Silent, 0)
	defer link.Set(faultproxy.Pass, 0)
	if err := relay.start(); err != nil {
		return fmt.Errorf("rolling: %w", err)
	}
	p, err := openProbe(ctx, relay.addr, r.cfg, r.coding, r.st)
	if err != nil {
		return fmt.Errorf("rolling: relay %s: %w", relay.name, err)
	}
	defer p.close()
	if err := p.until(savedCacheBound, func(held []int) bool { return atLeast(held, nil) }); err != nil {
		return fmt.Errorf("rolling: relay %s did not serve every name within %s of its start, its control plane silent: %w", relay.name, savedCacheBound, err)
	}
	rr.SavedServed, rr.SavedOK = time.Since(relay.started), atLeast(p.held, want)
	link.Set(faultproxy.Pass, 0)
	passed, latest := time.Now(), r.st.latestNow()
	if err := p.until(catchUpBound, func(held []int) bool { return atLeast(held, latest) }); err != nil {
		return fmt.Errorf("rolling: relay %s did not catch up with its control plane within %s: %w", relay.name, catchUpBound, err)
	}
	rr.CaughtUp = time.Since(passed)
	return relay.waitReady(ctx, catchUpBound)
}

// atLeast reports whether every name is held, at want's version or a later
// one if want is given.
func atLeast(held []int, want []int64) bool {
	for j, v := range held {
		if v < 0 || (want != nil && int64(v) < want[j]) {
			return false
		}
	}
	return true
}

// goawayMark is in the status of a stream whose connection ended after a
// GOAWAY, as gRPC-Go's client reports it ("received prior goaway").
const goawayMark = "received prior goaway"

// rejoinLog follows, through one relay's restart, the clients whose
// stream ended: when and how it ended, and when a new one was answered.
type rejoinLog struct {
	wake chan struct{} // capacity 1: poked when a client is answered

	mu      sync.Mutex
	on      bool            // guarded by mu: a restart is followed
	rejoins map[int]*rejoin // guarded by mu: by client
	nBack   int             // guarded by mu: rejoins answered
}

// rejoin is one client's way back.
type rejoin struct {
	ended    time.Time
	goaway   bool   // the stream's connection ended after a GOAWAY
	err      string // how the stream ended
	failed   int    // streams that failed after it, before one was answered
	opened   time.Time
	answered time.Time
}

func newRejoinLog() *rejoinLog { return &rejoinLog{wake: make(chan struct{}, 1)} }

// begin follows the clients from now on.
func (l *rejoinLog) begin() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on, l.rejoins, l.nBack = true, map[int]*rejoin{}, 0
}

func (l *rejoinLog) ended(i int, err error, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.on {
		return
	}
	if r := l.rejoins[i]; r != nil {
		if r.answered.IsZero() {
			r.failed++
		}
		return
	}
	msg := fmt.Sprint(err)
	l.rejoins[i] = &rejoin{ended: t, goaway: strings.Contains(msg, goawayMark), err: msg}
}

func (l *rejoinLog) answered(i int, opened, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rejoins[i]
	if !l.on || r == nil || !r.answered.IsZero() {
		return
	}
	r.opened, r.answered = opened, t
	l.nBack++
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// wait waits, bound at most, for n clients' streams to have ended and
// every one of those clients to be answered again; then it stops
// following and returns what it saw.
func (l *rejoinLog) wait(ctx context.Context, n int, bound time.Duration) ([]rejoin, error) {
	t := time.NewTimer(bound)
	defer t.Stop()
	var err error
	for err == nil && !l.done(n) {
		select {
		case <-l.wake:
		case <-t.C:
			err = fmt.Errorf("not every one back within %s", bound)
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = false
	out := make([]rejoin, 0, len(l.rejoins))
	for _, r := range l.rejoins {
		out = append(out, *r)
	}
	return out, err
}

func (l *rejoinLog) done(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.rejoins) >= n && l.nBack == len(l.rejoins)
}

// fill summarizes the rejoins of a restart whose SIGTERM was at sigterm.
func (rr *RollingRestart) fill(rejoins []rejoin, sigterm time.Time) {
	var drain, gap, answer []time.Duration
	for _, r := range rejoins {
		rr.Ended++
		drain = append(drain, r.ended.Sub(sigterm))
		if r.goaway {
			rr.GoAway++
		} else if rr.FirstError == "" {
			rr.FirstError = r.err // the one to look at
		}
		if r.failed > 0 {
			rr.Retried++
		}
		if !r.answered.IsZero() {
			rr.Back++
			gap, answer = append(gap, r.answered.Sub(r.ended)), append(answer, r.answered.Sub(r.opened))
		}
	}
	if rr.FirstError == "" && len(rejoins) > 0 {
		rr.FirstError = rejoins[0].err
	}
	rr.Drain, rr.Gap, rr.Answer = Summarize(drain), Summarize(gap), Summarize(answer)
}

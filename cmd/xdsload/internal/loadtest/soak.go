package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// SoakConfig describes a soak (Config.Soak): for Duration, clients of both
// variants connect, reconnect, change their subscriptions and now and then
// NACK, through xdsrelay in front of the tool's control plane, which
// changes a resource every Config.UpdateEvery and restarts on a schedule
// (with Faults, the link between them also goes silent, trickles and is
// reset, in turn); every Every the relay's memory, goroutines, open files
// and streams are sampled, and at the end each is held to its value after
// the first five minutes (after the first half of a soak shorter than
// ten). Then, once the changes have stopped, every client must come to
// hold the control plane's last version of every name it subscribes to,
// and none may have been told that one of them was removed. A zero field
// takes the default its comment gives.
type SoakConfig struct {
	Duration time.Duration `json:"duration_ns,omitempty"`
	// Every is the interval between rows: 1m, or for a soak shorter than
	// 10m a tenth of it, 5s at least.
	Every time.Duration `json:"every_ns,omitempty"`
	// RestartEvery is the interval between control-plane restarts, 60s
	// or a third of the soak if shorter; Down how long each keeps it down
	// (1s, and a quarter of RestartEvery at most).
	RestartEvery time.Duration `json:"restart_every_ns,omitempty"`
	Down         time.Duration `json:"down_ns,omitempty"`
	// Faults puts a faultproxy between the relay and its control plane,
	// and every RestartEvery injects the next fault in turn: a restart,
	// silence for FaultFor, a trickle (soakTrickleRate) for FaultFor, a
	// reset of every connection. The relay then finds a silent link dead
	// within soakKeepalive+soakKeepaliveTimeout, and FaultFor is 5s more
	// than that unless given.
	Faults   bool          `json:"faults,omitempty"`
	FaultFor time.Duration `json:"fault_for_ns,omitempty"`
	// Churn is the fraction of the clients that reconnect every
	// ChurnEvery, and of those that change their subscriptions: 5% every 5s.
	Churn      float64       `json:"churn,omitempty"`
	ChurnEvery time.Duration `json:"churn_every_ns,omitempty"`
	// NACKEvery is how many responses, over all clients, to one NACK: 100.
	NACKEvery int `json:"nack_every,omitempty"`
	// Gate names the figures (SoakFigures) that fail the soak if they do
	// not stay within 10% of their reference: all of them.
	Gate []string `json:"gate,omitempty"`
	// ReportOnly reports the verdict but never fails the run for it.
	ReportOnly bool `json:"report_only,omitempty"`
	// Rows, if set, receives the rows as they are sampled (the command's
	// stdout); the Result holds them too.
	Rows io.Writer `json:"-"`
}

// The figures of a soak's rows, as SoakConfig.Gate names them.
const (
	FigureRSS        = "rss"
	FigureHeap       = "heap"
	FigureGoroutines = "goroutines"
	FigureFDs        = "fds"
	FigureStreams    = "streams"
	FigureFanOut     = "fanout"
)

// SoakFigures are every figure of a soak's rows, in their order.
var SoakFigures = []string{FigureRSS, FigureHeap, FigureGoroutines, FigureFDs, FigureStreams, FigureFanOut}

// soakGateDefault are the figures a soak is gated on unless told: what a
// leak moves. The fan-out p50 is reported, not gated: it moves by more
// than 10% from one interval to the next on a shared machine.
var soakGateDefault = []string{FigureRSS, FigureHeap, FigureGoroutines, FigureFDs, FigureStreams}

// Soak defaults, and limits.
const (
	soakChangeEvery = 2 * time.Second // Config.UpdateEvery
	soakGrace       = 2 * time.Minute // Config.Timeout past the soak's Duration
	soakLong        = 10 * time.Minute
	soakSettle      = 5 * time.Minute // a long soak's figures are held to theirs after this
	soakTolerance   = 0.10
	// soakMarks is the span of the update marks in a soak: update seq
	// carries ((seq-1) mod soakMarks)+1, so that a soak of any length
	// fits the mark field (see soakTracker.unwrap).
	soakMarks = 1000
	// soakEndBound bounds the wait, once the changes have stopped, for
	// every client to hold the last ones: past the relay's 30s reconnect
	// backoff and a keepalive bound, with room.
	soakEndBound = 90 * time.Second
)

// With Soak.Faults the relay's upstream keepalive is gRPC's shortest ping
// interval and a short timeout (a silent link is found dead within their
// sum), a connection attempt is given up after soakConnectTimeout, and a
// name not arrived soakNotFoundTimeout after it was asked is judged
// (cache.not_found_timeout): within a silence, before the keepalive finds
// the link dead, where only a live stream may say a name does not exist.
// A trickling link carries soakTrickleRate bytes a second, both ways
// together: less than the changes need.
const (
	soakKeepalive        = 10 * time.Second
	soakKeepaliveTimeout = 5 * time.Second
	soakConnectTimeout   = 5 * time.Second
	soakNotFoundTimeout  = 5 * time.Second
	soakTrickleRate      = 2 << 10
)

// defaults fills the zero fields of a soak of s.Duration.
func (s SoakConfig) defaults() SoakConfig {
	d := s.Duration
	every := time.Minute
	if d < soakLong {
		every = max(d/10, 5*time.Second)
	}
	setDefault(&s.Every, every)
	setDefault(&s.RestartEvery, min(time.Minute, d/3))
	setDefault(&s.Down, min(time.Second, s.RestartEvery/4))
	setDefault(&s.Churn, 0.05)
	setDefault(&s.ChurnEvery, 5*time.Second)
	setDefault(&s.NACKEvery, 100)
	if s.Faults {
		setDefault(&s.FaultFor, soakKeepalive+soakKeepaliveTimeout+5*time.Second)
	}
	if len(s.Gate) == 0 {
		s.Gate = soakGateDefault
	}
	return s
}

// validate checks a defaulted soak of cfg; no soak is fine.
func (s *SoakConfig) validate(cfg *Config) error {
	if s.Duration == 0 {
		return nil
	}
	for _, g := range s.Gate {
		if !slices.Contains(SoakFigures, g) {
			return fmt.Errorf("soak-gate %q: want some of %s", g, strings.Join(SoakFigures, ","))
		}
	}
	pool := len(cfg.Names)
	if pool == 0 {
		pool = cfg.Resources
	}
	switch {
	case s.Duration < 0:
		return fmt.Errorf("soak %s: must not be negative", s.Duration)
	case !cfg.Relay || cfg.ServeCP == "" || cfg.Target != "" || cfg.Floor || cfg.GRPCFloor || cfg.Churn > 0:
		return errors.New("soak runs clients through the relay in front of the tool's control plane: give relay and serve-cp, and neither target, floor, grpc-floor nor churn")
	case s.Every <= 0 || s.Every > s.Duration:
		return fmt.Errorf("soak-every %s: must be positive and at most the soak's %s", s.Every, s.Duration)
	case s.RestartEvery <= s.Down || s.Down <= 0:
		return fmt.Errorf("soak-restart-every %s: must be longer than soak-down %s, which must be positive", s.RestartEvery, s.Down)
	case s.Churn < 0 || s.Churn > 1 || s.ChurnEvery <= 0:
		return errors.New("soak-churn must be a fraction between 0 and 1, soak-churn-every positive")
	case s.NACKEvery < 1:
		return fmt.Errorf("soak-nack-every %d: want at least 1", s.NACKEvery)
	case s.FaultFor < 0 || (s.FaultFor > 0 && !s.Faults):
		return fmt.Errorf("soak-fault-for %s: give a positive duration, with soak-faults", s.FaultFor)
	case cfg.UpdateEvery <= 0:
		return errors.New("update-every: a soak needs a positive interval between changes")
	case pool < 2:
		return errors.New("soak: clients change subscriptions among the names: serve (or name) two resources at least")
	case cfg.Timeout <= s.Duration:
		return fmt.Errorf("timeout %s: must be longer than the soak's %s", cfg.Timeout, s.Duration)
	}
	return nil
}

// lateNames is how many late names a defaulted soak serves: one for each
// silence its faults may bring, and one to spare.
func (s SoakConfig) lateNames() int {
	if !s.Faults || s.RestartEvery <= 0 {
		return 0
	}
	return int(s.Duration/(s.RestartEvery*time.Duration(nFaultKinds))) + 2
}

// soaking reports whether cfg describes a soak.
func (cfg *Config) soaking() bool { return cfg.Soak.Duration > 0 }

// markSpan is how many update marks the resources carry: the updates, or
// a soak's wrapping span.
func (cfg *Config) markSpan() int {
	if cfg.soaking() {
		return soakMarks
	}
	return cfg.Updates
}

// soakBackend is what a soak drives: the clients, the control plane it
// changes, pauses and resumes, the link to it that it breaks, and the
// relay it samples.
type soakBackend interface {
	backend
	pausable
	faultLink
	relaySampler
}

// soak runs the soak cfg describes and fills res.Soak; it fails if a gated
// figure did not stay within soakTolerance, or the clients did not end at
// the control plane's last versions or were told of a removal, unless
// ReportOnly.
func soak(ctx context.Context, cfg *Config, b backend, res *Result) error {
	sb, ok := b.(soakBackend)
	x := churnClients(b)
	if !ok || x == nil {
		return errors.New("soak: needs the relay and the tool's control plane")
	}
	pool, width := soakPool(cfg, x.coding)
	st := newSoakTracker(cfg.Clients, pool, width)
	clients := newSoakClients(cfg, x, st, cfg.Soak.NACKEvery)
	sk := &Soak{}
	res.Soak = sk
	cctx, stopClients := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopClients()
	var late *lateAsker
	if cfg.Soak.Faults {
		late = newLateAsker(cfg, pool)
		wg.Go(func() { late.run(cctx, cfg.Target) })
	}
	launch(cctx, cfg.Clients, cfg.Rate, func(i int) { wg.Go(func() { clients.run(cctx, i) }) })
	stopProgress := progress(cfg, func(elapsed time.Duration) string { return st.progressLine(elapsed, cfg.Clients) }, time.Now())
	defer stopProgress()
	err := st.waitConfigured(ctx)
	if err != nil {
		err = fmt.Errorf("soak: waiting for every client's first config: %w", err)
	} else {
		err = soakFor(ctx, cfg, sb, clients, late, sk)
		sk.Ending = endCheck(ctx, st, late, soakEndBound)
		sk.Ended = true
	}
	stopClients()
	wg.Wait()
	st.count(sk)
	sk.judge(&cfg.Soak)
	if err == nil && !sk.Passed && !cfg.Soak.ReportOnly {
		err = fmt.Errorf("soak: %s", strings.Join(sk.failures(), "; "))
	}
	return err
}

// soakFor runs the schedules for the soak's duration, sampling a row every
// cfg.Soak.Every, and stops them.
func soakFor(ctx context.Context, cfg *Config, b soakBackend, clients *soakClients, late *lateAsker, sk *Soak) error {
	sk.printHeader(cfg)
	sctx, stop := context.WithCancel(ctx)
	d := newCPDriver(cfg, b, b, clients.st, late)
	var wg sync.WaitGroup
	var driveErr error
	wg.Go(func() { driveErr = d.run(sctx) })
	wg.Go(func() { clients.churn(sctx) })
	err := sampleRows(ctx, cfg, d, sk)
	stop()
	wg.Wait()
	sk.Faults = d.log
	return errors.Join(err, driveErr)
}

// sampleRows samples the relay every cfg.Soak.Every, and once more at the
// end, until the soak's duration has passed: quiet (see cpDriver.quiet).
func sampleRows(ctx context.Context, cfg *Config, d *cpDriver, sk *Soak) error {
	start, end, every := time.Now(), cfg.Soak.Duration, cfg.Soak.Every
	for k := 1; ; k++ {
		at := min(time.Duration(k)*every, end)
		if err := pause(ctx, time.Until(start.Add(at))); err != nil {
			return fmt.Errorf("soak: at %s: %w", at, err)
		}
		s, err := d.sample(ctx)
		if err != nil {
			return fmt.Errorf("soak: sampling the relay at %s: %w", at, err)
		}
		row := SoakRow{Elapsed: at, RelaySample: *s}
		row.FanOutP50, row.Receipts = d.st.takeFanOut()
		sk.Rows = append(sk.Rows, row)
		sk.printRow(cfg.Soak.Rows, row)
		if at == end {
			return nil
		}
	}
}

// churn, every ChurnEvery (the first half a period in, off the rows'
// beat), has a Churn fraction of the clients reconnect and as many others
// change their subscriptions, until ctx ends.
func (c *soakClients) churn(ctx context.Context) {
	s := &c.cfg.Soak
	n := min(int(math.Round(s.Churn*float64(len(c.kicks)))), len(c.kicks)/2)
	if n == 0 {
		return
	}
	wait := s.ChurnEvery / 2
	for pause(ctx, wait) == nil {
		wait = s.ChurnEvery
		for j, i := range rand.Perm(len(c.kicks))[:2*n] {
			c.kick(i, j < n)
		}
	}
}

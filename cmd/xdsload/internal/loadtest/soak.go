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
// changes a resource every Config.UpdateEvery and restarts on a schedule;
// every Every the relay's memory, goroutines, open files and streams are
// sampled, and at the end each is held to its value after the first five
// minutes (after the first half of a soak shorter than ten). A zero field
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
	case cfg.UpdateEvery <= 0:
		return errors.New("update-every: a soak needs a positive interval between changes")
	case pool < 2:
		return errors.New("soak: clients change subscriptions among the names: serve (or name) two resources at least")
	case cfg.Timeout <= s.Duration:
		return fmt.Errorf("timeout %s: must be longer than the soak's %s", cfg.Timeout, s.Duration)
	}
	return nil
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
// changes, pauses and resumes, and the relay it samples.
type soakBackend interface {
	backend
	pausable
	relaySampler
}

// soak runs the soak cfg describes and fills res.Soak; it fails if a gated
// figure did not stay within soakTolerance, unless ReportOnly.
func soak(ctx context.Context, cfg *Config, b backend, res *Result) error {
	sb, ok := b.(soakBackend)
	x := churnClients(b)
	if !ok || x == nil {
		return errors.New("soak: needs the relay and the tool's control plane")
	}
	st := newSoakTracker(cfg.Clients)
	clients := newSoakClients(cfg, x, st)
	sk := &Soak{}
	res.Soak = sk
	cctx, stopClients := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopClients()
	launch(cctx, cfg.Clients, cfg.Rate, func(i int) { wg.Go(func() { clients.run(cctx, i) }) })
	stopProgress := progress(cfg, func(elapsed time.Duration) string { return st.progressLine(elapsed, cfg.Clients) }, time.Now())
	defer stopProgress()
	err := st.waitConfigured(ctx)
	if err != nil {
		err = fmt.Errorf("soak: waiting for every client's first config: %w", err)
	} else {
		err = soakFor(ctx, cfg, sb, clients, sk)
	}
	stopClients()
	wg.Wait()
	st.count(sk)
	sk.judge(&cfg.Soak)
	if err == nil && !sk.Passed && !cfg.Soak.ReportOnly {
		err = fmt.Errorf("soak: %s did not stay within %.0f%% of %s", strings.Join(sk.failed(), ", "), soakTolerance*100, sk.ReferenceRule)
	}
	return err
}

// soakFor runs the schedules for the soak's duration, sampling a row every
// cfg.Soak.Every, and stops them.
func soakFor(ctx context.Context, cfg *Config, b soakBackend, clients *soakClients, sk *Soak) error {
	sk.printHeader(cfg)
	sctx, stop := context.WithCancel(ctx)
	d := &cpDriver{cfg: cfg, b: b, st: clients.st}
	var wg sync.WaitGroup
	var driveErr error
	wg.Go(func() { driveErr = d.run(sctx) })
	wg.Go(func() { clients.churn(sctx) })
	err := sampleRows(ctx, cfg, d, sk)
	stop()
	wg.Wait()
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

// cpDriver changes a resource every cfg.UpdateEvery and restarts the
// control plane every cfg.Soak.RestartEvery.
type cpDriver struct {
	// Read-only after soakFor makes it.
	cfg *Config
	b   soakBackend
	st  *soakTracker
	// quiet is held through a change's publication, through a restart
	// until the relay is back on its upstream, and through a row's sample,
	// which waits for the last change to have settled: a row is not taken
	// mid-restart or mid-fan-out.
	quiet sync.Mutex
	last  time.Time // the last change published; guarded by quiet
}

// settle is how long a change takes to settle, as a sample or a restart
// waits for it: half the interval between changes, settleMax at most.
func (d *cpDriver) settle() time.Duration { return min(d.cfg.UpdateEvery/2, settleMax) }

const settleMax = 2 * time.Second

// sample samples the relay once the last change has settled, changes and
// restarts held meanwhile.
func (d *cpDriver) sample(ctx context.Context) (*RelaySample, error) {
	d.quiet.Lock()
	defer d.quiet.Unlock()
	if err := pause(ctx, time.Until(d.last.Add(d.settle()))); err != nil {
		return nil, err
	}
	return d.b.relaySample()
}

// run drives the control plane until ctx ends.
func (d *cpDriver) run(ctx context.Context) error {
	change, restart := time.NewTicker(d.cfg.UpdateEvery), time.NewTicker(d.cfg.Soak.RestartEvery)
	defer change.Stop()
	defer restart.Stop()
	for seq := 1; ; seq++ {
		var err error
		select {
		case <-ctx.Done():
			return nil
		case <-change.C:
			d.quiet.Lock()
			err = d.publishLocked(seq, true)
			d.quiet.Unlock()
		case <-restart.C:
			err = d.restart(ctx, seq)
		}
		if err != nil || ctx.Err() != nil {
			return err
		}
	}
}

// publishLocked publishes change seq; unless counted, its receipts are
// left out of the fan-out.
func (d *cpDriver) publishLocked(seq int, counted bool) error {
	d.st.announce(seq)
	t, err := d.b.publish(seq)
	if err != nil {
		return fmt.Errorf("soak: change %d: %w", seq, err)
	}
	d.st.published(seq, t, counted)
	d.last = time.Now()
	return nil
}

// restart lets the last change settle, stops the control plane serving
// and brings it back on its address Down later, with change seq. The relay
// tells that its upstream stream is back by the response that carries it;
// that change's fan-out, which waits for the relay's reconnection, is not
// counted. Rows wait meanwhile.
func (d *cpDriver) restart(ctx context.Context, seq int) error {
	d.quiet.Lock()
	defer d.quiet.Unlock()
	if pause(ctx, time.Until(d.last.Add(d.settle()))) != nil {
		return nil
	}
	up, err := d.b.upstreamConnected()
	if err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	if err := d.b.pause(); err != nil {
		return fmt.Errorf("soak: stopping the control plane: %w", err)
	}
	_ = pause(ctx, d.cfg.Soak.Down)
	if err := d.b.resume(); err != nil {
		return fmt.Errorf("soak: restarting the control plane: %w", err)
	}
	d.st.restarts.Add(1)
	if err := d.publishLocked(seq, false); err != nil {
		return err
	}
	return d.waitReconnected(ctx, up)
}

// waitReconnected waits, reconnectBound at most, for the relay to have up
// groups with their upstream stream answering again.
func (d *cpDriver) waitReconnected(ctx context.Context, up int) error {
	deadline := time.Now().Add(reconnectBound)
	for ctx.Err() == nil {
		n, err := d.b.upstreamConnected()
		switch {
		case err != nil:
			return fmt.Errorf("soak: %w", err)
		case n >= up:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("soak: the relay was not back on its control plane %s after the control plane's restart (%d of %d groups)", reconnectBound, n, up)
		}
		_ = pause(ctx, reconnectPoll)
	}
	return nil
}

// How often, and how long at most, a restart looks whether the relay is
// back on its control plane: past its 30s reconnect backoff, with room.
const (
	reconnectPoll  = 50 * time.Millisecond
	reconnectBound = 45 * time.Second
)

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

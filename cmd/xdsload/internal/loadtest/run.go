package loadtest

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/relay"
)

// backend is what a run drives: clients and, when it publishes updates,
// the server that sends them.
type backend interface {
	run(ctx context.Context, i int, tr *tracker) error // client i, until ctx ends
	publish(seq int) (time.Time, error)
	bytesReceived() int64
	connections() int // connections the clients dialed
	stop()
}

// xdsBackend is xDS clients against a target, and the server the tool
// runs for them, if any: its control plane (and the relay in front of it),
// or the gRPC floor.
type xdsBackend struct {
	*xdsClients
	server serverSide // nil against an outside server
}

func (b *xdsBackend) publish(seq int) (time.Time, error) { return b.server.publish(seq) }

func (b *xdsBackend) stop() {
	if b.server != nil {
		b.server.stop()
	}
}

// cpStack is the tool's control plane and, with cfg.Relay, xdsrelay in
// front of it, through a faultproxy with cfg.Soak.Faults.
type cpStack struct {
	cp    *controlPlane
	relay *relay.Relay      // nil unless cfg.Relay
	proxy *faultproxy.Proxy // nil unless cfg.Soak.Faults
}

func (s *cpStack) publish(seq int) (time.Time, error) { return s.cp.publish(seq) }

func (s *cpStack) stop() {
	if s.relay != nil {
		stopRelay(s.relay)
	}
	if s.proxy != nil {
		s.proxy.Close()
	}
	s.cp.stop()
}

// prepare is the start of every kind of run: cfg with its defaults,
// checked by validate, and its Progress safe to write to at once (the
// progress lines, the relay's log and a split run's children do).
func prepare(cfg Config, validate func(*Config) error) (Config, error) {
	cfg = cfg.Defaults()
	if err := validate(&cfg); err != nil {
		return cfg, err
	}
	if cfg.Progress != nil {
		cfg.Progress = &lockedWriter{w: cfg.Progress}
	}
	return cfg, nil
}

// Run runs the load that cfg describes (updates fanned out, churn if
// cfg.Churn, or a soak if cfg.Soak.Duration) and returns what it measured. It stops by itself after
// cfg.Timeout; on a timeout, a failed publish or ctx ending, it returns the
// results so far with the error.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := prepare(cfg, (*Config).Validate)
	if err != nil {
		return nil, err
	}
	if !cfg.updating() || cfg.Churn > 0 || cfg.soaking() {
		cfg.Updates = 0
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	coding := newSeqCoding(kinds[cfg.Type], cfg.markSpan())
	coding.wrap = cfg.soaking()
	var b backend
	// Profile labels tell the servers' CPU from the clients': goroutines
	// inherit the labels of the goroutine that starts them.
	pprof.Do(ctx, pprof.Labels("side", "server"), func(context.Context) { b, err = startBackend(&cfg, coding) })
	if err != nil {
		return nil, err
	}
	defer b.stop()
	res := &Result{Config: cfg}
	if (cfg.ServeCP != "" && !cfg.Floor) || cfg.GRPCFloor {
		res.SeqBase = coding.base
	}
	if cfg.PID > 0 {
		if res.RSS.Start, err = ReadRSS(cfg.PID); err != nil {
			return nil, err
		}
	}
	res.ServerMemoryStart = serverMemory(b)
	switch {
	case cfg.soaking():
		start := time.Now()
		err = soak(ctx, &cfg, b, res)
		res.Elapsed = time.Since(start)
	case cfg.Churn > 0:
		err = churn(ctx, &cfg, b, res)
	default:
		err = load(ctx, &cfg, b, res)
	}
	res.BytesReceived = b.bytesReceived()
	res.Connections = b.connections()
	return res, err
}

// load opens the clients, follows them through their first config and the
// updates, and fills res from what they saw.
func load(ctx context.Context, cfg *Config, b backend, res *Result) error {
	tr := newTracker(cfg.Clients, cfg.Updates)
	start := time.Now()
	stopProgress := progress(cfg, func(elapsed time.Duration) string { return tr.progressLine(elapsed) }, start)
	err := drive(ctx, cfg, tr, b, res)
	stopProgress()
	res.fill(tr, start)
	if err == nil && res.Failed > 0 {
		err = fmt.Errorf("%d of %d clients failed; %s", res.Failed, cfg.Clients, res.FirstError)
	}
	return err
}

// serverMemory reads a split run's server's runtime memory; nil otherwise.
func serverMemory(b backend) *ServerMemory {
	if s, ok := b.(*splitBackend); ok {
		return s.memory()
	}
	return nil
}

// upstreamPID is the process of a split run's relay's control plane; 0
// otherwise.
func upstreamPID(b backend) int {
	if s, ok := b.(*splitBackend); ok {
		return s.upstreamPID()
	}
	return 0
}

func startBackend(cfg *Config, coding seqCoding) (backend, error) {
	switch {
	case cfg.Split:
		return startSplit(cfg, coding)
	case cfg.Floor:
		return startFloor(cfg)
	}
	return startXDSBackend(cfg, coding)
}

// startXDSBackend starts the server the tool runs for the clients, if any
// (see startServer), and the clients.
func startXDSBackend(cfg *Config, coding seqCoding) (*xdsBackend, error) {
	srv, err := startServer(cfg, coding)
	if err != nil {
		return nil, err
	}
	return &xdsBackend{xdsClients: newXDSClients(cfg, coding), server: srv}, nil
}

// startServer starts the gRPC floor if cfg.GRPCFloor, or the control plane
// if cfg.ServeCP and the relay in front of it if cfg.Relay; cfg.Target is
// then where they serve, unless it names a server in front of the control
// plane. It returns nil if the tool serves nothing.
func startServer(cfg *Config, coding seqCoding) (serverSide, error) {
	switch {
	case cfg.GRPCFloor:
		f, err := startGRPCFloor(cfg, coding)
		if err != nil {
			return nil, err
		}
		cfg.Target = f.addr
		return f, nil
	case cfg.ServeCP == "":
		return nil, nil
	}
	cp, err := startControlPlane(cfg, coding)
	if err != nil {
		return nil, err
	}
	if cfg.Target == "" {
		cfg.Target = cp.addr
	}
	stack := &cpStack{cp: cp}
	if !cfg.Relay {
		return stack, nil
	}
	upstream, err := faultLinkTo(cfg, cp.addr, &stack.proxy)
	if err == nil {
		stack.relay, err = startRelay(upstream, cfg)
	}
	if err != nil {
		stack.stop()
		return nil, err
	}
	cfg.Target = stack.relay.Addr()
	return stack, nil
}

// faultLinkTo returns the address the relay reaches its control plane at
// (cp): with cfg.Soak.Faults, a faultproxy in front of it, set in *proxy.
func faultLinkTo(cfg *Config, cp string, proxy **faultproxy.Proxy) (string, error) {
	if !cfg.Soak.Faults {
		return cp, nil
	}
	p, err := faultproxy.Start(cp)
	if err != nil {
		return "", fmt.Errorf("soak: the link to the control plane: %w", err)
	}
	*proxy = p
	return p.Addr, nil
}

// drive opens the clients, waits for their first config, publishes the
// updates and waits for them to reach every client; then it stops the
// clients and waits for them.
func drive(ctx context.Context, cfg *Config, tr *tracker, b backend, res *Result) error {
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	launch(cctx, cfg.Clients, cfg.Rate, func(i int) {
		tr.started(i)
		wg.Go(func() {
			pprof.Do(cctx, pprof.Labels("side", "clients"), func(ctx context.Context) {
				if err := b.run(ctx, i, tr); err != nil && ctx.Err() == nil {
					tr.fail(i, err)
				}
			})
		})
	})
	if err := tr.wait(ctx, &tr.settledFirst); err != nil {
		return fmt.Errorf("waiting for every client's first config: %w", err)
	}
	res.RSS.Configured = sampleRSS(cfg.PID)
	res.ServerMemory = serverMemory(b)
	if s, ok := b.(*splitBackend); ok && cfg.CPUProfile != "" {
		if err := s.heapProfile(cfg.CPUProfile + ".server.heap"); err != nil {
			return err
		}
	}
	res.fillIdle()
	counts := cpCountsOf(b)
	var responses int64
	if counts != nil {
		res.ControlPlane = &ControlPlaneSeen{Streams: counts.streams.Load(), Connections: counts.conns.Load()}
		responses = counts.responses.Load()
	}
	cpu, upstreamCPU := sampleCPU(cfg.PID), sampleCPU(upstreamPID(b))
	if err := fanOut(ctx, cfg, tr, b); err != nil {
		return err
	}
	if counts != nil {
		res.ControlPlane.Responses = counts.responses.Load() - responses
		if cfg.Updates > 0 {
			res.ControlPlane.PerUpdate = float64(res.ControlPlane.Responses) / float64(cfg.Updates)
		}
	}
	if cfg.PID > 0 && cfg.Updates > 0 {
		res.CPU = CPU{Server: sampleCPU(cfg.PID) - cpu, Changes: cfg.Updates}
		if pid := upstreamPID(b); pid > 0 {
			res.CPU.Upstream, res.CPU.UpstreamPID = sampleCPU(pid)-upstreamCPU, pid
		}
		res.CPU.perChange(cfg.Clients)
	}
	res.RSS.End = sampleRSS(cfg.PID)
	return nil
}

// fanOut publishes the updates and waits for them to reach every client,
// under cfg.CPUProfile if set.
func fanOut(ctx context.Context, cfg *Config, tr *tracker, b backend) error {
	if cfg.CPUProfile != "" {
		stop, err := startCPUProfile(cfg.CPUProfile)
		if err != nil {
			return err
		}
		defer stop()
		if s, ok := b.(*splitBackend); ok {
			stop, err := s.startProfile(cfg.CPUProfile + ".server")
			if err != nil {
				return err
			}
			defer stop()
		}
	}
	var err error
	pprof.Do(ctx, pprof.Labels("side", "server"), func(ctx context.Context) { err = publishAll(ctx, cfg, tr, b) })
	if err != nil {
		return err
	}
	if cfg.Updates > 0 {
		if err := tr.wait(ctx, &tr.settledLast); err != nil {
			return fmt.Errorf("waiting for update %d to reach every client: %w", cfg.Updates, err)
		}
	}
	return nil
}

// launch calls start for clients 0..n-1, at most rate a second (0: no
// limit), until ctx ends.
func launch(ctx context.Context, n int, rate float64, start func(i int)) {
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(max(time.Duration(float64(time.Second)/rate), 1))
		defer t.Stop()
		tick = t.C
	}
	for i := range n {
		if i > 0 && tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		start(i)
	}
}

// startCPUProfile profiles this process into file until stop is called,
// and writes the mutex contention of the same window to file.mutex
// (sampled 1 event in mutexFraction).
func startCPUProfile(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	runtime.SetMutexProfileFraction(mutexFraction)
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if m, err := os.Create(file + ".mutex"); err == nil {
			_ = pprof.Lookup("mutex").WriteTo(m, 0)
			m.Close()
		}
		runtime.SetMutexProfileFraction(0)
	}, nil
}

// writeHeapProfile writes this process's heap profile, after a collection
// so that it shows what is live, to file.
func writeHeapProfile(file string) error {
	runtime.GC()
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return nil
}

// mutexFraction samples the mutex profile while the CPU profile runs.
const mutexFraction = 10

// publishAll publishes updates 1..cfg.Updates, cfg.UpdateEvery apart.
func publishAll(ctx context.Context, cfg *Config, tr *tracker, b backend) error {
	for seq := 1; seq <= cfg.Updates; seq++ {
		timer := time.NewTimer(cfg.UpdateEvery)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("before update %d: %w", seq, ctx.Err())
		}
		tr.announce(seq)
		t, err := b.publish(seq)
		if err != nil {
			return fmt.Errorf("update %d: %w", seq, err)
		}
		tr.pub[seq] = t
	}
	return nil
}

// progress writes line(time since start) every cfg.ProgressEvery until the
// returned func, which waits for it to stop, is called.
func progress(cfg *Config, line func(time.Duration) string, start time.Time) (stop func()) {
	if cfg.Progress == nil {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Fprintln(cfg.Progress, line(time.Since(start)))
			case <-done:
				return
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// lockedWriter makes w safe for writers on several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer // guarded by mu
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

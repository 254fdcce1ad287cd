package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"
)

// A load-report run (Config.LRS): --clients load-reporting clients, each
// with one LRS stream to the target, report every interval the control
// plane names (Config.LRSInterval) for Config.LRSFor once every one has been
// told what to report. The target is the tool's control plane, whose load
// reporting server shares its port, or xdsrelay in front of it
// (Config.Relay). It measures the server's CPU per report and memory per
// stream, and what the control plane sees: its streams and reports per
// second, and the requests its reports tell of against those the clients
// told of.

// Setups of a load-report comparison.
const (
	SetupLRSRelay  = "relay"  // clients → xdsrelay → the control plane's LRS server
	SetupLRSDirect = "direct" // clients → the control plane's LRS server
)

// LRSResult is what a load-report run measured.
type LRSResult struct {
	Config     Config `json:"config"`
	Setup      string `json:"setup"`
	Told       int64  `json:"told"`   // clients that got their first response
	Failed     int64  `json:"failed"` // clients whose stream failed
	FirstError string `json:"first_error,omitempty"`
	// AllTold is from the start to the last client's first response.
	AllTold     time.Duration `json:"all_told_ns"`
	Connections int           `json:"connections"`

	// Over the window: LRSFor, once every client has reported.
	Window        time.Duration `json:"window_ns"`
	ClientReports int64         `json:"client_reports"` // reports the clients sent
	// ServerCPU is the CPU of the process the clients report to (the
	// relay, or the control plane directly); UpstreamCPU that of the
	// relay's control plane. Zero without a process to sample.
	ServerCPU   time.Duration `json:"server_cpu_ns"`
	UpstreamCPU time.Duration `json:"upstream_cpu_ns,omitempty"`
	ServerPID   int           `json:"server_pid,omitempty"`
	UpstreamPID int           `json:"upstream_pid,omitempty"`
	// The control plane's load reporting server: its streams open at the
	// window's end and opened over the run, and the reports it received in
	// the window.
	CPStreams       int64 `json:"cp_streams"`
	CPStreamsOpened int64 `json:"cp_streams_opened"`
	CPReports       int64 `json:"cp_reports"`

	// The server's RSS before the clients and once they all report, and,
	// with Split, its runtime memory then, after a collection.
	RSSStart     int64         `json:"rss_start"`
	RSSReporting int64         `json:"rss_reporting"`
	MemoryStart  *ServerMemory `json:"memory_start,omitempty"`
	Memory       *ServerMemory `json:"memory,omitempty"`

	// Requests the clients' reports told of over the run, and those the
	// control plane's reports told of once the last was in: equal when no
	// count was lost or counted twice.
	Sent     int64 `json:"sent_requests"`
	Received int64 `json:"received_requests"`
}

// lrsBackend is the server side of a load-report run.
type lrsBackend struct {
	target     string
	pid, cpPID int                      // the process clients dial; behind a relay, its control plane's (0: none)
	stats      func() (LRSStats, error) // the control plane's load reporting server
	memory     func() *ServerMemory     // the dialled process's, after a collection; nil in process
	stop       func()
}

// startLRSBackend starts the control plane, and the relay in front of it
// with cfg.Relay, in this process or with cfg.Split in children.
func startLRSBackend(cfg *Config) (*lrsBackend, error) {
	coding := newSeqCoding(kinds[cfg.Type], cfg.markSpan())
	if cfg.Split {
		b, err := startSplit(cfg, coding)
		if err != nil {
			return nil, err
		}
		return &lrsBackend{target: b.child.target, pid: b.child.pid, cpPID: b.upstreamPID(),
			stats: b.publisher().lrsStats, memory: b.child.collect, stop: b.stop}, nil
	}
	srv, err := startServer(cfg, coding)
	if err != nil {
		return nil, err
	}
	s := srv.(*cpStack)
	pid := cfg.PID
	return &lrsBackend{target: cfg.Target, pid: pid, stats: func() (LRSStats, error) { return s.lrsStats(), nil },
		memory: func() *ServerMemory { return nil }, stop: s.stop}, nil
}

// lrsStats is the control plane's load reporting server's counts.
func (s *cpStack) lrsStats() LRSStats { return s.cp.lrs.stats() }

// lrsStats asks a split run's control plane for its load reporting
// server's counts.
func (c *child) lrsStats() (LRSStats, error) {
	reply, err := c.do(childCommand{Op: "lrs"})
	if err != nil {
		return LRSStats{}, err
	}
	if reply.LRS == nil {
		return LRSStats{}, errors.New("split: the server side has no load reporting server")
	}
	return *reply.LRS, nil
}

// RunLRS runs the load-report load cfg describes (cfg.LRS) and returns what
// it measured; on a timeout or ctx ending, what it measured so far with the
// error.
func RunLRS(ctx context.Context, cfg Config) (*LRSResult, error) {
	cfg, err := prepare(cfg, (*Config).Validate)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	b, err := startLRSBackend(&cfg)
	if err != nil {
		return nil, err
	}
	defer b.stop()
	cfg.Target = b.target
	res := &LRSResult{Config: cfg, Setup: SetupLRSDirect, RSSStart: sampleRSS(b.pid), MemoryStart: b.memory()}
	if cfg.Relay {
		res.Setup = SetupLRSRelay
	}
	clients := newLRSClients(&cfg)
	err = lrsLoad(ctx, &cfg, b, clients, res)
	res.Told, res.Failed, res.Connections = clients.told.Load(), clients.failed.Load(), clients.pool.connections()
	res.Sent = clients.succeeded.Load()
	if clients.firstErr != nil {
		res.FirstError = clients.firstErr.Error()
	}
	if err == nil {
		err = res.verdict()
	}
	return res, err
}

// verdict fails a run that ended without an error of its own if a client
// failed, or if the control plane was not told of exactly the requests
// the clients reported: none lost, none counted twice.
func (r *LRSResult) verdict() error {
	switch {
	case r.Failed > 0:
		return fmt.Errorf("%d of %d clients failed; %s", r.Failed, r.Config.Clients, r.FirstError)
	case r.Received != r.Sent:
		return fmt.Errorf("the control plane was told of %d requests, the clients of %d", r.Received, r.Sent)
	}
	return nil
}

// lrsLoad starts the clients, waits until every one is told what to report
// and has reported once, measures the window, stops the clients and waits
// for the control plane to be told of everything they reported.
func lrsLoad(ctx context.Context, cfg *Config, b *lrsBackend, clients *lrsClients, res *LRSResult) error {
	start := time.Now()
	stopProgress := progress(cfg, func(elapsed time.Duration) string {
		return fmt.Sprintf("%6.1fs told %d/%d, reports sent %d, failed %d", elapsed.Seconds(), clients.told.Load(), cfg.Clients,
			clients.reports.Load(), clients.failed.Load())
	}, start)
	defer stopProgress()
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	launch(cctx, cfg.Clients, cfg.Rate, func(i int) {
		wg.Go(func() {
			if err := clients.run(cctx, i); err != nil && cctx.Err() == nil {
				clients.fail(err)
			}
		})
	})
	if err := waitUntil(ctx, func() bool { return clients.told.Load()+clients.failed.Load() >= int64(cfg.Clients) }); err != nil {
		return fmt.Errorf("waiting for every client to be told what to report: %w", err)
	}
	res.AllTold = time.Since(start)
	// Every client reports once, and the relay's stream is answered.
	if err := pause(ctx, cfg.LRSInterval+cfg.LRSInterval/2); err != nil {
		return err
	}
	if err := lrsWindow(ctx, cfg, b, clients, res); err != nil {
		return err
	}
	stop()
	wg.Wait()
	// The relay sends what its clients reported last at its next period.
	err := waitUntil(ctx, func() bool {
		st, err := b.stats()
		res.Received = st.Succeeded
		return err == nil && st.Succeeded >= clients.succeeded.Load()
	}, 4*cfg.LRSInterval)
	if err == nil {
		err = pause(ctx, cfg.LRSInterval) // nothing more arrives
		st, _ := b.stats()
		res.Received = st.Succeeded
	}
	return err
}

// lrsWindow measures the server for cfg.LRSFor while the clients report.
func lrsWindow(ctx context.Context, cfg *Config, b *lrsBackend, clients *lrsClients, res *LRSResult) error {
	res.RSSReporting, res.Memory = sampleRSS(b.pid), b.memory()
	before, err := b.stats()
	if err != nil {
		return err
	}
	cpu, cpCPU, reports, t0 := sampleCPU(b.pid), sampleCPU(b.cpPID), clients.reports.Load(), time.Now()
	if err := pause(ctx, cfg.LRSFor); err != nil {
		return err
	}
	res.ServerCPU, res.UpstreamCPU = sampleCPU(b.pid)-cpu, sampleCPU(b.cpPID)-cpCPU
	res.ServerPID, res.UpstreamPID = b.pid, b.cpPID
	res.ClientReports, res.Window = clients.reports.Load()-reports, time.Since(t0)
	after, err := b.stats()
	if err != nil {
		return err
	}
	res.CPStreams, res.CPStreamsOpened, res.CPReports = after.Live, after.Opened, after.Reports-before.Reports
	return nil
}

// waitUntil polls cond every 10ms until it holds, ctx ends, or the
// optional bound passes.
func waitUntil(ctx context.Context, cond func() bool, bound ...time.Duration) error {
	if len(bound) > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound[0])
		defer cancel()
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// LRSComparison is the same clients reporting through the relay and
// directly to the control plane.
type LRSComparison struct {
	Setups []*LRSResult `json:"setups"`
	Errors []string     `json:"errors,omitempty"`
}

// CompareLRS runs cfg's load-report load through the relay, then directly.
func CompareLRS(ctx context.Context, cfg Config) (*LRSComparison, error) {
	var out LRSComparison
	var errs []error
	for _, relay := range []bool{true, false} {
		c := cfg
		c.Relay = relay
		res, err := RunLRS(ctx, c)
		if res != nil {
			out.Setups = append(out.Setups, res)
		}
		if err != nil {
			out.Errors = append(out.Errors, err.Error())
			errs = append(errs, err)
		}
	}
	return &out, errors.Join(errs...)
}

// WriteTable prints the setups side by side.
func (c *LRSComparison) WriteTable(w io.Writer) error {
	return writeLRSTable(w, c.Setups...)
}

// WriteTable prints the run's figures.
func (r *LRSResult) WriteTable(w io.Writer) error { return writeLRSTable(w, r) }

func writeLRSTable(w io.Writer, rs ...*LRSResult) error {
	if len(rs) == 0 {
		return nil
	}
	c := &rs[0].Config
	fmt.Fprintf(w, "load reports: %d clients, %d to a connection, every %s, measured over %s%s\n\n", c.Clients, c.StreamsPerConn,
		c.LRSInterval, c.LRSFor, map[bool]string{true: ", server side split", false: ""}[c.Split])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "setup\ttold\tfailed\tall told (s)\treports/s in\tserver CPU/report (µs)\tRSS/stream (KiB)\theap/stream (KiB)\tgoroutines/stream\tcp streams\tcp reports/s\tcp CPU (ms/s)\tsent\treceived\t\n")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.0f\t%s\t%s\t%s\t%s\t%d\t%.1f\t%s\t%d\t%d\t\n", r.Setup, r.Told, r.Failed, r.AllTold.Seconds(),
			perSecond(r.ClientReports, r.Window), r.cpuPerReport(), r.rssPerStream(), r.heapPerStream(), r.goroutinesPerStream(),
			r.CPStreams, perSecond(r.CPReports, r.Window), r.cpCPU(), r.Sent, r.Received)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rs {
		if r.FirstError != "" {
			fmt.Fprintf(w, "%s: first error: %s\n", r.Setup, r.FirstError)
		}
		if r.Sent != r.Received {
			fmt.Fprintf(w, "%s: the control plane was told of %d requests, the clients of %d\n", r.Setup, r.Received, r.Sent)
		}
	}
	return nil
}

// cpuPerReport is the server's CPU per report the clients sent.
func (r *LRSResult) cpuPerReport() string {
	if r.ServerPID == 0 || r.ClientReports <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(r.ServerCPU.Microseconds())/float64(r.ClientReports))
}

// cpCPU is the control plane's CPU per second of the window: the server's
// when the clients report to it directly, else the relay's upstream's.
func (r *LRSResult) cpCPU() string {
	cpu, pid := r.UpstreamCPU, r.UpstreamPID
	if r.Setup == SetupLRSDirect {
		cpu, pid = r.ServerCPU, r.ServerPID
	}
	if pid == 0 || r.Window <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(cpu.Milliseconds())/r.Window.Seconds())
}

func (r *LRSResult) rssPerStream() string {
	if r.RSSStart == 0 || r.Told == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(r.RSSReporting-r.RSSStart)/1024/float64(r.Told))
}

func (r *LRSResult) heapPerStream() string {
	if r.Memory == nil || r.MemoryStart == nil || r.Told == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", (float64(r.Memory.HeapInuse)-float64(r.MemoryStart.HeapInuse))/1024/float64(r.Told))
}

func (r *LRSResult) goroutinesPerStream() string {
	if r.Memory == nil || r.MemoryStart == nil || r.Told == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(r.Memory.Goroutines-r.MemoryStart.Goroutines)/float64(r.Told))
}

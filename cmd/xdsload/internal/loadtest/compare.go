package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"text/tabwriter"
	"time"
)

// Setups compared, in the order Compare runs them.
const (
	SetupRelay     = "relay"     // clients → xdsrelay → go-control-plane
	SetupLinear    = "linear"    // clients → go-control-plane, LinearCache
	SetupSnapshot  = "snapshot"  // clients → go-control-plane, SnapshotCache
	SetupGRPCFloor = "grpcfloor" // clients → a bare grpc-go server writing pre-encoded responses
	SetupFloor     = "floor"     // the same bytes to as many plain TCP connections
)

// Comparison is the setups run with the same parameters, and how the
// relay compares with each of the others.
type Comparison struct {
	Setups  []Setup   `json:"setups"`
	Ratios  []Ratios  `json:"ratios"`
	Skipped []Skipped `json:"skipped,omitempty"`
}

// Skipped is a setup that does not apply to the parameters, and why.
type Skipped struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Setup is one setup's results; Error is set when its run failed (its
// results are then what it measured before it stopped).
type Setup struct {
	Name   string  `json:"name"`
	Result *Result `json:"result"`
	Error  string  `json:"error,omitempty"`
}

// Ratios are the relay's figures divided by another setup's. For the
// latencies below 1 means the relay is faster; for the rates above 1 does.
type Ratios struct {
	Versus           string  `json:"versus"`
	FanOutLastP50    float64 `json:"fan_out_last_p50"`
	FanOutLastMax    float64 `json:"fan_out_last_max"`
	FirstConfigP50   float64 `json:"first_config_p50"`
	FirstConfigP99   float64 `json:"first_config_p99"`
	ConfiguredPerSec float64 `json:"configured_per_sec"`
	CPUPerChange     float64 `json:"cpu_per_change,omitempty"`
	ChurnPerSec      float64 `json:"churn_per_sec,omitempty"` // churn: cycles per second
	ChurnCycleP99    float64 `json:"churn_cycle_p99,omitempty"`
}

// setupConfig is one setup of a comparison.
type setupConfig struct {
	name string
	cfg  Config
}

// setupConfigs derives the setups' configs from cfg: the same clients,
// resources and updates; the relay in front of a control plane with
// cfg.CPCache, then each go-control-plane cache directly, the gRPC floor,
// then the socket floor, unless it does not apply (skipped says why).
func setupConfigs(cfg Config) (setups []setupConfig, skipped []Skipped) {
	if cfg.ServeCP == "" {
		cfg.ServeCP = "127.0.0.1:0"
	}
	if cfg.PID == 0 && !cfg.Split {
		cfg.PID = os.Getpid()
	}
	relayCfg, linear, snapshot, grpcFloor, floor := cfg, cfg, cfg, cfg, cfg
	relayCfg.Relay = true
	for _, c := range []*Config{&linear, &snapshot, &grpcFloor, &floor} {
		c.RelayLimits, c.RelayPersist = false, ""
	}
	linear.CPCache = CacheLinear
	snapshot.CPCache = CacheSnapshot
	grpcFloor.ServeCP, grpcFloor.GRPCFloor = "", true
	floor.ServeCP, floor.Floor = "", true
	setups = []setupConfig{{SetupRelay, relayCfg}, {SetupLinear, linear}, {SetupSnapshot, snapshot}, {SetupGRPCFloor, grpcFloor}}
	switch {
	case cfg.Churn > 0:
		skipped = append(skipped, Skipped{SetupFloor, "churn: plain TCP connections have no subscription to churn"})
	case cfg.StreamsPerConn > 1:
		skipped = append(skipped, Skipped{SetupFloor, "streams-per-conn: the floor has one TCP connection per client"})
	default:
		setups = append(setups, setupConfig{SetupFloor, floor})
	}
	if cfg.CPUProfile != "" {
		for i := range setups {
			setups[i].cfg.CPUProfile = cfg.CPUProfile + "." + setups[i].name
		}
	}
	return setups, skipped
}

// ValidateCompare reports the first problem with a defaulted cfg for
// Compare: the tool serves everything itself.
func (cfg *Config) ValidateCompare() error {
	if cfg.Target != "" || cfg.Floor || cfg.GRPCFloor || cfg.Relay || cfg.soaking() {
		return errors.New("compare runs every setup itself: give neither target, floor, grpc-floor, relay nor soak")
	}
	setups, _ := setupConfigs(*cfg)
	for _, c := range setups {
		if err := c.cfg.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Compare runs, one after the other and with the same parameters, clients
// through xdsrelay (in this process, in front of a go-control-plane control
// plane with cfg.CPCache), clients directly on go-control-plane with its
// LinearCache, then with its SnapshotCache, on the gRPC floor, and the
// socket floor (skipped for churn, and for streams sharing connections). cfg.Timeout
// bounds each setup. The RSS sampled is this process's (cfg.PID if set),
// clients included, or with cfg.Split the server side's, each setup's in a
// process of its own; memory is returned to the system before each setup.
func Compare(ctx context.Context, cfg Config) (*Comparison, error) {
	cfg = cfg.Defaults()
	if err := cfg.ValidateCompare(); err != nil {
		return nil, err
	}
	setups, skipped := setupConfigs(cfg)
	cmp := &Comparison{Skipped: skipped}
	var errs error
	for _, sc := range setups {
		name, c := sc.name, sc.cfg
		if ctx.Err() != nil {
			errs = errors.Join(errs, fmt.Errorf("%s: %w", name, ctx.Err()))
			break
		}
		if c.Progress != nil {
			fmt.Fprintf(c.Progress, "xdsload: compare: %s\n", name)
		}
		runtime.GC()
		debug.FreeOSMemory()
		res, err := Run(ctx, c)
		s := Setup{Name: name, Result: res}
		if err != nil {
			s.Error = err.Error()
			errs = errors.Join(errs, fmt.Errorf("%s: %w", name, err))
		}
		if res != nil {
			cmp.Setups = append(cmp.Setups, s)
		}
	}
	cmp.ratios()
	return cmp, errs
}

func (cmp *Comparison) setup(name string) *Result {
	for _, s := range cmp.Setups {
		if s.Name == name {
			return s.Result
		}
	}
	return nil
}

func (cmp *Comparison) ratios() {
	r := cmp.setup(SetupRelay)
	if r == nil {
		return
	}
	for _, name := range []string{SetupLinear, SetupSnapshot, SetupGRPCFloor, SetupFloor} {
		o := cmp.setup(name)
		if o == nil {
			continue
		}
		cmp.Ratios = append(cmp.Ratios, Ratios{
			Versus:           name,
			FanOutLastP50:    ratio(float64(r.FanOutLast.P50), float64(o.FanOutLast.P50)),
			FanOutLastMax:    ratio(float64(r.FanOutLast.Max), float64(o.FanOutLast.Max)),
			FirstConfigP50:   ratio(float64(r.FirstConfig.P50), float64(o.FirstConfig.P50)),
			FirstConfigP99:   ratio(float64(r.FirstConfig.P99), float64(o.FirstConfig.P99)),
			ConfiguredPerSec: ratio(r.ConfiguredPerSec, o.ConfiguredPerSec),
			CPUPerChange:     ratio(float64(r.CPU.PerChange), float64(o.CPU.PerChange)),
		})
		if r.Churn != nil && o.Churn != nil {
			q := &cmp.Ratios[len(cmp.Ratios)-1]
			q.ChurnPerSec = ratio(r.Churn.PerSec, o.Churn.PerSec)
			q.ChurnCycleP99 = ratio(float64(r.Churn.Cycle.P99), float64(o.Churn.Cycle.P99))
		}
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// WriteTable prints the comparison: a row per setup, then the ratios.
func (cmp *Comparison) WriteTable(w io.Writer) error {
	if len(cmp.Setups) == 0 {
		_, err := fmt.Fprintln(w, "xdsload compare: no setup ran")
		return err
	}
	c := cmp.Setups[0].Result.Config
	fmt.Fprintf(w, "xdsload compare: %d %s %s clients, %s", c.Clients, c.Variant, c.Type, describeWorkload(&c))
	fmt.Fprintf(w, "; relay upstream: go-control-plane %s cache\n\n", c.CPCache)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if c.Churn > 0 {
		cmp.writeChurn(tw)
	} else {
		cmp.writeLoad(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	cmp.writeNotes(w, &c)
	return nil
}

// writeLoad prints a row per setup of a load run, then the ratios.
func (cmp *Comparison) writeLoad(tw io.Writer) {
	fmt.Fprintf(tw, "setup\tconfigured\tfailed\tconns\tfan-out last (ms) min\tp50\tmax\tupdates\tfirst config (ms) p50\tp99\testablished/s\tconfigured/s\tRSS/stream\tgoroutines/stream\tCPU/change\tCPU/client/change\trelay's CP CPU/change\t\n")
	for _, s := range cmp.Setups {
		r := s.Result
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", s.Name,
			r.Configured, r.Config.Clients, r.Failed, r.Connections,
			ms(r.FanOutLast.Min), ms(r.FanOutLast.P50), ms(r.FanOutLast.Max), r.FanOutLast.N, r.Config.Updates,
			ms(r.FirstConfig.P50), ms(r.FirstConfig.P99), r.EstablishedPerSec, r.ConfiguredPerSec,
			size(r.IdlePerStream.RSS), perStreamGoroutines(r), cpuTime(r.CPU.PerChange), cpuTime(r.CPU.PerClientPerChange), upstreamCPUTime(r))
	}
	fmt.Fprintln(tw)
	if len(cmp.Ratios) > 0 {
		fmt.Fprintf(tw, "relay ÷\tfan-out last p50\tfan-out last max\tfirst config p50\tfirst config p99\tconfigured/s\tCPU/change\t\n")
		for _, q := range cmp.Ratios {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.3g\t\n", q.Versus, q.FanOutLastP50, q.FanOutLastMax,
				q.FirstConfigP50, q.FirstConfigP99, q.ConfiguredPerSec, q.CPUPerChange)
		}
		fmt.Fprintln(tw)
	}
}

// writeChurn prints a row per setup of a churn run, then the ratios.
func (cmp *Comparison) writeChurn(tw io.Writer) {
	fmt.Fprintf(tw, "setup\tcycles\tfailed\tconns\tstreams/s\tcycle (ms) p50\tp99\tRSS baseline\tend\tsettled\tafter GC\tgoroutines baseline\tend\tsettled\tafter GC\t\n")
	for _, s := range cmp.Setups {
		ch := s.Result.Churn
		if ch == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.1f\t%s\t%s\t", s.Name, ch.Cycles, ch.Failed, s.Result.Connections,
			ch.PerSec, ms(ch.Cycle.P50), ms(ch.Cycle.P99))
		samples := ch.samples()
		for _, x := range samples {
			fmt.Fprintf(tw, "%s\t", size(x.RSS))
		}
		for _, x := range samples {
			fmt.Fprintf(tw, "%s\t", x.goroutines())
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintln(tw)
	if len(cmp.Ratios) > 0 {
		fmt.Fprintf(tw, "relay ÷\tstreams/s\tcycle p99\t\n")
		for _, q := range cmp.Ratios {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t\n", q.Versus, q.ChurnPerSec, q.ChurnCycleP99)
		}
		fmt.Fprintln(tw)
	}
}

// writeNotes explains the columns, and names skipped and failed setups.
func (cmp *Comparison) writeNotes(w io.Writer, c *Config) {
	if c.Churn > 0 {
		fmt.Fprintln(w, "streams/s: connect, subscribe, first response, close cycles completed per second; ratio above 1: the relay churns faster.")
		fmt.Fprintln(w, "server samples: before the clients, at the end of the churn, after settling, after the server ran runtime.GC and debug.FreeOSMemory.")
	} else {
		fmt.Fprintln(w, "latency ratios below 1: the relay is faster; configured/s above 1: the relay admits faster; CPU/change below 1: the relay spends less.")
		fmt.Fprintln(w, "conns: gRPC connections the clients dialed (streams-per-conn clients each); RSS/stream and goroutines/stream: the server's growth from before the clients to all configured and idle, per stream.")
		fmt.Fprintln(w, "CPU/change: the server's CPU time (user+system, 10ms ticks) from before the first update to the last one delivered, per update, and per client.")
	}
	fmt.Fprintln(w, "grpcfloor: a bare grpc-go server with the relay's transport options, writing each stream one pre-encoded response per change (no cache, no protocol state); floor: the same bytes on plain TCP.")
	switch {
	case c.Split:
		fmt.Fprintln(w, "server: the child process of each setup; for the relay, the relay's own process (its control plane runs in another: relay's CP CPU/change).")
	default:
		fmt.Fprintln(w, "server: this process, clients included (add --split to measure the server alone); goroutines need --split.")
	}
	if r := cmp.setup(SetupRelay); r != nil {
		if line := r.admission(); line != "" {
			fmt.Fprintf(w, "%s: %s\n", SetupRelay, line)
		}
	}
	for _, s := range cmp.Skipped {
		fmt.Fprintf(w, "%s: skipped (%s)\n", s.Name, s.Reason)
	}
	for _, s := range cmp.Setups {
		if s.Error != "" {
			fmt.Fprintf(w, "%s: %s\n", s.Name, s.Error)
		}
	}
}

// perStreamGoroutines formats the goroutines per idle stream, "-" when
// the server's runtime is not reported.
func perStreamGoroutines(r *Result) string {
	if r.ServerMemory == nil || r.ServerMemoryStart == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", r.IdlePerStream.Goroutines)
}

// upstreamCPUTime formats the CPU per change of a split relay's control
// plane, "-" for other setups.
func upstreamCPUTime(r *Result) string {
	if r.CPU.Upstream == 0 {
		return "-"
	}
	return cpuTime(r.CPU.UpstreamPerChange)
}

// cpuTime formats a CPU time in milliseconds, with microseconds.
func cpuTime(d time.Duration) string {
	return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
}

// describeWorkload is the resources, updates and subscriptions of a run.
func describeWorkload(c *Config) string {
	s := fmt.Sprintf("%d resources", c.Resources)
	if c.Type == "eds" {
		s += fmt.Sprintf(" × %d endpoints", c.Endpoints)
	}
	rate := "no rate limit"
	if c.Rate > 0 {
		rate = fmt.Sprintf("at most %.0f streams/s", c.Rate)
	}
	if c.Churn > 0 {
		s += fmt.Sprintf(", churn for %s then %s settling", c.Churn, c.ChurnSettle)
	} else {
		s += fmt.Sprintf(", %d updates every %s", c.Updates, c.UpdateEvery)
	}
	s += fmt.Sprintf(", %s, %d streams per connection, timeout %s per setup", rate, c.StreamsPerConn, c.Timeout)
	if len(c.Names) > 0 {
		s += fmt.Sprintf(", names %v", c.Names)
	} else {
		s += ", wildcard"
	}
	return s
}

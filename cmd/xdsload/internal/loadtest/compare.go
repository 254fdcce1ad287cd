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
)

// Setups compared, in the order Compare runs them.
const (
	SetupRelay    = "relay"    // clients → xdsrelay → go-control-plane
	SetupLinear   = "linear"   // clients → go-control-plane, LinearCache
	SetupSnapshot = "snapshot" // clients → go-control-plane, SnapshotCache
	SetupFloor    = "floor"    // the same bytes to as many plain TCP connections
)

var setupNames = []string{SetupRelay, SetupLinear, SetupSnapshot, SetupFloor}

// Comparison is the four setups run with the same parameters, and how the
// relay compares with each of the others.
type Comparison struct {
	Setups []Setup  `json:"setups"`
	Ratios []Ratios `json:"ratios"`
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
}

// setupConfigs derives the four setups' configs from cfg: the same clients,
// resources and updates; the relay in front of a control plane with
// cfg.CPCache, then each go-control-plane cache directly, then the floor.
func setupConfigs(cfg Config) []Config {
	if cfg.ServeCP == "" {
		cfg.ServeCP = "127.0.0.1:0"
	}
	if cfg.PID == 0 && !cfg.Split {
		cfg.PID = os.Getpid()
	}
	relayCfg, linear, snapshot, floor := cfg, cfg, cfg, cfg
	relayCfg.Relay = true
	linear.CPCache = CacheLinear
	snapshot.CPCache = CacheSnapshot
	floor.ServeCP, floor.Floor = "", true
	setups := []Config{relayCfg, linear, snapshot, floor}
	if cfg.CPUProfile != "" {
		for i, name := range setupNames {
			setups[i].CPUProfile = cfg.CPUProfile + "." + name
		}
	}
	return setups
}

// ValidateCompare reports the first problem with a defaulted cfg for
// Compare: the tool serves everything itself.
func (cfg *Config) ValidateCompare() error {
	if cfg.Target != "" || cfg.Floor || cfg.Relay {
		return errors.New("compare runs every setup itself: give neither target, floor nor relay")
	}
	for _, c := range setupConfigs(*cfg) {
		if err := c.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Compare runs, one after the other and with the same parameters, clients
// through xdsrelay (in this process, in front of a go-control-plane control
// plane with cfg.CPCache), clients directly on go-control-plane with its
// LinearCache, then with its SnapshotCache, and the socket floor. cfg.Timeout
// bounds each setup. The RSS sampled is this process's (cfg.PID if set),
// clients included, or with cfg.Split the server side's, each setup's in a
// process of its own; memory is returned to the system before each setup.
func Compare(ctx context.Context, cfg Config) (*Comparison, error) {
	cfg = cfg.Defaults()
	if err := cfg.ValidateCompare(); err != nil {
		return nil, err
	}
	cmp := &Comparison{}
	var errs error
	for i, c := range setupConfigs(cfg) {
		name := setupNames[i]
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
	for _, name := range []string{SetupLinear, SetupSnapshot, SetupFloor} {
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
		})
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
	fmt.Fprintf(tw, "setup\tconfigured\tfailed\tfan-out last (ms) min\tp50\tmax\tupdates\tfirst config (ms) p50\tp99\testablished/s\tconfigured/s\tRSS/client\t\n")
	for _, s := range cmp.Setups {
		r := s.Result
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%.0f\t%.0f\t%s\t\n", s.Name,
			r.Configured, r.Config.Clients, r.Failed,
			ms(r.FanOutLast.Min), ms(r.FanOutLast.P50), ms(r.FanOutLast.Max), r.FanOutLast.N, r.Config.Updates,
			ms(r.FirstConfig.P50), ms(r.FirstConfig.P99), r.EstablishedPerSec, r.ConfiguredPerSec,
			size((r.RSS.Configured-r.RSS.Start)/int64(max(r.Config.Clients, 1))))
	}
	fmt.Fprintln(tw)
	if len(cmp.Ratios) > 0 {
		fmt.Fprintf(tw, "relay ÷\tfan-out last p50\tfan-out last max\tfirst config p50\tfirst config p99\tconfigured/s\t\n")
		for _, q := range cmp.Ratios {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", q.Versus, q.FanOutLastP50, q.FanOutLastMax,
				q.FirstConfigP50, q.FirstConfigP99, q.ConfiguredPerSec)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "latency ratios below 1: the relay is faster; configured/s above 1: the relay admits faster.")
	if c.Split {
		fmt.Fprintln(w, "RSS/client: growth of the server process's RSS (relay and control plane; control plane; floor server) from before the clients to all configured.")
	} else {
		fmt.Fprintln(w, "RSS/client: growth of this process's RSS from before the clients to all configured, clients included.")
	}
	for _, s := range cmp.Setups {
		if s.Error != "" {
			fmt.Fprintf(w, "%s: %s\n", s.Name, s.Error)
		}
	}
	return nil
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
	s += fmt.Sprintf(", %d updates every %s, %s, timeout %s per setup", c.Updates, c.UpdateEvery, rate, c.Timeout)
	if len(c.Names) > 0 {
		s += fmt.Sprintf(", names %v", c.Names)
	} else {
		s += ", wildcard"
	}
	return s
}

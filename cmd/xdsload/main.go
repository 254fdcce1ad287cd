package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xdsrelay/xdsrelay/cmd/xdsload/internal/loadtest"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

const usage = `xdsload opens many xDS clients against an xDS server, each on its own gRPC
connection or --streams-per-conn to one, and measures connect rate, time to
first config, update fan-out latency, bytes received, the server's memory and
CPU per change, or with --churn connect/disconnect cycles per second.
See "go doc ./cmd/xdsload".

Usage:
  xdsload --target HOST:PORT [flags]          load any xDS server
  xdsload --serve-cp 127.0.0.1:18000 [flags]  serve a control plane and load it,
                                              or --target a relay in front of it
  xdsload --floor [flags]                     the plain TCP socket floor
  xdsload --grpc-floor [flags]                the gRPC floor: a bare grpc-go server
                                              writing pre-encoded responses
  xdsload --compare [flags]                   xdsrelay, go-control-plane's linear
                                              and snapshot caches, the gRPC floor
                                              and the socket floor, one after the
                                              other, side by side
  xdsload --compare --split --churn 20s       connect/disconnect churn, side by side
  xdsload --lrs --compare --split [flags]     load reports (LRS) through the
                                              relay and directly: CPU per
                                              report, memory per stream, the
                                              control plane's streams and reports
  xdsload --soak 1h --split [flags]           soak the relay: churn, resubscriptions,
                                              NACKs, control-plane changes and
                                              restarts (--soak-faults: silence, trickle,
                                              resets too); a row of the relay's figures
                                              every --soak-every, and a verdict
  xdsload --envoy --serve-cp ADDR [--relay]   clients that behave as Envoy (cluster
                                              warming): how long a cluster change
                                              takes to make the cluster usable
  xdsload --rolling --relay-bin ./xdsrelay    a rolling restart of two relays behind
                                              one address, under load: GOAWAY, where
                                              the clients go, how long they take, the
                                              saved cache, the last versions
  xdsload --fleet 3 --relay-bin ./xdsrelay    three relay processes as a fleet in front
                                              of the tool's control plane, and apart:
                                              its streams and CPU per change, the extra
                                              hop, one relay killed, the balance after

Flags:
`

func main() {
	loadtest.ServerSideMain() // the server side of a --split run
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	var out interface{ WriteTable(io.Writer) error }
	switch {
	case f.cfg.Fleet.Relays > 0:
		var res *loadtest.Fleet
		if res, err = loadtest.RunFleet(ctx, f.cfg); res != nil {
			out = res
		}
	case f.rolling:
		var res *loadtest.Rolling
		if res, err = loadtest.RunRolling(ctx, f.cfg); res != nil {
			out = res
		}
	case f.envoy:
		var res *loadtest.EnvoyResult
		if res, err = loadtest.RunEnvoy(ctx, f.envoyConfig()); res != nil {
			out = res
		}
	case f.cfg.LRS && f.compare:
		var cmp *loadtest.LRSComparison
		if cmp, err = loadtest.CompareLRS(ctx, f.cfg); cmp != nil {
			out = cmp
		}
	case f.cfg.LRS:
		var res *loadtest.LRSResult
		if res, err = loadtest.RunLRS(ctx, f.cfg); res != nil {
			out = res
		}
	case f.compare:
		var cmp *loadtest.Comparison
		if cmp, err = loadtest.Compare(ctx, f.cfg); cmp != nil {
			out = cmp
		}
	default:
		var res *loadtest.Result
		f.cfg.Soak.Rows = stdout // a soak's rows, as they come
		if res, err = loadtest.Run(ctx, f.cfg); res != nil {
			out = res
		}
	}
	if out != nil {
		_ = out.WriteTable(stdout)
		if f.json != "" {
			err = errors.Join(err, writeJSON(f.json, out))
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "xdsload:", err)
		return 1
	}
	return 0
}

// flags are the command line: a Config and what it is built from.
type flags struct {
	cfg     loadtest.Config
	names   string
	pid     string
	json    string
	gate    string
	compare bool
	// --envoy: Envoy-behaving clients (loadtest.RunEnvoy).
	envoy        bool
	initialFetch time.Duration
	// --rolling: a rolling restart of two relays (loadtest.RunRolling).
	rolling bool
}

// envoyConfig is the run --envoy asks for.
func (f *flags) envoyConfig() loadtest.EnvoyConfig {
	c := &f.cfg
	return loadtest.EnvoyConfig{Target: c.Target, ServeCP: c.ServeCP, Relay: c.Relay, Clients: c.Clients,
		StreamsPerConn: c.StreamsPerConn, Rate: c.Rate, Delta: c.Variant == loadtest.VariantDelta, PerType: !c.ADS,
		Clusters: c.Resources, Endpoints: c.Endpoints, Updates: c.Updates, UpdateEvery: c.UpdateEvery,
		InitialFetchTimeout: f.initialFetch, PID: c.PID, Timeout: c.Timeout, Progress: c.Progress}
}

func (f *flags) define(fs *flag.FlagSet) {
	c := &f.cfg
	fs.StringVar(&c.Target, "target", "", "xDS server `host:port`; default: the --serve-cp control plane")
	fs.IntVar(&c.Clients, "clients", 100, "number of clients `N`, one xDS stream each")
	fs.IntVar(&c.StreamsPerConn, "streams-per-conn", 1, "clients (streams) per gRPC connection `N`: 100,000 clients at 100 take 1,000 connections; the floor needs 1")
	fs.Float64Var(&c.Rate, "rate", 1000, "open at most `R` streams per second; 0: no limit")
	fs.StringVar(&c.Variant, "variant", loadtest.VariantDelta, "protocol variant: delta or sotw")
	fs.BoolVar(&c.ADS, "ads", true, "use the aggregated service (ADS); false: the per-type service (EDS, CDS, LDS, RDS)")
	fs.StringVar(&c.Type, "type", "eds", "resource type: eds, cds, lds or rds, or another of their names (Cluster, clusters, a type URL)")
	fs.StringVar(&f.names, "names", "", "comma-separated resource `names` to subscribe to; empty: wildcard")
	fs.StringVar(&c.NodeCluster, "node-cluster", "load", "node.cluster sent by every client (node.id is xdsload-<i>)")
	fs.StringVar(&f.pid, "pid", "", "sample the VmRSS of server process `PID` at the start, once every client is configured, and at the end; \"self\": this process, clients included")
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Minute, "bound on the whole run, which stops by itself then")
	fs.StringVar(&c.ServeCP, "serve-cp", "", "serve a go-control-plane control plane on `addr` and publish updates")
	fs.StringVar(&c.CPCache, "cp-cache", loadtest.CacheSnapshot, "control-plane cache: snapshot (keyed by node.cluster) or linear")
	fs.StringVar(&c.CPProtocol, "cp-protocol", "delta", "what the control plane speaks: delta (delta and SotW, ADS and per type), sotw (SotW ADS, delta refused with UNIMPLEMENTED, as Gloo's) or sotw-per-type (the per-type SotW services only, as Contour's); a relay in front finds it (upstream.protocol: auto)")
	fs.IntVar(&c.Resources, "resources", 10, "resources `K` served (eds: cla-0..cla-K-1; cds: cluster-i; lds: listener-i; rds: route-i)")
	fs.IntVar(&c.Endpoints, "endpoints", 200, "endpoints per ClusterLoadAssignment (eds)")
	fs.DurationVar(&c.UpdateEvery, "update-every", 500*time.Millisecond, "pause `D` before each update")
	fs.IntVar(&c.Updates, "updates", 10, "updates `U` published, one resource each (with --serve-cp, --floor or --grpc-floor)")
	fs.DurationVar(&c.Churn, "churn", 0, "instead of updates, churn for `D`: every client loops connect (a new connection unless --streams-per-conn > 1, then a new stream), subscribe, first response, close; reports cycles per second, cycle time and the server's memory before, at the end, settled and after GC")
	fs.DurationVar(&c.ChurnSettle, "churn-settle", 3*time.Second, "with --churn, pause `D` after the last client stopped before sampling the server as settled")
	fs.BoolVar(&c.Floor, "floor", false, "measure the socket floor: the same bytes to as many plain TCP connections on loopback")
	fs.BoolVar(&c.GRPCFloor, "grpc-floor", false, "measure the gRPC floor: a bare grpc-go server on the clients' xDS service (the relay's transport options) that writes each stream one pre-encoded response, the bytes the relay would send, for the first config and each update; no cache, no protocol state")
	fs.BoolVar(&c.Relay, "relay", false, "start xdsrelay in this process in front of the --serve-cp control plane and load it")
	fs.BoolVar(&c.Split, "split", false, "run the server side (control plane, relay, floor or gRPC floor server) in a child process: clients and server then each have the whole open-file limit, and RSS is the server's alone")
	fs.BoolVar(&f.compare, "compare", false, "run, one after the other with the same flags, clients through xdsrelay (in this process, its upstream a control plane with --cp-cache), directly on go-control-plane's linear cache, on its snapshot cache, on the gRPC floor, and the socket floor; print them side by side with the relay's ratios (--cp-cache is then the relay's upstream, default linear; --timeout bounds each setup)")
	fs.BoolVar(&c.RelayLimits, "relay-limits", false, "keep the relay's default admission limits (stream_rate 1000/s burst 10000, max_streams, max_groups, max_streams_per_connection 100...) instead of turning them off; the clients retry a refused stream (RESOURCE_EXHAUSTED or UNAVAILABLE) as Envoy does, with exponential backoff from 500ms to 30s and jitter, and the result reports the retries and when every client was configured")
	fs.StringVar(&c.RelayPersist, "relay-persist", "", "the relay saves its cache in `dir` (cache.persist_dir, every second and on shutdown) and restores it on start: a second run with the same dir measures admission after a restart with a warm cache, and counts the first configs served from it")
	fs.Func("relay-group-by", "the relay's upstream.group_by, comma-separated `fields` (default cluster: every client in one group); id makes each client a group of its own, as istiod and Consul need (with --cp-cache linear: a snapshot cache keyed by node.cluster answers no group without one)", func(v string) error {
		c.RelayGroupBy = strings.Split(v, ",")
		return nil
	})
	fs.BoolVar(&c.RelayConsistencyOff, "relay-consistency-off", false, "turn the relay's make before break off (consistency.max_wait: 0): references are neither waited for nor fetched; to measure what they cost against a run without it")
	s := &c.Soak
	fs.DurationVar(&s.Duration, "soak", 0, "soak the relay for `D` (it implies --relay, and --serve-cp 127.0.0.1:0 unless given): clients of both variants reconnect, change subscriptions and NACK while the control plane changes resources (every --update-every, default 2s with --soak) and restarts; a row of the relay's RSS, heap, goroutines, fds, streams and fan-out p50 every --soak-every; exits 1 unless each --soak-gate figure stays within 10% of its value after the first 5m (half, for a soak under 10m)")
	fs.DurationVar(&s.Every, "soak-every", 0, "a soak row every `D`; default 1m, or for a soak under 10m a tenth of it, 5s at least")
	fs.DurationVar(&s.RestartEvery, "soak-restart-every", 0, "restart the control plane every `D`; default 60s, or a third of a shorter soak")
	fs.DurationVar(&s.Down, "soak-down", 0, "keep the control plane down for `D` at each restart; default 1s (a quarter of --soak-restart-every at most)")
	fs.BoolVar(&s.Faults, "soak-faults", false, "put a TCP proxy between the relay and its control plane, and every --soak-restart-every inject the next fault in turn: a control-plane restart, silence for --soak-fault-for, a trickle at 2 KiB/s for --soak-fault-for, a reset of every connection; the relay's upstream keepalive is then 10s with a 5s timeout, connect_timeout 5s")
	fs.DurationVar(&s.FaultFor, "soak-fault-for", 0, "with --soak-faults, how long a silence or a trickle lasts `D`; default 20s, past the relay's 15s keepalive bound")
	fs.Float64Var(&s.Churn, "soak-churn", 0, "the `fraction` of the clients that reconnect every --soak-churn-every, and of those that change their subscriptions; default 0.05")
	fs.DurationVar(&s.ChurnEvery, "soak-churn-every", 0, "churn every `D`; default 5s")
	fs.IntVar(&s.NACKEvery, "soak-nack-every", 0, "NACK one response in `N`, over all clients; default 100")
	fs.StringVar(&f.gate, "soak-gate", "", "the `figures` that fail the soak, comma-separated among rss,heap,goroutines,fds,streams,fanout; default all but fanout (a latency, too noisy to gate)")
	fs.BoolVar(&s.ReportOnly, "soak-report-only", false, "report the soak's verdict, but exit 0 whatever it is")
	fs.BoolVar(&f.envoy, "envoy", false, "clients that behave as Envoy (wildcard CDS, EDS for every cluster, and a cluster warming until its endpoints come again): the control plane serves --resources EDS clusters from a LinearCache, each update changes one cluster and not its endpoints, and each row says how long the change took to make the cluster usable on every client (--variant, --ads, --relay, --target, --pid, --streams-per-conn apply)")
	fs.DurationVar(&f.initialFetch, "initial-fetch-timeout", 15*time.Second, "with --envoy, Envoy's initial_fetch_timeout: a changed cluster still warming this long after it arrived counts as stalled (and usable then, on old endpoints)")
	fs.BoolVar(&c.LRS, "lrs", false, "load reports instead of xDS: every client opens one LRS stream and reports every --lrs-interval, for --lrs-for once all report, to the --serve-cp control plane's load reporting server or, with --relay, to the relay in front of it; with --compare, through the relay and then directly; reports the server's CPU per report and memory per stream, and the control plane's streams and reports per second")
	fs.DurationVar(&c.LRSInterval, "lrs-interval", 0, "with --lrs, the load_reporting_interval the control plane (and the relay, until it answers) asks for; default 1s")
	fs.DurationVar(&c.LRSFor, "lrs-for", 0, "with --lrs, how long to measure once every client reports; default 30s")
	fs.BoolVar(&f.rolling, "rolling", false, "a rolling restart: two xdsrelay processes (--relay-bin) behind a TCP balancer in front of the tool's control plane (--serve-cp, 127.0.0.1:0 unless given; a resource changed every --update-every, 1s unless given), each restarted in turn with SIGTERM and started again warm (cache.persist_dir); checks that every stream ends after a GOAWAY and its client is answered by the other relay, that the restarted relay serves its saved cache at once, and that every client ends at the control plane's last version with no removal; prints the reconnect times per restart")
	fs.StringVar(&c.Rolling.RelayBin, "relay-bin", "", "with --rolling or --fleet, the xdsrelay executable `path` (go build -o xdsrelay ./cmd/xdsrelay)")
	fs.IntVar(&c.Fleet.Relays, "fleet", 0, "a fleet run: `N` xdsrelay processes (--relay-bin) on loopback in front of the tool's control plane (in a process of its own; a resource changed every --update-every, 1s unless given, --updates times), the --clients spread over --groups groups and over the relays, each client reconnecting to a relay at random when its stream ends; the same load twice, the relays apart and then a fleet (a static fleet.peers list): the control plane's streams and CPU per change, the change-to-client latency, the extra hop's (the clients whose relay draws their group from its owner against the owner's), then one relay killed (SIGKILL: groups moved, new streams at the control plane, removals and resources sent again to the other clients, the time until each moved group is fetched again), then started again, each relay's clients every second for --balance-for; exits 1 unless the fleet held one stream per group, told no client of a removal nor sent it anything again, opened at most the moved groups' streams, and balanced within the slack moving no client more than twice")
	fs.IntVar(&c.Fleet.Groups, "groups", 0, "with --fleet, the groups `G` the clients are spread over (node.cluster g0 to gG-1); default 30")
	fs.DurationVar(&c.Fleet.BalanceFor, "balance-for", 0, "with --fleet, how long `D` each relay's clients are sampled after the killed relay starts again; default 2m")
	fs.StringVar(&f.json, "json", "", "also write the results as JSON to `file`")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of this process (the clients, and the control plane and relay it serves) while the updates fan out to `file`; with --compare, one per setup, named file.<setup>; the server side of a --split run is file.server; each with the mutex contention of the same window in <file>.mutex; and the split server's heap once every client is configured in file.server.heap")
}

// parseFlags returns the command line. It reports its errors on stderr.
func parseFlags(args []string, stderr io.Writer) (*flags, error) {
	fs := flag.NewFlagSet("xdsload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	var f flags
	f.define(fs)
	if err := fs.Parse(args); err != nil {
		return &f, err
	}
	f.cfg.Type = typeKey(f.cfg.Type)
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if (f.compare || f.cfg.Soak.Duration > 0) && !set["cp-cache"] {
		// The relay's upstream is then the leaner of go-control-plane's
		// caches, so that the relay's figures are the relay's.
		f.cfg.CPCache = loadtest.CacheLinear
	}
	if f.cfg.Soak.Duration > 0 {
		f.soakDefaults(set)
	}
	if f.rolling {
		f.rollingDefaults(set)
	}
	if f.cfg.Fleet.Relays > 0 {
		f.fleetDefaults(set)
	}
	err := f.finish(fs.Args())
	if err != nil {
		fmt.Fprintln(stderr, "xdsload:", err)
	}
	f.cfg.Progress = stderr
	return &f, err
}

// typeKey is the tool's name for a type (eds, cds, lds, rds) given by any
// of the names the relay takes (xds.ParseType); another word is left as it
// is, for the configuration's check to refuse.
func typeKey(s string) string {
	if t, err := xds.ParseType(s); err == nil {
		return strings.ToLower(xds.TypeAbbrev(t))
	}
	return s
}

// soakDefaults makes a soak what --soak says: through the relay in front of
// the tool's control plane, and its defaults (Config.Defaults) for the
// flags not given whose default is not a soak's.
func (f *flags) soakDefaults(set map[string]bool) {
	c := &f.cfg
	c.Relay = true
	if c.ServeCP == "" {
		c.ServeCP = "127.0.0.1:0"
	}
	if !set["update-every"] {
		c.UpdateEvery = 0
	}
	if !set["timeout"] {
		c.Timeout = 0
	}
}

// rollingDefaults makes a rolling restart what --rolling says: in front
// of the tool's control plane, its leaner cache, a change every second,
// and room for 10,000 clients.
func (f *flags) rollingDefaults(set map[string]bool) {
	c := &f.cfg
	if c.ServeCP == "" {
		c.ServeCP = "127.0.0.1:0"
	}
	if !set["cp-cache"] {
		c.CPCache = loadtest.CacheLinear
	}
	if !set["update-every"] {
		c.UpdateEvery = time.Second
	}
	if !set["timeout"] {
		c.Timeout = 10 * time.Minute
	}
}

// fleetDefaults makes a fleet run what --fleet says: a change every
// second, the relay binary --relay-bin names, and room for the whole run.
func (f *flags) fleetDefaults(set map[string]bool) {
	c := &f.cfg
	c.Fleet.RelayBin = c.Rolling.RelayBin
	c.Rolling.RelayBin = ""
	if !set["update-every"] {
		c.UpdateEvery = time.Second
	}
	if !set["timeout"] {
		c.Timeout = 20 * time.Minute
	}
}

// finish fills the Config from the string flags and checks it.
func (f *flags) finish(rest []string) error {
	if len(rest) > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(rest, " "))
	}
	var err error
	if f.cfg.PID, err = parsePID(f.pid); err != nil {
		return err
	}
	if f.names != "" {
		f.cfg.Names = strings.Split(f.names, ",")
	}
	if f.gate != "" {
		f.cfg.Soak.Gate = strings.Split(f.gate, ",")
	}
	if f.cfg.Fleet.Relays > 0 {
		if f.rolling || f.envoy || f.compare || f.cfg.LRS || f.cfg.Churn > 0 || f.cfg.Soak.Duration > 0 {
			return errors.New("fleet: give neither rolling, envoy, compare, lrs, churn nor soak")
		}
		cfg := f.cfg.Defaults()
		return cfg.ValidateFleet()
	}
	if f.rolling {
		if f.envoy || f.compare {
			return errors.New("rolling: give neither envoy nor compare")
		}
		cfg := f.cfg.Defaults()
		return cfg.ValidateRolling()
	}
	if f.envoy {
		c := &f.cfg
		if f.compare || c.LRS || c.Split || c.Churn > 0 || c.Floor || c.GRPCFloor || c.Soak.Duration > 0 {
			return errors.New("envoy: give neither compare, lrs, split, churn, floor, grpc-floor nor soak")
		}
		cfg := f.envoyConfig()
		return cfg.Validate()
	}
	if f.cfg.ServeCP == "" && (f.compare || f.cfg.LRS && f.cfg.Target == "") {
		f.cfg.ServeCP = "127.0.0.1:0"
	}
	if f.cfg.LRS {
		cfg := f.cfg.Defaults()
		return cfg.Validate()
	}
	if f.compare {
		cfg := f.cfg.Defaults()
		return cfg.ValidateCompare()
	}
	cfg := f.cfg.SoakDefaults()
	return cfg.Validate()
}

// parsePID reads --pid: a process id, "self" for this process, or empty.
func parsePID(s string) (int, error) {
	switch s {
	case "":
		return 0, nil
	case "self":
		return os.Getpid(), nil
	}
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid %q: want a process id or self", s)
	}
	return pid, nil
}

func writeJSON(file string, res any) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

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
	if f.compare {
		var cmp *loadtest.Comparison
		if cmp, err = loadtest.Compare(ctx, f.cfg); cmp != nil {
			out = cmp
		}
	} else {
		var res *loadtest.Result
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
	compare bool
}

func (f *flags) define(fs *flag.FlagSet) {
	c := &f.cfg
	fs.StringVar(&c.Target, "target", "", "xDS server `host:port`; default: the --serve-cp control plane")
	fs.IntVar(&c.Clients, "clients", 100, "number of clients `N`, one xDS stream each")
	fs.IntVar(&c.StreamsPerConn, "streams-per-conn", 1, "clients (streams) per gRPC connection `N`: 100,000 clients at 100 take 1,000 connections; the floor needs 1")
	fs.Float64Var(&c.Rate, "rate", 1000, "open at most `R` streams per second; 0: no limit")
	fs.StringVar(&c.Variant, "variant", loadtest.VariantDelta, "protocol variant: delta or sotw")
	fs.BoolVar(&c.ADS, "ads", true, "use the aggregated service (ADS); false: the per-type service (EDS, CDS, LDS, RDS)")
	fs.StringVar(&c.Type, "type", "eds", "resource type: eds, cds, lds or rds")
	fs.StringVar(&f.names, "names", "", "comma-separated resource `names` to subscribe to; empty: wildcard")
	fs.StringVar(&c.NodeCluster, "node-cluster", "load", "node.cluster sent by every client (node.id is xdsload-<i>)")
	fs.StringVar(&f.pid, "pid", "", "sample the VmRSS of server process `PID` at the start, once every client is configured, and at the end; \"self\": this process, clients included")
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Minute, "bound on the whole run, which stops by itself then")
	fs.StringVar(&c.ServeCP, "serve-cp", "", "serve a go-control-plane control plane on `addr` and publish updates")
	fs.StringVar(&c.CPCache, "cp-cache", loadtest.CacheSnapshot, "control-plane cache: snapshot (keyed by node.cluster) or linear")
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
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.compare && !set["cp-cache"] {
		// The relay's upstream is then the leaner of go-control-plane's
		// caches, so that the relay's figures are the relay's.
		f.cfg.CPCache = loadtest.CacheLinear
	}
	err := f.finish(fs.Args())
	if err != nil {
		fmt.Fprintln(stderr, "xdsload:", err)
	}
	f.cfg.Progress = stderr
	return &f, err
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
	if f.compare {
		if f.cfg.ServeCP == "" {
			f.cfg.ServeCP = "127.0.0.1:0"
		}
		cfg := f.cfg.Defaults()
		return cfg.ValidateCompare()
	}
	return f.cfg.Validate()
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

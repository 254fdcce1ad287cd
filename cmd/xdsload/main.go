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

	"github.com/xdsrelay/xdsrelay/internal/loadtest"
)

const usage = `xdsload opens many xDS clients against an xDS server, each on its own gRPC
connection, and measures connect rate, time to first config, update fan-out
latency, bytes received and the server's memory. See "go doc ./cmd/xdsload".

Usage:
  xdsload --target HOST:PORT [flags]          load any xDS server
  xdsload --serve-cp 127.0.0.1:18000 [flags]  serve a control plane and load it,
                                              or --target a relay in front of it
  xdsload --floor [flags]                     the plain TCP socket floor

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, jsonFile, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	res, err := loadtest.Run(ctx, cfg)
	if res != nil {
		_ = res.WriteTable(stdout)
		if jsonFile != "" {
			err = errors.Join(err, writeJSON(jsonFile, res))
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
	cfg   loadtest.Config
	names string
	pid   string
	json  string
}

func (f *flags) define(fs *flag.FlagSet) {
	c := &f.cfg
	fs.StringVar(&c.Target, "target", "", "xDS server `host:port`; default: the --serve-cp control plane")
	fs.IntVar(&c.Clients, "clients", 100, "number of clients `N`, one gRPC connection and one stream each")
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
	fs.IntVar(&c.Updates, "updates", 10, "updates `U` published, one resource each (with --serve-cp or --floor)")
	fs.BoolVar(&c.Floor, "floor", false, "measure the socket floor: the same bytes to as many plain TCP connections on loopback")
	fs.StringVar(&f.json, "json", "", "also write the results as JSON to `file`")
}

// parseFlags returns the run's Config and the JSON file, if any. It reports
// its errors on stderr.
func parseFlags(args []string, stderr io.Writer) (loadtest.Config, string, error) {
	fs := flag.NewFlagSet("xdsload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	var f flags
	f.define(fs)
	if err := fs.Parse(args); err != nil {
		return f.cfg, "", err
	}
	err := f.finish(fs.Args())
	if err != nil {
		fmt.Fprintln(stderr, "xdsload:", err)
	}
	f.cfg.Progress = stderr
	return f.cfg, f.json, err
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

func writeJSON(file string, res *loadtest.Result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

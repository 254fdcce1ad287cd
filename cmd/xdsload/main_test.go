package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/cmd/xdsload/internal/loadtest"
	"github.com/xdsrelay/xdsrelay/internal/lockorder/lockcheck"
)

func TestMain(m *testing.M) {
	loadtest.ServerSideMain() // split runs start this test binary as their server side
	lockcheck.Main(m)
}

func TestRunAgainstOwnControlPlane(t *testing.T) {
	var res loadtest.Result
	runOK(t, []string{
		"--serve-cp", "127.0.0.1:0", "--clients", "4", "--variant", "sotw", "--ads=false",
		"--resources", "3", "--endpoints", "5", "--updates", "2", "--update-every", "10ms",
		"--names", "cla-0,cla-2", "--pid", "self", "--timeout", "30s",
	}, []string{"time to first config", "fan-out, last client", "4/4", "server RSS"}, &res)
	if res.Configured != 4 || len(res.Updates) != 2 || res.Updates[1].Received != 4 || res.Config.Variant != "sotw" {
		t.Errorf("JSON results: %+v", res)
	}
}

func TestCompare(t *testing.T) {
	dir := t.TempDir()
	var cmp loadtest.Comparison
	runOK(t, []string{
		"--compare", "--clients", "3", "--names", "cla-1", "--resources", "3", "--endpoints", "5",
		"--updates", "2", "--update-every", "10ms", "--timeout", "30s",
		"--cpuprofile", filepath.Join(dir, "cpu"),
	}, []string{"relay ÷", "linear", "snapshot", "grpcfloor", "floor", "upstream: go-control-plane linear cache"}, &cmp)
	if len(cmp.Setups) != 5 || len(cmp.Ratios) != 4 || cmp.Setups[0].Result.Configured != 3 ||
		cmp.Setups[3].Name != "grpcfloor" || cmp.Setups[3].Result.Configured != 3 || cmp.Ratios[2].Versus != "grpcfloor" || cmp.Ratios[2].FanOutLastP50 <= 0 {
		t.Errorf("JSON comparison: %+v", cmp)
	}
	for _, setup := range []string{"relay", "linear", "snapshot", "grpcfloor", "floor"} {
		if fi, err := os.Stat(filepath.Join(dir, "cpu."+setup)); err != nil || fi.Size() == 0 {
			t.Errorf("CPU profile of %s: %v", setup, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "cpu."+setup+".mutex")); err != nil {
			t.Errorf("mutex profile of %s: %v", setup, err)
		}
	}
}

func TestGRPCFloorSplit(t *testing.T) {
	var res loadtest.Result
	runOK(t, []string{
		"--grpc-floor", "--split", "--clients", "20", "--names", "cla-1", "--resources", "3", "--endpoints", "5",
		"--updates", "2", "--update-every", "10ms", "--timeout", "30s",
	}, []string{"gRPC floor", "20/20", "server goroutines per idle stream"}, &res)
	if !res.Config.GRPCFloor || res.Configured != 20 || len(res.Updates) != 2 || res.Updates[1].Received != 20 {
		t.Errorf("JSON results: %+v", res)
	}
}

func TestChurnThroughRelay(t *testing.T) {
	var res loadtest.Result
	runOK(t, []string{
		"--serve-cp", "127.0.0.1:0", "--relay", "--cp-cache", "linear", "--clients", "4", "--streams-per-conn", "2",
		"--churn", "200ms", "--churn-settle", "10ms", "--names", "cla-1", "--resources", "3", "--endpoints", "5",
		"--pid", "self", "--timeout", "30s",
	}, []string{"streams/s", "baseline", "after GC", "2 streams per connection"}, &res)
	if res.Churn == nil || res.Churn.Cycles < 4 || res.Connections != 2 || res.Churn.Collected.RSS <= 0 {
		t.Errorf("JSON results: %+v, churn %+v", res, res.Churn)
	}
}

// runOK runs the command with args plus --json to a file, fails the test
// unless it exits 0 with every one of want in its output, and decodes the
// JSON into out.
func runOK(t *testing.T, args []string, want []string, out any) {
	t.Helper()
	jsonFile := filepath.Join(t.TempDir(), "out.json")
	var stdout, stderr strings.Builder
	if code := run(t.Context(), append(args, "--json", jsonFile), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	for _, w := range want {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, stdout.String())
		}
	}
	b, err := os.ReadFile(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"help", []string{"--help"}, 0, "--serve-cp"},
		{"unknown flag", []string{"--bogus"}, 2, "bogus"},
		{"nothing to load", []string{"--clients", "3"}, 2, "target"},
		{"bad variant", []string{"--floor", "--variant", "rest"}, 2, "variant"},
		{"bad pid", []string{"--floor", "--pid", "me"}, 2, "pid"},
		{"no clients", []string{"--floor", "--clients", "0"}, 2, "clients"},
		{"stray argument", []string{"--floor", "extra"}, 2, "extra"},
		{"compare with a target", []string{"--compare", "--target", "127.0.0.1:1"}, 2, "compare"},
		{"relay without a control plane", []string{"--relay", "--target", "127.0.0.1:1"}, 2, "relay"},
		{"no streams per connection", []string{"--floor", "--streams-per-conn", "-1"}, 2, "streams-per-conn"},
		{"floor sharing connections", []string{"--floor", "--streams-per-conn", "2"}, 2, "streams-per-conn"},
		{"grpc floor and a control plane", []string{"--grpc-floor", "--serve-cp", "127.0.0.1:0"}, 2, "grpc-floor"},
		{"grpc floor and a target", []string{"--grpc-floor", "--target", "127.0.0.1:1"}, 2, "grpc-floor"},
		{"compare with the grpc floor", []string{"--compare", "--grpc-floor"}, 2, "grpc-floor"},
		{"negative churn", []string{"--serve-cp", "127.0.0.1:0", "--churn", "-1s"}, 2, "churn"},
		{"churn past the timeout", []string{"--compare", "--churn", "1m", "--timeout", "1m"}, 2, "timeout"},
		{"soak with compare", []string{"--compare", "--soak", "1m"}, 2, "soak"},
		{"soak against a target", []string{"--soak", "1m", "--target", "127.0.0.1:1"}, 2, "target"},
		{"soak gate unknown", []string{"--soak", "1m", "--soak-gate", "heap,cpu"}, 2, "soak-gate"},
		{"soak rows past its end", []string{"--soak", "10s", "--soak-every", "1m"}, 2, "soak-every"},
		{"relay limits without the relay", []string{"--serve-cp", "127.0.0.1:0", "--relay-limits"}, 2, "relay-limits"},
		{"relay consistency off without the relay", []string{"--serve-cp", "127.0.0.1:0", "--relay-consistency-off"}, 2, "relay-consistency-off"},
		{"relay persist without the relay", []string{"--serve-cp", "127.0.0.1:0", "--relay-persist", "/tmp/x"}, 2, "relay-persist"},
		{"delta clients on a sotw control plane", []string{"--serve-cp", "127.0.0.1:0", "--cp-protocol", "sotw"}, 2, "variant sotw"},
		{"ADS clients on a per-type control plane", []string{"--serve-cp", "127.0.0.1:0", "--cp-protocol", "sotw-per-type", "--variant", "sotw"}, 2, "ads=false"},
		{"compare on a sotw control plane", []string{"--compare", "--cp-protocol", "sotw"}, 2, "cp-protocol"},
		{"unknown control-plane protocol", []string{"--serve-cp", "127.0.0.1:0", "--cp-protocol", "rest"}, 2, "cp-protocol"},
		{"relay limits past max_streams_per_connection", []string{"--compare", "--relay-limits", "--streams-per-conn", "200"}, 2, "max_streams_per_connection"},
		{"soak fault duration without faults", []string{"--soak", "1m", "--soak-fault-for", "30s"}, 2, "soak-fault-for"},
		{"rolling without the relay binary", []string{"--rolling"}, 2, "relay-bin"},
		{"rolling and a soak", []string{"--rolling", "--relay-bin", "xdsrelay", "--soak", "1m"}, 2, "soak"},
		{"rolling against a target", []string{"--rolling", "--relay-bin", "xdsrelay", "--target", "127.0.0.1:1"}, 2, "target"},
		{"rolling and compare", []string{"--rolling", "--relay-bin", "xdsrelay", "--compare"}, 2, "compare"},
		{"fleet without the relay binary", []string{"--fleet", "3"}, 2, "relay-bin"},
		{"fleet of one", []string{"--fleet", "1", "--relay-bin", "xdsrelay"}, 2, "2 or more"},
		{"fleet with too few clients", []string{"--fleet", "3", "--relay-bin", "xdsrelay", "--clients", "10"}, 2, "at least a client of each group"},
		{"fleet and a soak", []string{"--fleet", "3", "--relay-bin", "xdsrelay", "--clients", "90", "--soak", "1m"}, 2, "soak"},
		{"fleet over SotW", []string{"--fleet", "3", "--relay-bin", "xdsrelay", "--clients", "90", "--variant", "sotw"}, 2, "delta ADS"},
		{"fleet split", []string{"--fleet", "3", "--relay-bin", "xdsrelay", "--clients", "90", "--split"}, 2, "split"},
		{"rolling past the relays' stream limit", []string{"--rolling", "--relay-bin", "xdsrelay", "--streams-per-conn", "200"}, 2, "max_streams_per_connection"},
		{"envoy without the control plane", []string{"--envoy"}, 2, "serve-cp"},
		{"envoy and a soak", []string{"--envoy", "--serve-cp", "127.0.0.1:0", "--soak", "1m"}, 2, "soak"},
		{"envoy split", []string{"--envoy", "--serve-cp", "127.0.0.1:0", "--split"}, 2, "split"},
		{"envoy and compare", []string{"--envoy", "--serve-cp", "127.0.0.1:0", "--compare"}, 2, "compare"},
		{"envoy and lrs", []string{"--envoy", "--serve-cp", "127.0.0.1:0", "--lrs"}, 2, "lrs"},
		{"envoy without clients", []string{"--envoy", "--serve-cp", "127.0.0.1:0", "--clients", "0"}, 2, "clients"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			if code := run(t.Context(), tt.args, &stdout, &stderr); code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, stderr.String())
			}
		})
	}
}

// --type takes a type by any of the names the relay takes; a type the tool
// does not load is refused.
func TestTypeFlag(t *testing.T) {
	for _, name := range []string{"cds", "CDS", "Cluster", "clusters", "type.googleapis.com/envoy.config.cluster.v3.Cluster"} {
		f, err := parseFlags([]string{"--floor", "--type", name}, io.Discard)
		if err != nil || f.cfg.Type != "cds" {
			t.Errorf("--type %s: %v, type %q, want cds", name, err, f.cfg.Type)
		}
	}
	for _, name := range []string{"secrets", "clusterz"} {
		if _, err := parseFlags([]string{"--floor", "--type", name}, io.Discard); err == nil || !strings.Contains(err.Error(), "type") {
			t.Errorf("--type %s: %v, want an error naming the type", name, err)
		}
	}
}

// --cp-protocol is taken by clients that speak it, and by any behind the
// relay, which finds it.
func TestCPProtocolFlag(t *testing.T) {
	for _, args := range [][]string{
		{"--serve-cp", "127.0.0.1:0", "--cp-protocol", "sotw", "--variant", "sotw"},
		{"--serve-cp", "127.0.0.1:0", "--cp-protocol", "sotw-per-type", "--variant", "sotw", "--ads=false"},
		{"--serve-cp", "127.0.0.1:0", "--cp-protocol", "sotw-per-type", "--relay"},
		{"--soak", "1m", "--cp-protocol", "sotw"},
		{"--rolling", "--relay-bin", "xdsrelay", "--serve-cp", "127.0.0.1:0", "--cp-protocol", "sotw"},
	} {
		if _, err := parseFlags(args, io.Discard); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// --soak implies the relay in front of the tool's control plane, and a
// soak's own defaults for the flags it shares.
func TestSoakFlags(t *testing.T) {
	var stderr strings.Builder
	f, err := parseFlags([]string{"--soak", "20s", "--clients", "200", "--soak-every", "5s", "--soak-gate", "goroutines,fds,heap"}, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	c := f.cfg.Defaults()
	if !c.Relay || c.ServeCP != "127.0.0.1:0" || c.CPCache != loadtest.CacheLinear || c.UpdateEvery != 2*time.Second ||
		c.Timeout <= 20*time.Second || c.Soak.Every != 5*time.Second || strings.Join(c.Soak.Gate, ",") != "goroutines,fds,heap" {
		t.Errorf("config %+v", c)
	}
}

// --soak-faults takes a silence past the soak relay's keepalive bound
// unless told.
func TestSoakFaultsFlags(t *testing.T) {
	var stderr strings.Builder
	f, err := parseFlags([]string{"--soak", "30m", "--split", "--clients", "2000", "--soak-faults"}, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if c := f.cfg.Defaults(); !c.Soak.Faults || c.Soak.FaultFor != 20*time.Second || c.Soak.RestartEvery != time.Minute {
		t.Errorf("soak %+v", c.Soak)
	}
}

// --rolling runs in front of the tool's control plane, its linear cache
// changing every second, with room for 10,000 clients.
func TestRollingFlags(t *testing.T) {
	var stderr strings.Builder
	f, err := parseFlags([]string{"--rolling", "--relay-bin", "./xdsrelay", "--clients", "10000", "--streams-per-conn", "100"}, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	c := f.cfg.Defaults()
	if !f.rolling || c.ServeCP != "127.0.0.1:0" || c.CPCache != loadtest.CacheLinear || c.UpdateEvery != time.Second ||
		c.Timeout != 10*time.Minute || c.Rolling.RelayBin != "./xdsrelay" {
		t.Errorf("config %+v", c)
	}
}

// --fleet runs its relays in front of the tool's control plane, a change
// every second, 30 groups unless told, sampled 2 minutes after the kill.
func TestFleetFlags(t *testing.T) {
	var stderr strings.Builder
	f, err := parseFlags([]string{"--fleet", "3", "--relay-bin", "./xdsrelay", "--clients", "3000"}, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	c := f.cfg.Defaults()
	if c.Fleet.Relays != 3 || c.Fleet.RelayBin != "./xdsrelay" || c.Fleet.Groups != 30 || c.Fleet.BalanceFor != 2*time.Minute ||
		c.UpdateEvery != time.Second || c.Timeout != 20*time.Minute || c.Rolling.RelayBin != "" {
		t.Errorf("config %+v", c)
	}
}

// A fleet run through the command, with the built relay: the control
// plane holds one stream per group with the fleet and one per group and
// relay without it; the killed relay's groups move with no removal, nothing
// sent again and no more new streams than groups moved; the relays balance.
func TestFleetCommand(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "xdsrelay")
	build := exec.Command("go", "build", "-o", bin, "./cmd/xdsrelay")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/xdsrelay: %v\n%s", err, out)
	}
	var res loadtest.Fleet
	runOK(t, []string{"--fleet", "3", "--relay-bin", bin, "--clients", "36", "--groups", "6", "--updates", "3",
		"--update-every", "100ms", "--resources", "4", "--endpoints", "5", "--balance-for", "40s"},
		[]string{"control plane streams", "the extra hop", "killed", "balance after", "fleet run passed"}, &res)
	if !res.Passed || res.Without.Streams != 18 || res.With.Streams != 6 || res.Kill.Removals != 0 || res.Kill.Resent != 0 ||
		res.Kill.NewStreams > res.Kill.Moved || res.Hop.Owner.N == 0 || res.Hop.Peer.N == 0 || len(res.Balance) == 0 {
		t.Errorf("JSON fleet run: %+v", res)
	}
}

// A rolling restart through the command, with the built relay.
func TestRollingCommand(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "xdsrelay")
	build := exec.Command("go", "build", "-o", bin, "./cmd/xdsrelay")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/xdsrelay: %v\n%s", err, out)
	}
	var res loadtest.Rolling
	runOK(t, []string{"--rolling", "--relay-bin", bin, "--clients", "20", "--streams-per-conn", "5", "--resources", "4", "--endpoints", "5"},
		[]string{"GOAWAY first", "stream end to next response", "rolling restart passed"}, &res)
	if !res.Passed || len(res.Restarts) != 2 || res.Restarts[1].Streams != 20 || res.Ending.Names != 20*2 {
		t.Errorf("JSON rolling restart: %+v", res)
	}
}

// A soak through the command: rows on stdout as they come, the verdict
// after them.
func TestSoakCommand(t *testing.T) {
	var res loadtest.Result
	runOK(t, []string{
		"--soak", "2s", "--clients", "10", "--soak-every", "1s", "--soak-restart-every", "1s", "--soak-down", "100ms",
		"--update-every", "200ms", "--resources", "4", "--endpoints", "5", "--soak-report-only",
	}, []string{"heap after GC", "fan-out p50", "control-plane restarts", "within 10%", "after the first half"}, &res)
	if res.Soak == nil || len(res.Soak.Rows) != 2 || res.Soak.Rows[1].Streams != 10 || len(res.Soak.Verdicts) != len(loadtest.SoakFigures) {
		t.Errorf("JSON soak: %+v", res.Soak)
	}
}

// Every xdsload command in the shell blocks of the README, BENCHMARKS.md,
// CONTRIBUTING.md and docs/ parses: the flags it names exist, and their values pass
// validation.
func TestDocumentedCommandsParse(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range append([]string{"../../README.md", "../../BENCHMARKS.md", "../../CONTRIBUTING.md"}, docs...) {
		cmds := documentedCommands(t, doc)
		if len(cmds) == 0 && !strings.Contains(doc, "/docs/") {
			t.Fatalf("%s: no xdsload command in a shell block", doc)
		}
		for _, args := range cmds {
			var stderr strings.Builder
			if _, err := parseFlags(args, &stderr); err != nil {
				t.Errorf("%s: xdsload %s: %v\n%s", doc, strings.Join(args, " "), err, stderr.String())
			}
		}
	}
}

// documentedCommands returns the arguments of each xdsload command in the
// ```sh blocks of file: lines starting "go run ./cmd/xdsload" or
// "./xdsload", with their backslash continuations, less a trailing & (run
// in the background). A shell variable the
// document sets before (NAME=VALUE) is expanded, $! as a process id; one
// it never sets is left as written, and fails the flag that reads it.
func documentedCommands(t *testing.T, file string) [][]string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	vars := map[string]string{"!": "1"}
	expand := func(s string) string {
		return os.Expand(s, func(name string) string {
			if v, ok := vars[name]; ok {
				return v
			}
			return "$" + name
		})
	}
	inSh, line := false, ""
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "```"):
			inSh = l == "```sh"
			continue
		case !inSh:
			continue
		}
		line += strings.TrimSpace(l)
		if strings.HasSuffix(line, `\`) {
			line = strings.TrimSuffix(line, `\`) + " "
			continue
		}
		if name, value, ok := strings.Cut(line, "="); ok && shellName.MatchString(name) && !strings.ContainsAny(value, " \t") {
			vars[name] = expand(value)
		}
		for _, prefix := range []string{"go run ./cmd/xdsload ", "./xdsload "} {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				rest = strings.TrimSuffix(strings.TrimSpace(rest), " &") // run in the background
				out = append(out, strings.Fields(expand(rest)))
			}
		}
		line = ""
	}
	return out
}

// shellName is a shell variable's name.
var shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

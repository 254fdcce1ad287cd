package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/internal/lockorder/lockcheck"
	"github.com/xdsrelay/xdsrelay/internal/testlog"
	"github.com/xdsrelay/xdsrelay/relay"
)

func TestMain(m *testing.M) {
	lockcheck.Main(m)
}

func TestVersionFlag(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, nil, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if want := "xdsrelay " + currentVersion().String() + "\n"; out.String() != want {
		t.Fatalf("printed %q, want %q", out.String(), want)
	}
}

func TestVersionString(t *testing.T) {
	const rev = "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d"
	info := func(version string, settings ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/xdsrelay/xdsrelay", Version: version}}
		for i := 0; i < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi
	}
	tests := []struct {
		name                  string
		bi                    *debug.BuildInfo
		ldVersion, ldRevision string
		want                  string
	}{
		{name: "no build information", want: release},
		{name: "source without VCS", bi: info("(devel)"), want: release},
		{name: "empty module version", bi: info(""), want: release},
		{
			name: "a pseudo-version is not the version: the release is, with the revision",
			bi:   info("v0.0.0-20261102100000-1a2b3c4d5e6f", "vcs", "git", "vcs.revision", rev, "vcs.time", "2026-11-02T10:00:00Z", "vcs.modified", "false"),
			want: release + " (rev 1a2b3c4d5e6f, 2026-11-02T10:00:00Z)",
		},
		{
			name: "modified tree",
			bi:   info("v0.0.0-20261102100000-1a2b3c4d5e6f+dirty", "vcs.revision", rev, "vcs.modified", "true"),
			want: release + " (rev 1a2b3c4d5e6f, modified)",
		},
		{
			name:      "linker version wins, revision from VCS",
			bi:        info("(devel)", "vcs.revision", rev),
			ldVersion: "v1.2.3",
			want:      "v1.2.3 (rev 1a2b3c4d5e6f)",
		},
		{
			name:      "linker version and revision without VCS (container build)",
			bi:        info("(devel)"),
			ldVersion: "v1.2.3", ldRevision: "abc123",
			want: "v1.2.3 (rev abc123)",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := readVersion(tc.bi, tc.ldVersion, tc.ldRevision).String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "-help"} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), []string{arg}, nil, &out, &errOut); code != 0 {
			t.Fatalf("%s: exit %d, want 0", arg, code)
		}
		if errOut.Len() != 0 || !strings.HasPrefix(out.String(), "Usage: xdsrelay") {
			t.Fatalf("%s: stdout %q, stderr %q", arg, out.String(), errOut.String())
		}
		for _, want := range []string{"--config FILE", "--version", "cache.not_found_timeout (duration, default 15s)", "upstream.group_by (list, default [cluster, user_agent, client_features])"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s: usage lacks %q", arg, want)
			}
		}
		for _, s := range settings(new(Options)) {
			if !strings.Contains(out.String(), "  "+s.key+" (") {
				t.Errorf("%s: usage lacks the key %s", arg, s.key)
			}
		}
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{args: []string{"config.yaml"}, want: `unknown command "config.yaml" for "xdsrelay"; the commands are admin, config-dump, docs, groups, guard, persist, rollout, serve, status, validate, version, wait, watch (a configuration file is named with --config FILE)`},
		{args: []string{"--config", "a.yaml", "b.yaml"}, want: `unknown command "b.yaml"`},
		{args: []string{"serve", "b.yaml"}, want: `unexpected argument "b.yaml": name the configuration file with --config FILE`},
		{args: []string{"validat"}, want: `unknown command "validat" for "xdsrelay"; did you mean "validate"?`},
		{args: []string{"stauts"}, want: `unknown command "stauts" for "xdsrelay"; did you mean "status"?`},
		{args: []string{"stauts", "--server", "x:1"}, want: `unknown command "stauts" for "xdsrelay"; did you mean "status"?`},
		{args: []string{"wacth", "--server=x:1", "--type", "cds"}, want: `unknown command "wacth" for "xdsrelay"; did you mean "watch"?`},
		{args: []string{"--config", "a.yaml", "stauts", "--node-id", "n"}, want: `unknown command "stauts" for "xdsrelay"; did you mean "status"?`},
		{args: []string{"persist", "inspekt", "--bogus"}, want: `unknown command "inspekt" for "xdsrelay persist"; did you mean "inspect"?`},
		{args: []string{"persist", "inspekt", "x"}, want: `unknown command "inspekt" for "xdsrelay persist"; did you mean "inspect"?`},
		{args: []string{"guard", "relase"}, want: `unknown command "relase" for "xdsrelay guard"; did you mean "release"?`},
		{args: []string{"rollout", "hold"}, want: `unknown command "hold" for "xdsrelay rollout"; the commands are list, release`},
		{args: []string{"rollout", "release", "--admin", "x:1", "--type", "bogus"}, want: `--type: "bogus" is not a resource type: Cluster|CDS|clusters, `},
		{args: []string{"admin", "--admin", "x:1"}, want: "accepts 1 arg(s)"},
		{args: []string{"admin", "--admin", "x:1", "-X", "DELETE", "/readyz"}, want: `-X: "DELETE" is not GET, POST or PUT`},
		{args: []string{"admin", "--admin", "x:1", "readyz"}, want: `PATH: "readyz" is not a path such as /debug/groups`},
		{args: []string{"admin", "/readyz"}, want: "--admin is required: the relay's admin endpoint (admin.address)"},
		{args: []string{"admin", "--admin", "x:1", "--server", "x:1", "/readyz"}, want: "--admin and --server: name the admin endpoint once, with --admin"},
		{args: []string{"guard", "release"}, want: "--admin is required"},
		{args: []string{"rollout", "release", "--group", "g"}, want: "--admin is required"},
		{args: []string{"groups"}, want: "--admin is required"},
		{args: []string{"wait", "--type", "cds"}, want: "--admin is required: the relays' admin endpoints (admin.address)"},
		{args: []string{"rollout", "release", "--admin", "x:1", "extra"}, want: `unknown command "extra" for "xdsrelay rollout release"`},
		{args: []string{"docs", "extra"}, want: `unknown command "extra" for "xdsrelay docs"`},
		{args: []string{"docs", "--chek"}, want: "unknown flag: --chek"},
		{args: []string{"--confg", "a.yaml"}, want: "unknown flag: --confg"},
		{args: []string{"status"}, want: "--server is required"},
		{args: []string{"status", "--server", "x:1", "-o", "yaml"}, want: `-o: "yaml" is not table, wide or json`},
		{args: []string{"status", "--admin", "x:1"}, want: "--admin names the admin endpoint, which status --summary reads; status asks the xDS port, named by --server"},
		{args: []string{"status", "--summary"}, want: "--summary needs --admin: the relay's admin endpoint (admin.address)"},
		{args: []string{"status", "--server", "x:1", "extra"}, want: `unknown command "extra"`},
		{args: []string{"status", "--summary", "--admin", "x:1", "--node-id", "n"}, want: "--summary and --node-id: the summary counts every client"},
		{args: []string{"watch", "--server", "x:1", "--node-id", "n", "--type", "xds"}, want: `--type: "xds" is not a resource type: Cluster|CDS|clusters, `},
		{args: []string{"watch", "--server", "x:1", "--node-id", "n", "--type", "lds", "-o", "toml"}, want: `-o: "toml" is not yaml or json`},
		{args: []string{"watch", "--server", "x:1", "--type", "lds"}, want: "--node-id is required"},
		{args: []string{"watch", "--server", "x:1", "--node-id", "n", "--type", "lds", "--nack", "--nack-matching", "x"}, want: "--nack and --nack-matching: give one"},
		{args: []string{"watch", "--server", "x:1", "--node-id", "n", "--type", "lds", "--nack-matching", "("}, want: "--nack-matching: error parsing regexp"},
		{args: []string{"persist", "inspect"}, want: "accepts 1 arg(s)"},
	}
	for _, tc := range tests {
		var errOut bytes.Buffer
		if code := run(context.Background(), tc.args, nil, io.Discard, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2", tc.args, code)
		}
		if got := errOut.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, tc.want) {
			t.Errorf("%q: stderr %q, want one line with %q", tc.args, got, tc.want)
		}
	}
}

// A command that only groups others prints its help alone, and exits 0.
func TestGroupCommandsPrintHelp(t *testing.T) {
	for _, group := range []string{"persist", "guard", "rollout"} {
		code, out, errOut := runCLI(group)
		if code != 0 || errOut != "" || !strings.Contains(out, "\n  xdsrelay "+group+" [command]\n") {
			t.Errorf("xdsrelay %s: exit %d, stdout %q, stderr %q; want its help", group, code, out, errOut)
		}
	}
}

func TestBadConfigExitsWithOneLine(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(file, []byte("cache:\n  retention: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	if code := run(context.Background(), []string{"--config", file}, nil, io.Discard, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if got := errOut.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "cache.retention") {
		t.Fatalf("stderr %q: want one line naming cache.retention", got)
	}
}

// The example configuration boots and serves the example resources to an
// ADS client, and the admin endpoints answer (as CoreDNS's readme_test boots
// what it documents).
func TestExampleConfigServes(t *testing.T) {
	t.Chdir("../..") // the example's file:// path is relative to the repository
	env := map[string]string{
		"XDSRELAY_DOWNSTREAM_ADDRESS": "127.0.0.1:0",
		"XDSRELAY_ADMIN_ADDRESS":      "127.0.0.1:0",
	}
	opts, _, err := loadConfig("config.example.yaml", environ(env))
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(opts.Relay, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()

	cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corepb.Node{Id: "example", Cluster: "example"}
	for i, q := range []struct{ typeURL, name string }{
		{resourcev3.ListenerType, "greeter"},
		{resourcev3.RouteType, "greeter-route"},
		{resourcev3.ClusterType, "greeter-cluster"},
		{resourcev3.EndpointType, "greeter-cluster"},
	} {
		req := &discoverypb.DiscoveryRequest{TypeUrl: q.typeURL, ResourceNames: []string{q.name}}
		if i == 0 {
			req.Node = node
		}
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetTypeUrl() != q.typeURL || len(resp.GetResources()) != 1 {
			t.Fatalf("asked for %s %s, got %d resources of %s", q.typeURL, q.name, len(resp.GetResources()), resp.GetTypeUrl())
		}
	}

	for path, want := range map[string]string{
		"/healthz": "ok",
		"/readyz":  "ready",
		"/metrics": `xdsrelay_downstream_streams{variant="sotw-ads"} 1`,
	} {
		resp, err := http.Get("http://" + r.AdminAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %q, want 200 with %q", path, resp.StatusCode, body, want)
		}
	}
}

// serve drains and returns nil when its context ends (SIGINT, SIGTERM).
func TestServeDrainsOnSignal(t *testing.T) {
	opts, _, err := loadConfig("", environ(map[string]string{
		"XDSRELAY_UPSTREAM_ADDRESS":   "file://" + filepath.Join("..", "..", "examples", "resources"),
		"XDSRELAY_DOWNSTREAM_ADDRESS": "127.0.0.1:0",
		"XDSRELAY_ADMIN_ADDRESS":      "",
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, opts, slog.New(slog.DiscardHandler), nil) }()
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return after its context ended")
	}
}

// SIGHUP (a closed terminal, a habit of reloading daemons) leaves the relay
// serving; the run ends when its context does, exit code 0. Unknown XDSRELAY_
// variables are warned about once the logger exists.
func TestSIGHUPKeepsServing(t *testing.T) {
	logs := &syncBuffer{}
	stop := startExampleRelay(t, map[string]string{"XDSRELAY_FOO": "1"}, logs)
	admin := waitForLog(t, logs, regexp.MustCompile(`msg="relay serving".* admin=(\S+)`))[1]
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, logs, regexp.MustCompile(`level=INFO msg="SIGHUP ignored`))
	resp, err := http.Get("http://" + admin + "/healthz")
	if err != nil {
		t.Fatalf("after SIGHUP: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after SIGHUP: /healthz %d", resp.StatusCode)
	}

	if c := stop(); c != 0 {
		t.Fatalf("exit %d, want 0; log:\n%s", c, logs)
	}
	if n := strings.Count(logs.String(), `level=WARN msg="unknown environment variable ignored" name=XDSRELAY_FOO`); n != 1 {
		t.Errorf("%d warnings about XDSRELAY_FOO, want 1; log:\n%s", n, logs)
	}
}

// startExampleRelay runs the binary on examples/resources, listening on
// 127.0.0.1:0, with the environment extended by env and its log in logs;
// stop (called at the latest when the test ends) returns the exit code.
func startExampleRelay(t *testing.T, env map[string]string, logs *syncBuffer) (stop func() int) {
	t.Helper()
	all := map[string]string{
		"XDSRELAY_UPSTREAM_ADDRESS":   "file://" + filepath.Join("..", "..", "examples", "resources"),
		"XDSRELAY_DOWNSTREAM_ADDRESS": "127.0.0.1:0",
		"XDSRELAY_ADMIN_ADDRESS":      "127.0.0.1:0",
	}
	maps.Copy(all, env)
	return startRun(t, nil, all, io.Discard, logs)
}

// waitForLog waits (up to 10s) for a line matching re and returns its
// submatches.
func waitForLog(t *testing.T, logs *syncBuffer, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(logs.String()); m != nil {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no log line matches %s; log:\n%s", re, logs)
	return nil
}

// syncBuffer is a buffer safe for a writer and a reader at once.
type syncBuffer = testlog.Buffer

// After "shutting down", the log says what was saved for the next start
// and where, then that the relay shut down; without cache.persist_dir, that
// nothing was saved.
func TestShutdownSaysWhatWasSaved(t *testing.T) {
	saved := t.TempDir()
	for _, tc := range []struct {
		env  map[string]string
		want []string
	}{
		{env: map[string]string{"XDSRELAY_CACHE_PERSIST_DIR": saved}, want: []string{
			// The Cluster, and its endpoints once fetched as what it
			// points at (consistency.max_wait): one or two resources.
			`level=INFO msg="caches saved for the next start" dir=` + saved + ` groups=1 resources=`,
			` written_now=1 failed=0`,
			`level=INFO msg="shut down"`,
		}},
		{env: map[string]string{}, want: []string{
			`level=INFO msg="shut down; the caches were not saved (cache.persist_dir is not set): the next start begins empty"`,
		}},
	} {
		logs := &syncBuffer{}
		stop := startExampleRelay(t, tc.env, logs)
		addr := waitForLog(t, logs, regexp.MustCompile(`msg="relay serving" downstream=(\S+)`))[1]
		out := &syncBuffer{}
		stopWatch := runAsync(t, out, "watch", "--server", addr, "--node-id", "n1", "--cluster", "c1", "--type", "cds")
		waitForOutput(t, out, "name: greeter-cluster")
		stopWatch()
		if c := stop(); c != 0 {
			t.Fatalf("exit %d; log:\n%s", c, logs)
		}
		_, after, _ := strings.Cut(logs.String(), `msg="shutting down"`)
		for _, w := range tc.want {
			if !strings.Contains(after, w) {
				t.Errorf("the log after shutting down lacks %s:\n%s", w, after)
			}
		}
	}
}

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	adminpb "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/relay"
)

const cliWait = 10 * time.Second

// listenerFile is a resource file holding the listener "edge" on port.
func listenerFile(port string) string {
	return `"@type": type.googleapis.com/envoy.config.listener.v3.Listener
name: edge
address: {socket_address: {address: 127.0.0.1, port_value: ` + port + `}}
`
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startFileRelay serves the resource files in dir on 127.0.0.1:0.
func startFileRelay(t *testing.T, dir string, mutate func(*relay.Config)) *relay.Relay {
	t.Helper()
	cfg := relay.Default()
	cfg.Upstream.Address = relay.FilePrefix + dir
	cfg.Downstream.Address = "127.0.0.1:0"
	cfg.Admin.Address = ""
	if mutate != nil {
		mutate(&cfg)
	}
	return startRelayConfig(t, cfg)
}

// startRelayConfig runs a relay with cfg until the test ends.
func startRelayConfig(t *testing.T, cfg relay.Config) *relay.Relay {
	t.Helper()
	r, err := relay.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cliWait)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return r
}

// runAsync runs the command line until the returned stop is called, which
// returns the exit code.
func runAsync(t *testing.T, out io.Writer, args ...string) (stop func() int) {
	t.Helper()
	errOut := &syncBuffer{}
	stopRun := startRun(t, args, nil, out, errOut)
	return func() int {
		c := stopRun()
		if c != 0 {
			t.Logf("stderr: %s", errOut)
		}
		return c
	}
}

// startRun runs the command line with the environment env until the
// returned stop is called, or the test ends; stop returns the exit code
// (-1, failing the test, when the command outlives its context by cliWait).
func startRun(t *testing.T, args []string, env map[string]string, out io.Writer, errOut *syncBuffer) (stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- run(ctx, args, environ(env), out, errOut) }()
	var once sync.Once
	exit := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case exit = <-code:
			case <-time.After(cliWait):
				t.Error("the command did not return after its context ended")
			}
		})
		return exit
	}
	t.Cleanup(func() { stop() })
	return stop
}

// waitForOutput waits (up to cliWait) for out to match re.
func waitForOutput(t *testing.T, out *syncBuffer, re string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(cliWait)
	for !rx.MatchString(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no output matches %s; output:\n%s", re, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// eventually calls try every 20ms until it says nothing is missing (""),
// for cliWait at most; then it fails the test with what try said last.
func eventually(t *testing.T, try func() (missing string)) {
	t.Helper()
	deadline := time.Now().Add(cliWait)
	for {
		missing := try()
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watch prints the subscribed resource, then its change when the resource
// file changes, in both protocols and both formats.
func TestWatchPrintsChanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		port func(string) string
	}{
		{"sotw json", []string{"--type", "lds", "-o", "json"}, func(p string) string { return `"portValue": ` + p }},
		{"delta yaml", []string{"--type", resourcev3.ListenerType, "--delta", "edge"}, func(p string) string { return `portValue: ` + p }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "listener.yaml")
			writeFile(t, file, listenerFile("10001"))
			r := startFileRelay(t, dir, nil)
			out := &syncBuffer{}
			stop := runAsync(t, out, append([]string{"watch", "--server", r.Addr(), "--node-id", "n1", "--cluster", "c1"}, tc.args...)...)
			waitForOutput(t, out, regexp.QuoteMeta(tc.port("10001")))
			writeFile(t, file, listenerFile("10002"))
			waitForOutput(t, out, regexp.QuoteMeta(tc.port("10002")))
			if c := stop(); c != 0 {
				t.Fatalf("exit %d, want 0", c)
			}
			if !strings.Contains(out.String(), "name: edge") && !strings.Contains(out.String(), `"name": "edge"`) {
				t.Errorf("the listener's name is not printed:\n%s", out)
			}
		})
	}
}

// csds answers FetchClientStatus with a canned status and records the
// request.
type csds struct {
	statuspb.UnimplementedClientStatusDiscoveryServiceServer
	reqs chan *statuspb.ClientStatusRequest
}

func (s *csds) FetchClientStatus(_ context.Context, req *statuspb.ClientStatusRequest) (*statuspb.ClientStatusResponse, error) {
	s.reqs <- req
	l, err := anypb.New(&listenerpb.Listener{Name: "edge"})
	if err != nil {
		return nil, err
	}
	gen := func(typeURL, name, version string, st adminpb.ClientResourceStatus) *statuspb.ClientConfig_GenericXdsConfig {
		return &statuspb.ClientConfig_GenericXdsConfig{TypeUrl: typeURL, Name: name, VersionInfo: version, ClientStatus: st}
	}
	edge := gen(resourcev3.ListenerType, "edge", "v2", adminpb.ClientResourceStatus_ACKED)
	edge.XdsConfig = l
	return &statuspb.ClientStatusResponse{Config: []*statuspb.ClientConfig{{
		Node: &corepb.Node{Id: "n1", Cluster: "c1"},
		GenericXdsConfigs: []*statuspb.ClientConfig_GenericXdsConfig{
			gen(resourcev3.ClusterType, "backend", "v1", adminpb.ClientResourceStatus_ACKED),
			gen(resourcev3.ClusterType, "other", "v1", adminpb.ClientResourceStatus_NACKED),
			edge,
			gen(resourcev3.ClusterType, "missing", "", adminpb.ClientResourceStatus_DOES_NOT_EXIST),
			gen(resourcev3.RouteType, "r", "", adminpb.ClientResourceStatus_REQUESTED),
			gen(resourcev3.SecretType, "s", "v3", adminpb.ClientResourceStatus_REQUESTED), // sent, not acknowledged
		},
	}}}, nil
}

// shortVersion is the version status shows for a client that holds these
// names at these versions (name, version, ...), in name order: the first 8
// hex digits of the SHA-256 of each name and version followed by a NUL.
func shortVersion(pairs ...string) string {
	h := sha256.New()
	for _, p := range pairs {
		h.Write([]byte(p + "\x00"))
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
}

func startCSDS(t *testing.T) (string, *csds) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	s := &csds{reqs: make(chan *statuspb.ClientStatusRequest, 10)}
	statuspb.RegisterClientStatusDiscoveryServiceServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String(), s
}

func TestStatus(t *testing.T) {
	addr, s := startCSDS(t)
	var out, errOut bytes.Buffer
	if c := run(context.Background(), []string{"status", "--server", addr, "--node-id", "n1"}, nil, &out, &errOut); c != 0 {
		t.Fatalf("exit %d: %s", c, errOut.String())
	}
	if got := (<-s.reqs).GetNodeMatchers()[0].GetNodeId().GetExact(); got != "n1" {
		t.Errorf("asked for node %q, want n1", got)
	}
	// One version per type, of what the client holds, and its state.
	for _, row := range []string{
		`NODE\s+CLUSTER\s+TYPE\s+VERSION\s+STATUS\n`,
		`n1\s+c1\s+CDS\s+` + shortVersion("backend", "v1", "other", "v1") + `\s+NACKED\n`,
		`n1\s+c1\s+LDS\s+` + shortVersion("edge", "v2") + `\s+SYNCED\n`,
		`n1\s+c1\s+RDS\s+-\s+NOT SENT\n`,
		`n1\s+c1\s+SDS\s+` + shortVersion("s", "v3") + `\s+STALE\n`,
	} {
		if !regexp.MustCompile(row).MatchString(out.String()) {
			t.Errorf("no row matches %s:\n%s", row, out.String())
		}
	}
	out.Reset()
	if c := run(context.Background(), []string{"status", "--server", addr, "-o", "wide"}, nil, &out, &errOut); c != 0 {
		t.Fatalf("-o wide: exit %d: %s", c, errOut.String())
	}
	<-s.reqs
	// -o wide: the resources' own versions and their counts too.
	for _, row := range []string{
		`NODE\s+CLUSTER\s+TYPE\s+VERSION\s+STATUS\s+RESOURCE VERSIONS\s+ACKED\s+NACKED\s+REQUESTED\s+DOES_NOT_EXIST\n`,
		`n1\s+c1\s+CDS\s+[0-9a-f]{8}\s+NACKED\s+v1\s+1\s+1\s+0\s+1\n`,
		`n1\s+c1\s+LDS\s+[0-9a-f]{8}\s+SYNCED\s+v2\s+1\s+0\s+0\s+0\n`,
		`n1\s+c1\s+RDS\s+-\s+NOT SENT\s+-\s+0\s+0\s+1\s+0\n`,
	} {
		if !regexp.MustCompile(row).MatchString(out.String()) {
			t.Errorf("-o wide: no row matches %s:\n%s", row, out.String())
		}
	}
	if i, j := strings.Index(out.String(), "CDS"), strings.Index(out.String(), "LDS"); i > j {
		t.Errorf("types out of order:\n%s", out.String())
	}

	out.Reset()
	if c := run(context.Background(), []string{"status", "--server", addr, "-o", "json"}, nil, &out, &errOut); c != 0 {
		t.Fatalf("-o json: exit %d: %s", c, errOut.String())
	}
	if m := (<-s.reqs).GetNodeMatchers(); len(m) != 0 {
		t.Errorf("without --node-id: matchers %v", m)
	}
	for _, want := range []string{`"clientStatus": "NACKED"`, `"@type": "type.googleapis.com/envoy.config.listener.v3.Listener"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-o json lacks %s:\n%s", want, out.String())
		}
	}
}

// A server that is not there fails the command (exit 1) within --timeout.
func TestStatusUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	var errOut bytes.Buffer
	if c := run(context.Background(), []string{"status", "--server", addr, "--timeout", "1s"}, nil, io.Discard, &errOut); c != 1 {
		t.Fatalf("exit %d, want 1: %s", c, errOut.String())
	}
	if strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), addr) {
		t.Errorf("stderr %q: want one line naming %s", errOut.String(), addr)
	}
}

// persist inspect reads what a relay saved in cache.persist_dir.
func TestPersistInspect(t *testing.T) {
	dir, saved := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(dir, "listener.yaml"), listenerFile("10001"))
	r := startFileRelay(t, dir, func(c *relay.Config) {
		c.Cache.PersistDir = saved
		c.Cache.PersistInterval = 20 * time.Millisecond
		c.Upstream.Node.ID = "test-id" // not a group_by field: the saved fields have no id
	})
	st := sotwADS(t, r.Addr(), cliWait)
	if err := st.Send(&discoverypb.DiscoveryRequest{Node: &corepb.Node{Id: "n1", Cluster: "c1"}, TypeUrl: resourcev3.ListenerType}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	var file string
	eventually(t, func() string {
		files, _ := filepath.Glob(filepath.Join(saved, "group-*.cache"))
		if len(files) != 1 {
			return fmt.Sprintf("not one cache file saved: %q", files)
		}
		file = files[0]
		return ""
	})

	var out, errOut bytes.Buffer
	if c := run(context.Background(), []string{"persist", "inspect", file}, nil, &out, &errOut); c != 0 {
		t.Fatalf("exit %d: %s", c, errOut.String())
	}
	for _, re := range []string{`upstream node: id=test-id cluster=c1\n`, `LDS\s+1\s+0\s+synced\n`, `LDS\s+edge\s+\S+\n`} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("output lacks %s:\n%s", re, out.String())
		}
	}

	bad := filepath.Join(t.TempDir(), "group-0.cache")
	writeFile(t, bad, "xdsrelay-cache v1\ngarbage")
	errOut.Reset()
	if c := run(context.Background(), []string{"persist", "inspect", bad}, nil, io.Discard, &errOut); c != 1 {
		t.Fatalf("a corrupt file: exit %d, want 1", c)
	}
	if strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), bad) {
		t.Errorf("stderr %q: want one line naming the file", errOut.String())
	}
}

// Two groups that differ only in their clients' user agents are saved as
// two caches, and persist inspect names each by its group id and whole
// key, as the relay does, not by the cluster they share.
func TestPersistInspectNamesGroups(t *testing.T) {
	dir, saved := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(dir, "listener.yaml"), listenerFile("10001"))
	r := startFileRelay(t, dir, func(c *relay.Config) {
		c.Cache.PersistDir = saved
		c.Cache.PersistInterval = 20 * time.Millisecond
	})
	for _, agent := range []string{"envoy", "grpc"} {
		st := sotwADS(t, r.Addr(), cliWait)
		n := &corepb.Node{Id: "n-" + agent, Cluster: "load", UserAgentName: agent,
			ClientFeatures: []string{"envoy.lb.does_not_support_overprovisioning", "envoy.lrs.supports_send_all_clusters"}}
		if err := st.Send(&discoverypb.DiscoveryRequest{Node: n, TypeUrl: resourcev3.ListenerType}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, func() string {
		if files, _ := filepath.Glob(filepath.Join(saved, "group-*.cache")); len(files) != 2 {
			return fmt.Sprintf("not two cache files saved: %q", files)
		}
		return ""
	})
	code, out, errOut := runCLI("persist", "inspect", saved)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, agent := range []string{"envoy", "grpc"} {
		key := "cluster=load,user_agent=" + agent + ",client_features=envoy.lb.does_not_support_overprovisioning,envoy.lrs.supports_send_all_clusters"
		want := "group: " + relay.GroupID(key) + "\nkey: " + key + "\n"
		if !strings.Contains(out, want) {
			t.Errorf("persist inspect does not show %q:\n%s", want, out)
		}
	}
}

func TestValidate(t *testing.T) {
	good := t.TempDir()
	writeFile(t, filepath.Join(good, "listener.yaml"), listenerFile("10001"))
	bad := t.TempDir()
	writeFile(t, filepath.Join(bad, "listener.yaml"), listenerFile("99999999"))
	config := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, config, "upstream:\n  address: file://"+good+"\n")
	badConfig := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, badConfig, "cache:\n  retention: soon\n")
	caseConfig := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, caseConfig, "upstream:\n  address: a:1\nUPSTREAM:\n  address: b:2\n")
	nestedCaseConfig := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, nestedCaseConfig, "cache:\n  retention: 1m\n  Retention: 2m\n")

	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		code    int
		out     string
		errLine string
	}{
		{name: "config file and resources", args: []string{"--config", config}, out: "configuration OK; 1 resources in " + good},
		{name: "control plane upstream", env: map[string]string{"XDSRELAY_UPSTREAM_ADDRESS": "cp:18000"}, out: "configuration OK\n"},
		{name: "invalid resource", env: map[string]string{"XDSRELAY_UPSTREAM_ADDRESS": "file://" + bad}, code: 1, errLine: "listener.yaml"},
		{name: "missing directory", env: map[string]string{"XDSRELAY_UPSTREAM_ADDRESS": "file://" + filepath.Join(bad, "nope")}, code: 1, errLine: "upstream.address"},
		{name: "bad configuration", args: []string{"--config", badConfig}, code: 2, errLine: "cache.retention"},
		{name: "unknown environment variable", env: map[string]string{"XDSRELAY_UPSTREAM_ADDRES": "cp:18000"}, code: 2,
			errLine: "unknown environment variable XDSRELAY_UPSTREAM_ADDRES (did you mean XDSRELAY_UPSTREAM_ADDRESS?): no configuration key has that name (serve ignores it with a warning)"},
		{name: "Kubernetes service links", env: map[string]string{"XDSRELAY_SERVICE_HOST": "10.0.0.1", "XDSRELAY_PORT": "tcp://10.0.0.1:18001"}, out: "configuration OK\n"},
		{name: "keys differing only in case", args: []string{"--config", caseConfig}, code: 2,
			errLine: `keys "upstream" (line 1) and "UPSTREAM" (line 3) differ only in case`},
		{name: "nested keys differing only in case", args: []string{"--config", nestedCaseConfig}, code: 2,
			errLine: `keys "cache.retention" (line 2) and "cache.Retention" (line 3) differ only in case`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if c := run(context.Background(), append([]string{"validate"}, tc.args...), environ(tc.env), &out, &errOut); c != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", c, tc.code, errOut.String())
			}
			if !strings.Contains(out.String(), tc.out) {
				t.Errorf("stdout %q, want %q", out.String(), tc.out)
			}
			if tc.errLine != "" && (strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), tc.errLine)) {
				t.Errorf("stderr %q: want one line with %q", errOut.String(), tc.errLine)
			}
		})
	}
}

// xdsrelay serve --config FILE is xdsrelay --config FILE.
func TestServeSubcommand(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, file, "cache:\n  retention: soon\n")
	var errOut bytes.Buffer
	if c := run(context.Background(), []string{"serve", "--config", file}, nil, io.Discard, &errOut); c != 2 || !strings.Contains(errOut.String(), "cache.retention") {
		t.Fatalf("exit %d, stderr %q: want 2 naming cache.retention", c, errOut.String())
	}
	var out bytes.Buffer
	if c := run(context.Background(), []string{"serve", "--help"}, nil, &out, io.Discard); c != 0 || !strings.HasPrefix(out.String(), "Usage: xdsrelay") {
		t.Fatalf("serve --help: exit %d, %q", c, out.String())
	}
}

// status against a running relay: a client that `watch` keeps subscribed
// (and ACKing) shows as that node with its listener ACKED, read from the
// relay's own CSDS.
func TestStatusAgainstTheRelay(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "edge.yaml"), listenerFile("10000"))
	r := startFileRelay(t, dir, nil)
	watched := &syncBuffer{}
	stop := runAsync(t, watched, "watch", "--server", r.Addr(), "--node-id", "proxy-7", "--cluster", "c1", "--type", "lds", "-o", "json")
	defer stop()
	waitForOutput(t, watched, `"name": "edge"`)
	deadline := time.Now().Add(cliWait)
	for {
		var out, errOut bytes.Buffer
		if c := run(context.Background(), []string{"status", "--server", r.Addr()}, nil, &out, &errOut); c != 0 {
			t.Fatalf("exit %d: %s", c, errOut.String())
		}
		if regexp.MustCompile(`proxy-7\s+c1\s+LDS\s+[0-9a-f]{8}\s+SYNCED\n`).MatchString(out.String()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ACKED listener row for proxy-7:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A watch whose connection the relay ends (downstream.max_connection_age)
// subscribes again on a new stream and goes on printing.
func TestWatchReconnectsAfterConnectionAge(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "listener.yaml"), listenerFile("10001"))
	r := startFileRelay(t, dir, func(c *relay.Config) {
		c.Downstream.MaxConnectionAge, c.Downstream.MaxConnectionAgeGrace = 300*time.Millisecond, 100*time.Millisecond
	})
	out := &syncBuffer{}
	stop := runAsync(t, out, "watch", "--server", r.Addr(), "--node-id", "n1", "--type", "lds", "-o", "json")
	deadline := time.Now().Add(cliWait)
	for strings.Count(out.String(), `"portValue": 10001`) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the watch did not go on past the connection's age:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c := stop(); c != 0 {
		t.Fatalf("exit %d, want 0", c)
	}
}

// A watch whose stream fails (no server there) exits 1 with one line naming
// the failure, rather than waiting or exiting 0.
func TestWatchStreamFailureExits1(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cliWait)
	defer cancel()
	var errOut bytes.Buffer
	if c := run(ctx, []string{"watch", "--server", addr, "--node-id", "n1", "--type", "lds"}, nil, io.Discard, &errOut); c != 1 {
		t.Fatalf("exit %d, want 1: %s", c, errOut.String())
	}
	if strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), "watch") {
		t.Errorf("stderr %q: want one line naming watch", errOut.String())
	}
}

// The client flags reach a relay that requires mTLS: --ca-file with the
// client certificate succeeds; without the certificate, or in plaintext,
// the command fails (exit 1); a certificate without its key is refused.
func TestStatusOverMTLS(t *testing.T) {
	certs := testcp.MakeCerts(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "edge.yaml"), listenerFile("10000"))
	r := startFileRelay(t, dir, func(c *relay.Config) {
		c.Downstream.TLS.CertFile, c.Downstream.TLS.KeyFile = certs.ServerCert, certs.ServerKey
		c.Downstream.TLS.CAFile = certs.CA
		c.Downstream.Authorization.Mode = relay.AuthorizationAllowAll
	})
	status := []string{"status", "--server", r.Addr(), "--timeout", "2s"}
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		errLine string
	}{
		{name: "mTLS", args: []string{"--ca-file", certs.CA, "--server-name", "localhost", "--cert-file", certs.ClientCert, "--key-file", certs.ClientKey}},
		{name: "no client certificate", args: []string{"--ca-file", certs.CA, "--server-name", "localhost"}, code: 1},
		{name: "plaintext", code: 1},
		{name: "certificate without key", args: []string{"--ca-file", certs.CA, "--cert-file", certs.ClientCert}, code: 1, errLine: "go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if c := run(context.Background(), append(status, tc.args...), nil, &out, &errOut); c != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", c, tc.code, errOut.String())
			}
			if tc.code == 0 && !strings.HasPrefix(out.String(), "NODE") {
				t.Errorf("stdout %q: want the status table", out.String())
			}
			if tc.code != 0 && strings.Count(errOut.String(), "\n") != 1 {
				t.Errorf("stderr %q: want one line", errOut.String())
			}
			if !strings.Contains(errOut.String(), tc.errLine) {
				t.Errorf("stderr %q: want %q", errOut.String(), tc.errLine)
			}
		})
	}
}

// The VERSION column: "-" without a version, one or two sorted, then the
// first two and how many more.
func TestStatusVersions(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{in: nil, want: "-"},
		{in: []string{"v1"}, want: "v1"},
		{in: []string{"v2", "v1"}, want: "v1,v2"},
		{in: []string{"v4", "v2", "v3", "v1"}, want: "v1,v2 +2"},
	} {
		if got := versions(tc.in); got != tc.want {
			t.Errorf("versions(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// `xdsrelay persist inspect DIR` takes cache.persist_dir itself: it prints
// every saved cache in it, each under its name, and exits 1 when one does
// not load (printing the others) or none is there.
func TestPersistInspectDir(t *testing.T) {
	dir, saved := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(dir, "listener.yaml"), listenerFile("10001"))
	r := startFileRelay(t, dir, func(c *relay.Config) {
		c.Cache.PersistDir = saved
		c.Cache.PersistInterval = 20 * time.Millisecond
	})
	for _, cluster := range []string{"c1", "c2"} {
		out := &syncBuffer{}
		stop := runAsync(t, out, "watch", "--server", r.Addr(), "--node-id", "n-"+cluster, "--cluster", cluster, "--type", "lds")
		waitForOutput(t, out, "name: edge")
		stop()
	}
	eventually(t, func() string {
		if files, _ := filepath.Glob(filepath.Join(saved, "group-*.cache")); len(files) < 2 {
			return fmt.Sprintf("the two groups' caches were not saved: %q", files)
		}
		return ""
	})
	code, out, errOut := runCLI("persist", "inspect", saved)
	if code != 0 || strings.Count(out, "== "+saved+string(filepath.Separator)+"group-") != 2 ||
		!strings.Contains(out, "cluster=c1\n") || !strings.Contains(out, "cluster=c2\n") {
		t.Fatalf("persist inspect DIR: exit %d, stdout:\n%s\nstderr: %s", code, out, errOut)
	}

	writeFile(t, filepath.Join(saved, "group-0.cache"), "xdsrelay-cache v1\ngarbage")
	code, out, errOut = runCLI("persist", "inspect", saved)
	if code != 1 || strings.Count(out, "node: ") != 2 || !strings.Contains(errOut, "group-0.cache") || !strings.Contains(errOut, "1 of 3 saved caches did not load") {
		t.Errorf("a corrupt file in DIR: exit %d, stdout:\n%s\nstderr: %s", code, out, errOut)
	}
	empty := t.TempDir()
	if code, _, errOut := runCLI("persist", "inspect", empty); code != 1 || errOut != "xdsrelay: "+empty+": no saved caches (group-*.cache) in the directory\n" {
		t.Errorf("an empty DIR: exit %d, %q", code, errOut)
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrappb "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // the bootstrap's typed_extension_protocol_options
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/xdsrelay/xdsrelay/relay"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// repo is the repository root (tests start in this package's directory).
var repo, _ = filepath.Abs(filepath.Join("..", ".."))

// docBlock returns the first fenced block in lang that contains marker of
// doc, a Markdown file named from the repository root (README.md,
// docs/clients.md).
func docBlock(t *testing.T, doc, lang, marker string) string {
	t.Helper()
	for _, code := range docBlocks(t, doc, lang) {
		if strings.Contains(code, marker) {
			return code
		}
	}
	t.Fatalf("%s has no %s block with %q", doc, lang, marker)
	return ""
}

// docBlocks returns every fenced block in lang of doc.
func docBlocks(t *testing.T, doc, lang string) []string {
	t.Helper()
	var out []string
	for _, blk := range strings.Split(docText(t, doc), "```"+lang+"\n")[1:] {
		code, _, _ := strings.Cut(blk, "```")
		out = append(out, code)
	}
	return out
}

// docText is a Markdown file named from the repository root.
func docText(t *testing.T, doc string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, doc))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func copyFile(t *testing.T, from, to string, rewrite func(string) string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, []byte(rewrite(string(b))), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replaceOnce replaces old, which s must hold exactly once, with new.
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("%q appears %d times, want once", old, n)
	}
	return strings.Replace(s, old, new, 1)
}

// bootReadme starts the relay as the README's quick start does (go run
// ./cmd/xdsrelay --config config.example.yaml, from the repository root), on
// a copy of config.example.yaml and examples/resources in which rewrite
// (file name → content → content) has moved the ports the test needs. Only
// the listening addresses differ: 127.0.0.1:0.
func bootReadme(t *testing.T, rewrite func(name, content string) string) *relay.Relay {
	t.Helper()
	return bootReadmeEnv(t, nil, rewrite)
}

// bootReadmeEnv is bootReadme with more of the environment set (the
// listening addresses still 127.0.0.1:0).
func bootReadmeEnv(t *testing.T, env map[string]string, rewrite func(name, content string) string) *relay.Relay {
	t.Helper()
	root := t.TempDir()
	res := filepath.Join(root, "examples", "resources")
	if err := os.MkdirAll(res, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(repo, "examples", "resources"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		copyFile(t, filepath.Join(repo, "examples", "resources", e.Name()), filepath.Join(res, e.Name()),
			func(s string) string { return rewrite(e.Name(), s) })
	}
	copyFile(t, filepath.Join(repo, "config.example.yaml"), filepath.Join(root, "config.example.yaml"),
		func(s string) string { return s })
	t.Chdir(root)
	return bootConfigEnv(t, "config.example.yaml", env)
}

// bootConfig starts the relay as `xdsrelay --config file` does, listening
// on 127.0.0.1:0, until the test ends.
func bootConfig(t *testing.T, file string) *relay.Relay {
	t.Helper()
	return bootConfigEnv(t, file, nil)
}

// bootConfigEnv is bootConfig with more of the environment set.
func bootConfigEnv(t *testing.T, file string, more map[string]string) *relay.Relay {
	t.Helper()
	env := map[string]string{"XDSRELAY_DOWNSTREAM_ADDRESS": "127.0.0.1:0", "XDSRELAY_ADMIN_ADDRESS": "127.0.0.1:0"}
	maps.Copy(env, more)
	opts, _, err := loadConfig(file, environ(env))
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(opts.Relay, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return r
}

// greeterBackend is a real gRPC server that answers with its name.
type greeterBackend struct {
	testgrpc.UnimplementedTestServiceServer
}

func (greeterBackend) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Hostname: "greeter"}, nil
}

func startGreeter(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, greeterBackend{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// moveGreeter points greeter.yaml's endpoint at port.
func moveGreeter(t *testing.T, port int) func(name, content string) string {
	return func(name, content string) string {
		if name != "greeter.yaml" {
			return content
		}
		return replaceOnce(t, content, "port_value: 50051", fmt.Sprintf("port_value: %d", port))
	}
}

// docs/clients.md's gRPC bootstrap works: the relay booted from
// config.example.yaml, a real gRPC client with that bootstrap (only
// server_uri moved to the relay) dials xds:///greeter, gets greeter.yaml's
// listener, route, cluster and endpoints, and its RPC reaches the backend.
func TestDocGRPCBootstrap(t *testing.T) {
	port := startGreeter(t)
	r := bootReadme(t, moveGreeter(t, port))

	var bootstrap map[string]any
	if err := json.Unmarshal([]byte(docBlock(t, "docs/clients.md", "json", `"xds_servers"`)), &bootstrap); err != nil {
		t.Fatalf("docs/clients.md's bootstrap: %v", err)
	}
	bootstrap["xds_servers"].([]any)[0].(map[string]any)["server_uri"] = r.Addr()
	b, err := json.Marshal(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := xds.NewXDSResolverWithConfigForTesting(b)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///greeter", grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("RPC through xds:///greeter: %v", err)
	}
	if resp.GetHostname() != "greeter" {
		t.Fatalf("reached %q", resp.GetHostname())
	}
}

// Every example resource, and the resources docs/control-planes.md shows, decode
// strictly (no unknown field) and pass their protos' validation rules,
// nested typed_configs included: the checks Envoy makes on receipt, made by
// the loader the relay itself uses.
func TestExampleResourcesAreValid(t *testing.T) {
	dirs := map[string]string{"examples/resources": filepath.Join(repo, "examples", "resources")}
	shown := t.TempDir()
	if err := os.WriteFile(filepath.Join(shown, "shown.yaml"), []byte(docBlock(t, "docs/control-planes.md", "yaml", `"@type"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	dirs["docs/control-planes.md"] = shown
	for name, dir := range dirs {
		f, err := upstream.NewFile(dir, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if f.Count() == 0 {
			t.Fatalf("%s: no resources", name)
		}
	}
}

// docs/clients.md's Envoy example works: Envoy, with its bootstrap (only
// the relay's port moved), takes envoy.yaml's listener and greeter.yaml's
// route, cluster and endpoints from the relay booted from
// config.example.yaml, and carries HTTP traffic to the backend. Runs when
// ENVOY_BIN names an Envoy binary.
func TestDocEnvoyBootstrap(t *testing.T) {
	bin := os.Getenv("ENVOY_BIN")
	if bin == "" {
		t.Skip("ENVOY_BIN is not set: no Envoy binary to run docs/clients.md's Envoy example")
	}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello from the greeter")
	}))
	defer backend.Close()
	backendPort := backend.Listener.Addr().(*net.TCPAddr).Port
	listenPort := freePort(t)
	greeter := moveGreeter(t, backendPort)
	r := bootReadme(t, func(name, content string) string {
		if name == "envoy.yaml" {
			return replaceOnce(t, content, "port_value: 10000", fmt.Sprintf("port_value: %d", listenPort))
		}
		return greeter(name, content)
	})
	_, relayPort, err := net.SplitHostPort(r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	boot := replaceOnce(t, docBlock(t, "docs/clients.md", "yaml", "dynamic_resources"), "port_value: 18001", "port_value: "+relayPort)
	bootFile := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(bootFile, []byte(boot), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", bootFile, "--disable-hot-restart", "--concurrency", "1", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", listenPort))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) == "hello from the greeter" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no traffic through Envoy: last error %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// docs/clients.md's Envoy bootstrap is one Envoy takes, where no Envoy runs
// it (TestDocEnvoyBootstrap): it decodes strictly (no unknown field, every
// typed_config a known type), passes the Bootstrap's validation rules, and
// its ADS cluster is a static cluster at the port config.example.yaml's
// relay serves xDS on.
func TestDocEnvoyBootstrapDecodes(t *testing.T) {
	var doc any
	if err := yaml.Unmarshal([]byte(docBlock(t, "docs/clients.md", "yaml", "dynamic_resources")), &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrappb.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		t.Fatalf("docs/clients.md's Envoy bootstrap: %v", err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("docs/clients.md's Envoy bootstrap: %v", err)
	}
	ads := boot.GetDynamicResources().GetAdsConfig().GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	opts, _, err := loadConfig(filepath.Join(repo, "config.example.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(opts.Relay.Downstream.Address)
	for _, c := range boot.GetStaticResources().GetClusters() {
		if c.GetName() != ads {
			continue
		}
		addr := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if fmt.Sprint(addr.GetPortValue()) != port {
			t.Errorf("the ADS cluster %q is at port %d, config.example.yaml's relay at %s", ads, addr.GetPortValue(), port)
		}
		return
	}
	t.Errorf("the ADS cluster %q is not a static cluster of the bootstrap", ads)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

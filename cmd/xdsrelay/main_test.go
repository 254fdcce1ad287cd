package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/relay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestVersionFlag(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--version"}, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.HasPrefix(out.String(), "xdsrelay ") {
		t.Fatalf("printed %q", out.String())
	}
}

func TestBadConfigExitsWithOneLine(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(file, []byte("cache:\n  retention: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	if code := run([]string{"--config", file}, io.Discard, &errOut); code != 2 {
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
	go func() { errc <- serve(ctx, opts, slog.New(slog.DiscardHandler)) }()
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

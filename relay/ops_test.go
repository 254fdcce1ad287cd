package relay

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// startJSONRelay is startRelay logging JSON to the returned buffer at a
// level the admin endpoint controls, starting at info.
func startJSONRelay(t *testing.T, upstream string, mutate ...func(*Config)) (*Relay, *logBuffer) {
	t.Helper()
	buf := &logBuffer{}
	lv := new(slog.LevelVar)
	logLevel := func(c *Config) { c.LogLevel = lv }
	r := startRelayLogged(t, upstream, slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: lv})), append([]func(*Config){logLevel}, mutate...)...)
	return r, buf
}

func do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// Per-message debug lines are written at debug only, and PUT
// /debug/loglevel turns them on at run time; every line is JSON.
func TestDebugLogsFollowLogLevel(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "tenant-a", "1", testcp.Cluster("x"))
	r, logs := startJSONRelay(t, cp.Addr)
	level := "http://" + r.AdminAddr() + "/debug/loglevel"
	if code, body := do(t, http.MethodGet, level, ""); code != http.StatusOK || body != "info\n" {
		t.Fatalf("GET /debug/loglevel: %d %q, want 200 info", code, body)
	}

	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	s.recv()
	s.quiet(100 * time.Millisecond) // the relay is done with the exchange
	for _, msg := range []string{"request from client", "response to client", "request to control plane", "response from control plane"} {
		if n := len(logs.Lines(t, msg)); n != 0 {
			t.Errorf("%d %q lines at info", n, msg)
		}
	}

	if code, body := do(t, http.MethodPut, level, "debug"); code != http.StatusOK || body != "debug\n" {
		t.Fatalf("PUT /debug/loglevel debug: %d %q", code, body)
	}
	if code, _ := do(t, http.MethodPut, level, "loud"); code != http.StatusBadRequest {
		t.Errorf("PUT /debug/loglevel loud: %d, want 400", code)
	}
	s2 := openSotW(t, r.Addr())
	s2.send(&discoverypb.DiscoveryRequest{Node: node("m", "tenant-b"), TypeUrl: resourcev3.ClusterType})
	cp.Set(t, "tenant-b", "1", testcp.Cluster("y"))
	s2.recv()
	for _, msg := range []string{"request from client", "response to client", "request to control plane", "response from control plane"} {
		eventually(t, msg+" at debug", func() bool { return len(logs.Lines(t, msg)) > 0 })
	}
	for _, l := range logs.Lines(t, "response to client") {
		if l["type"] != "Cluster" || l["resources"] != 1.0 || l["nonce"] == "" {
			t.Errorf("response line: %v", l)
		}
	}
	if code, body := do(t, http.MethodGet, level, ""); code != http.StatusOK || body != "debug\n" {
		t.Errorf("GET /debug/loglevel: %d %q, want 200 debug", code, body)
	}
}

// /debug/loglevel and /debug/pprof/ are for private callers only; pprof is
// served only with admin.pprof.
func TestPprofAndLogLevelArePrivate(t *testing.T) {
	off, _ := startJSONRelay(t, FilePrefix+t.TempDir())
	if code, body := do(t, http.MethodGet, "http://"+off.AdminAddr()+"/debug/pprof/heap", ""); code != http.StatusNotFound || !strings.Contains(body, "admin.pprof: true") {
		t.Errorf("pprof without admin.pprof: %d %q, want 404 naming admin.pprof", code, body)
	}
	on, _ := startJSONRelay(t, FilePrefix+t.TempDir(), func(c *Config) { c.Admin.Pprof = true })
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		if code, _ := do(t, http.MethodGet, "http://"+on.AdminAddr()+path, ""); code != http.StatusOK {
			t.Errorf("%s with admin.pprof: %d, want 200", path, code)
		}
	}
	// The mutex profile samples contention.
	if _, body := do(t, http.MethodGet, "http://"+on.AdminAddr()+"/debug/pprof/mutex?debug=1", ""); !strings.Contains(body, "sampling period=100") {
		t.Errorf("mutex profile: %.200q, want sampling period=100", body)
	}
	public, _ := startJSONRelay(t, FilePrefix+t.TempDir(), publicAdmin(t), func(c *Config) { c.Admin.Pprof = true })
	base := "http://" + public.AdminAddr()
	for _, path := range []string{"/debug/pprof/", "/debug/loglevel"} {
		if code, _ := do(t, http.MethodGet, base+path, ""); code != http.StatusForbidden {
			t.Errorf("%s to a public caller: %d, want 403", path, code)
		}
	}
	if code, _ := do(t, http.MethodPut, base+"/debug/loglevel", "debug"); code != http.StatusForbidden {
		t.Errorf("PUT /debug/loglevel to a public caller: %d, want 403", code)
	}
}

// gRPC health on the downstream port says SERVING while the relay serves
// and NOT_SERVING once shutdown begins; a Watch then ends, so it does not
// hold the drain.
func TestGRPCHealthAcrossShutdown(t *testing.T) {
	r := startRelay(t, FilePrefix+t.TempDir())
	hc := healthpb.NewHealthClient(dial(t, r.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check: %v %v, want SERVING", resp, err)
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := w.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch: %v %v, want SERVING", m, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		shutdown(t, r)
	}()
	if m, err := w.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Watch during shutdown: %v %v, want NOT_SERVING", m, err)
	}
	if _, err := w.Recv(); err == nil {
		t.Error("Watch did not end at shutdown")
	}
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("shutdown did not end")
	}
}

// With admin.ready_after_sync, /readyz and gRPC health say not ready until
// the control plane has answered, then ready.
func TestReadyAfterSync(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "tenant-a", "1", testcp.Cluster("x"))
	cp.Stop()
	r := startRelay(t, cp.Addr, fastReconnect, func(c *Config) { c.Admin.ReadyAfterSync = true })
	readyz := "http://" + r.AdminAddr() + "/readyz"
	hc := healthpb.NewHealthClient(dial(t, r.Addr()))
	check := func() healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		return resp.GetStatus()
	}
	eventually(t, "/readyz naming the refused connection", func() bool {
		code, body := get(t, http.DefaultClient, readyz)
		if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: waiting for the first upstream sync: ") {
			t.Fatalf("/readyz before the control plane: %d %q", code, body)
		}
		return strings.Contains(body, "upstream "+cp.Addr+" cannot be reached") && strings.Contains(body, "connection refused")
	})
	if st := check(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before the control plane: %v", st)
	}
	// A wildcard client is served nothing: its stream ends with
	// UNAVAILABLE (docs/clients.md), and the relay stays not ready.
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	if err := ended(t, s); status.Code(err) != codes.Unavailable {
		t.Fatalf("a wildcard client during the outage: %v, want UNAVAILABLE", err)
	}
	if code, _ := get(t, http.DefaultClient, readyz); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with a group and no answer: %d, want 503", code)
	}
	cp.Restart()
	eventually(t, "/readyz 200", func() bool {
		code, _ := get(t, http.DefaultClient, readyz)
		return code == http.StatusOK
	})
	if st := check(); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health after the first sync: %v", st)
	}
	s = openDelta(t, r.Addr()) // the client's retry
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	s.recv()
}

// With admin.ready_after_sync and no group yet, the relay is ready once its
// connection to the control plane is up: clients must be let in for a group
// to start.
func TestReadyAfterSyncWithoutGroups(t *testing.T) {
	cp := testcp.Start(t)
	r := startRelay(t, cp.Addr, func(c *Config) { c.Admin.ReadyAfterSync = true })
	eventually(t, "/readyz 200", func() bool {
		code, _ := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz")
		return code == http.StatusOK
	})
}

// With admin.ready_after_sync, a restored cache is something to serve: the
// relay is ready while the control plane is still away.
func TestReadyAfterSyncRestoredCache(t *testing.T) {
	dir := t.TempDir()
	persist := func(c *Config) {
		c.Cache.PersistDir = dir
		c.Cache.PersistInterval = 20 * time.Millisecond
		c.Admin.ReadyAfterSync = true
		fastReconnect(c)
	}
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	first := startRelay(t, cp.Addr, persist)
	s := openDelta(t, first.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	s.recv()
	s.close()
	shutdown(t, first)
	cp.Stop()

	second := startRelay(t, cp.Addr, persist)
	eventually(t, "/readyz 200 from the restored cache", func() bool {
		code, _ := get(t, http.DefaultClient, "http://"+second.AdminAddr()+"/readyz")
		return code == http.StatusOK
	})
}

// gRPC reflection is on the downstream port by default and lists CSDS and
// the xDS services; downstream.reflection: false turns it off.
func TestReflection(t *testing.T) {
	list := func(r *Relay) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		st, err := reflectionpb.NewServerReflectionClient(dial(t, r.Addr())).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		// A stream the server has already ended fails Send with io.EOF;
		// its status is read by Recv.
		if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && err != io.EOF {
			return nil, err
		}
		resp, err := st.Recv()
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			out = append(out, s.GetName())
		}
		return out, nil
	}
	on := startRelay(t, FilePrefix+t.TempDir())
	services, err := list(on)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"envoy.service.status.v3.ClientStatusDiscoveryService", "envoy.service.discovery.v3.AggregatedDiscoveryService", "grpc.health.v1.Health"} {
		if !slices.Contains(services, want) {
			t.Errorf("reflection lists %v, not %s", services, want)
		}
	}
	off := startRelay(t, FilePrefix+t.TempDir(), func(c *Config) { c.Downstream.Reflection = false })
	if _, err := list(off); status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection with downstream.reflection false: %v, want UNIMPLEMENTED", err)
	}
}

// With admin.ready_after_sync, no group yet and the control plane down at
// start, a fallback server that answers is enough: the relay is ready, so
// that clients are let in and their groups' streams fall back to it (gRFC
// A71). A fallback server that is down too keeps it unready.
func TestReadyAfterSyncOnAFallbackServer(t *testing.T) {
	dead := deadAddr(t)
	secondary := testcp.Start(t)
	r := startRelay(t, dead, fastReconnect, func(c *Config) {
		c.Admin.ReadyAfterSync = true
		c.Upstream.Addresses = []string{deadAddr(t), secondary.Addr}
	})
	eventually(t, "/readyz 200 with the primary down and the secondary up", func() bool {
		code, _ := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz")
		return code == http.StatusOK
	})

	down := startRelay(t, dead, fastReconnect, func(c *Config) {
		c.Admin.ReadyAfterSync = true
		c.Upstream.Addresses = []string{deadAddr(t)}
	})
	for range 20 { // every server refuses: a second of polls stays unready
		if code, _ := get(t, http.DefaultClient, "http://"+down.AdminAddr()+"/readyz"); code == http.StatusOK {
			t.Fatal("ready with every server down")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The "relay serving" line names every listener that is open, the
// REST-JSON port's included, and none that is not.
func TestServingLineNamesTheListeners(t *testing.T) {
	cp := testcp.Start(t)
	logs := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) {
		c.Downstream.RESTAddress = "127.0.0.1:0"
		c.Admin.LocalAddress = "" // closed
	})
	lines := logs.Lines(t, "relay serving")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want one:\n%s", len(lines), logs)
	}
	if l := lines[0]; l["rest"] != r.RESTAddr() || l["admin"] != r.AdminAddr() || l["downstream"] != r.Addr() {
		t.Errorf("relay serving: %v; want the REST-JSON, admin and xDS listeners", l)
	} else if _, ok := l["admin_local"]; ok {
		t.Errorf("relay serving names admin_local, which is closed: %v", l)
	}
}

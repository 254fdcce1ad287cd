package relay

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// With admin.ready_after_sync and a control plane that is not there, the
// relay never becomes ready, and /readyz says why: to anyone in general
// terms (the kind of failure, no address), to a private caller with the
// address and the error.
func TestNotReadySaysWhy(t *testing.T) {
	dead := deadAddr(t)
	r := startRelay(t, dead, fastReconnect, publicAdmin(t), func(c *Config) { c.Admin.ReadyAfterSync = true })
	want := "not ready: waiting for the first upstream sync: the control plane cannot be reached (connection refused)\n"
	eventually(t, "/readyz naming the failure", func() bool {
		code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz")
		if code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz with no control plane: %d %q, want 503", code, body)
		}
		if strings.Contains(body, dead) {
			t.Fatalf("/readyz to anyone names the control plane: %q", body)
		}
		return body == want
	})
	private := r.notReadyLine(r.notReady(), true)
	if !strings.Contains(private, "upstream "+dead+" cannot be reached: ") || !strings.Contains(private, "connection refused") {
		t.Errorf("the private /readyz: %q, want the address and the error", private)
	}
}

// With admin.ready_after_sync and a control plane that accepts TCP and
// never speaks HTTP/2, /readyz names that case: to anyone as the kind of
// failure, to a private caller before the error, with the address.
func TestNotReadyNamesSilentServer(t *testing.T) {
	mute := startMute(t)
	r := startRelay(t, mute.addr, fastReconnect, publicAdmin(t), func(c *Config) {
		c.Admin.ReadyAfterSync = true
		c.Upstream.ConnectTimeout = 500 * time.Millisecond
	})
	want := "not ready: waiting for the first upstream sync: the control plane cannot be reached (" + upstream.SilentServer + ")\n"
	eventually(t, "/readyz naming the silent server", func() bool {
		_, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz")
		if strings.Contains(body, mute.addr) {
			t.Fatalf("/readyz to anyone names the control plane: %q", body)
		}
		return body == want
	})
	private := r.notReadyLine(r.notReady(), true)
	if !strings.Contains(private, "upstream "+mute.addr+" cannot be reached: "+upstream.SilentServer+": ") {
		t.Errorf("the private /readyz: %q, want the address and the case named", private)
	}
}

// A group whose control plane is down with nothing cached is not "serving
// from cache": /readyz says it has nothing to serve, privately and in
// general terms.
func TestReadyzNothingCachedIsNotServingFromCache(t *testing.T) {
	dead := deadAddr(t)
	r := startRelay(t, dead, fastReconnect)
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	eventually(t, "the group's upstream error", func() bool {
		g := r.snapshotGroups()
		return len(g) == 1 && g[0].feed.Status().LastError != ""
	})
	_, private := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz")
	key := GroupKey(node("n", "tenant-a"), r.cfg.Upstream.GroupBy)
	if !strings.Contains(private, fmt.Sprintf("group %q: upstream DOWN, nothing cached to serve", key)) {
		t.Errorf("private /readyz: %q", private)
	}
	if want := "ready; 1 group with upstream down and nothing cached to serve"; r.readySummary() != want {
		t.Errorf("general /readyz: %q, want %q", r.readySummary(), want)
	}
	for _, body := range []string{private, r.readySummary()} {
		if strings.Contains(body, "serving from cache") {
			t.Errorf("/readyz says serving from cache with nothing cached: %q", body)
		}
	}
}

// Once ready after its first sync, a relay stays ready through an outage
// of its control plane while it serves a warm cache.
func TestReadyAfterSyncStaysReadyThroughOutage(t *testing.T) {
	forEachDialect(t, testReadyAfterSyncStaysReadyThroughOutage)
}

func testReadyAfterSyncStaysReadyThroughOutage(t *testing.T, d testcp.Dialect) {
	cp := testcp.StartDialect(t, d)
	cp.Set(t, "tenant-a", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, fastReconnect, func(c *Config) { c.Admin.ReadyAfterSync = true })
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	s.recv()
	readyz := "http://" + r.AdminAddr() + "/readyz"
	eventually(t, "/readyz 200 after the first sync", func() bool {
		code, _ := get(t, http.DefaultClient, readyz)
		return code == http.StatusOK
	})
	cp.Stop()
	eventually(t, "the group's upstream down", func() bool {
		g := r.snapshotGroups()
		return len(g) == 1 && !g[0].feed.Status().Connected
	})
	code, body := get(t, http.DefaultClient, readyz)
	if code != http.StatusOK || !strings.Contains(body, "upstream DOWN, serving from cache") {
		t.Errorf("/readyz during the outage: %d %q, want 200, serving from cache", code, body)
	}
}

// While admin.ready_after_sync waits, the log says why at warn, with the
// upstream's address and error and the document that explains it, once for
// each reason (docs/operations.md, "Readiness").
func TestNotReadyIsLoggedOnce(t *testing.T) {
	dead := deadAddr(t)
	logs := &logBuffer{}
	r := startRelayLogged(t, dead, slog.New(slog.NewJSONHandler(logs, nil)), fastReconnect, func(c *Config) { c.Admin.ReadyAfterSync = true })
	var last string
	eventually(t, "the refused connection as the reason", func() bool {
		r.logSyncProblem(&last)
		return strings.Contains(last, "connection refused")
	})
	logged := func() (lines []map[string]any) {
		for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "not ready: waiting for the first upstream sync" {
				lines = append(lines, m)
			}
		}
		return lines
	}
	before := logged()
	r.logSyncProblem(&last) // the same reason again
	lines := logged()
	if len(lines) != len(before) || len(lines) == 0 {
		t.Fatalf("logged %d lines, then %d for the same reason", len(before), len(lines))
	}
	l := lines[len(lines)-1]
	why, _ := l["why"].(string)
	if l["level"] != "WARN" || !strings.Contains(why, "upstream "+dead+" cannot be reached: ") || !strings.Contains(why, "connection refused") {
		t.Errorf("logged %v", l)
	}
	doc, _ := l["doc"].(string)
	file, anchor, _ := strings.Cut(doc, "#")
	if b, err := os.ReadFile(filepath.Join("..", file)); doc == "" || err != nil || !hasHeading(string(b), anchor) {
		t.Errorf("the log names doc %q: no such document and heading (%v)", doc, err)
	}
}

// The probe that learns why the connection to the control plane fails
// reports no failure once the call reaches the control plane (the
// connection came up between the state check and the call), though the
// control plane serves no gRPC health: /readyz must not say "cannot be
// reached: ... Unimplemented".
func TestLastConnErrorOnlyForAFailure(t *testing.T) {
	cp := testcp.Start(t)
	r := startRelay(t, cp.Addr, fastReconnect, func(c *Config) { c.Admin.ReadyAfterSync = true })
	eventually(t, "the connection to the control plane", func() bool { return r.upConn.GetState() == connectivity.Ready })
	if err, failed := r.lastConnError(); failed {
		t.Errorf("with the connection up: failed with %q", err)
	}
	cp.Stop()
	eventually(t, "the connection to fail", func() bool {
		r.upConn.Connect() // out of IDLE, where a lost connection goes
		return r.upConn.GetState() == connectivity.TransientFailure
	})
	if err, failed := r.lastConnError(); !failed || !strings.Contains(err, "connection refused") {
		t.Errorf("with the control plane gone: %q, failed %v", err, failed)
	}
}

func TestFailureKind(t *testing.T) {
	for _, tc := range []struct{ err, want string }{
		{`rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.1:18000: connect: connection refused"`, "connection refused"},
		{`rpc error: code = Unavailable desc = name resolver error: produced zero addresses`, "its name does not resolve"},
		{`rpc error: code = Unavailable desc = dns: A record lookup error: lookup xds-control-plane on 10.96.0.10:53: no such host`, "its name does not resolve"},
		{`rpc error: code = Unavailable desc = connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`, "TLS handshake failed"},
		{`rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.1:18000: i/o timeout"`, "connection timed out"},
		{`rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.1:18000: connect: no route to host"`, "network unreachable"},
		{`rpc error: code = Unavailable desc = connection error: desc = "error reading server preface: raw-read tcp 127.0.0.1:54052->127.0.0.1:34791: use of closed network connection"`, upstream.SilentServer},
		{`rpc error: code = Unavailable desc = connection error: desc = "error reading server preface: read tcp 10.0.0.2:41000->10.0.0.1:18000: use of closed network connection"`, upstream.SilentServer},
		{`rpc error: code = Unavailable desc = connection error: desc = "transport: authentication handshake failed: context deadline exceeded"`, upstream.SilentTLSServer},
		{`something else`, "connection failing"},
	} {
		if got := failureKind(tc.err); got != tc.want {
			t.Errorf("failureKind(%q) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// deadAddr is a loopback address that refuses connections.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// The private /readyz says an upstream's error once (the first line says
// it while the relay waits for its first sync; the upstream's line then
// points to it), and names a file:// upstream's files rather than an empty
// server.
func TestReadyzSaysEachErrorOnce(t *testing.T) {
	dead := deadAddr(t)
	r := startRelay(t, dead, fastReconnect, func(c *Config) { c.Admin.ReadyAfterSync = true })
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	var body string
	eventually(t, "/readyz with the group's upstream error", func() bool {
		_, body = get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz")
		return strings.HasPrefix(body, `not ready: waiting for the first upstream sync: group "`) && strings.Contains(body, `upstream "default": server `+dead+`, DOWN`)
	})
	if n := strings.Count(body, "connection refused"); n != 1 || !strings.Contains(body, "DOWN (the error above)") {
		t.Errorf("the private /readyz says the error %d times, want once:\n%s", n, body)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte("\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rf := startRelay(t, FilePrefix+dir)
	sf := openDelta(t, rf.Addr())
	sf.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	sf.recv()
	_, body = get(t, http.DefaultClient, "http://"+rf.AdminAddr()+"/readyz")
	if !strings.Contains(body, `  upstream "default": files `+FilePrefix+dir+", connected\n") || strings.Contains(body, "server ,") {
		t.Errorf("the private /readyz of a file:// upstream:\n%s", body)
	}
}

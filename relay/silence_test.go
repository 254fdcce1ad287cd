package relay

import (
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// faultWait bounds the waits of the fault tests: detection takes
// keepalive.time (10s at least) + keepalive.timeout, then a connection
// attempt connect_timeout; 14s in these tests. It stays under the default
// keepalive bound (30s + 10s), so that a test whose configured keepalive
// did not reach the connection fails.
const faultWait = 30 * time.Second

// startProxy is a fault proxy in front of addr until the test ends.
func startProxy(t *testing.T, addr string) *faultproxy.Proxy {
	t.Helper()
	proxy, err := faultproxy.Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	return proxy
}

// silentSetup is a relay whose primary control plane, speaking d, is
// behind a proxy that can go silent, with a secondary speaking d in
// upstream.addresses: short timers, gRPC's shortest keepalive.
func silentSetup(t *testing.T, d testcp.Dialect) (r *Relay, proxy *faultproxy.Proxy, primary, secondary *testcp.ControlPlane) {
	t.Helper()
	primary, secondary = testcp.StartDialect(t, d), testcp.StartDialect(t, d)
	proxy = startProxy(t, primary.Addr)
	r = startRelay(t, proxy.Addr, fastReconnect, func(c *Config) {
		c.Upstream.Addresses = []string{secondary.Addr}
		c.Upstream.KeepaliveTime, c.Upstream.KeepaliveTimeout = 10*time.Second, 2*time.Second
		c.Upstream.ConnectTimeout, c.Upstream.FallbackRecheck = 2*time.Second, 2*time.Second
		c.Cache.NotFoundTimeout = 2 * time.Second
	})
	return r, proxy, primary, secondary
}

// deltaUntil reads d's responses, ACKing each, until done says so of the
// names received, removed and errored so far; it fails the test after
// bound, or at once if a removal of never arrives.
func deltaUntil(t *testing.T, d *deltaStream, never string, bound time.Duration, done func(got, removed []string, errs map[string]codes.Code) bool) {
	t.Helper()
	var got, removed []string
	errs := map[string]codes.Code{}
	deadline := time.Now().Add(bound)
	for !done(got, removed, errs) {
		resp := d.recvWithin(time.Until(deadline))
		got, removed = append(got, deltaNames(resp)...), append(removed, resp.GetRemovedResources()...)
		for _, e := range resp.GetResourceErrors() {
			errs[e.GetResourceName().GetName()] = codes.Code(e.GetErrorDetail().GetCode())
		}
		if slices.Contains(removed, never) {
			t.Fatalf("the client was told %s does not exist (got %v, errors %v)", never, got, errs)
		}
		d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
}

// parallelDialects runs f once per dialect of the control plane, the
// runs in parallel (docs/architecture.md, invariant 16: every dialect
// keeps the invariants the others do).
func parallelDialects(t *testing.T, f func(t *testing.T, d testcp.Dialect)) {
	t.Parallel()
	for _, d := range testcp.Dialects {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

// A control plane that goes silent (the connection stays open and carries
// nothing) is not taken to say that a name does not exist: a client that
// asks for a name not cached gets UNAVAILABLE, never a removal; the
// relay finds the connection dead within keepalive.time + timeout, gives
// up on the silent address after connect_timeout, falls back to the
// secondary (gRFC A71) and the client gets the resource; once the primary
// answers again the relay returns to it. In every dialect.
func TestSilentControlPlaneIsNotAnAnswer(t *testing.T) {
	parallelDialects(t, testSilentControlPlaneIsNotAnAnswer)
}

func testSilentControlPlaneIsNotAnAnswer(t *testing.T, dialect testcp.Dialect) {
	r, proxy, primary, secondary := silentSetup(t, dialect)
	for _, cp := range []*testcp.ControlPlane{primary, secondary} {
		cp.Set(t, "c1", "1", testcp.Cluster("known"), testcp.Cluster("later"))
	}
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"known"}})
	deltaUntil(t, d, "known", wait, func(got, _ []string, _ map[string]codes.Code) bool { return slices.Contains(got, "known") })

	proxy.Set(faultproxy.Silent, 0)
	start := time.Now()
	d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"later"}})
	sawUnavailable := false
	deltaUntil(t, d, "later", faultWait, func(got, _ []string, errs map[string]codes.Code) bool {
		sawUnavailable = sawUnavailable || errs["later"] == codes.Unavailable
		return slices.Contains(got, "later")
	})
	t.Logf("the name arrived from the secondary %v after the primary went silent", time.Since(start))
	if !sawUnavailable {
		t.Error("the client was not told the name was UNAVAILABLE while the control plane was silent")
	}
	if m := getMetrics(t, r); !strings.Contains(m, `xdsrelay_upstream_fallbacks_total{upstream="default"} 1`) ||
		!strings.Contains(m, `xdsrelay_upstream_server{server="`+secondary.Addr+`",upstream="default"} 1`) {
		t.Errorf("/metrics does not show the fallback:\n%s", grepLines(m, "xdsrelay_upstream_"))
	}
	if rz := readyz(t, r); !strings.Contains(rz, "server "+secondary.Addr+" (a fallback server") {
		t.Errorf("/readyz does not show the fallback:\n%s", rz)
	}

	// The partition heals: the relay returns to the primary.
	proxy.Set(faultproxy.Pass, 0)
	line := `xdsrelay_upstream_server{server="` + proxy.Addr + `",upstream="default"} 1`
	eventuallyWithin(t, faultWait, "the relay to return to the primary", func() bool {
		return strings.Contains(getMetrics(t, r), line)
	})
}

// A name reported not to exist by a live stream (its connection answered
// the relay's probe) is taken back once that stream dies: it is missing
// again, gRFC A71 falls back for it, and the client gets it from the
// secondary. In every dialect.
func TestJudgedOnAStreamThatDiesIsMissingAgain(t *testing.T) {
	parallelDialects(t, testJudgedOnAStreamThatDiesIsMissingAgain)
}

func testJudgedOnAStreamThatDiesIsMissingAgain(t *testing.T, dialect testcp.Dialect) {
	r, proxy, primary, secondary := silentSetup(t, dialect)
	primary.Set(t, "c1", "1", testcp.Cluster("known"))
	secondary.Set(t, "c1", "1", testcp.Cluster("known"), testcp.Cluster("elsewhere"))
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"known", "elsewhere"}})
	// The primary is alive and has no "elsewhere": it is reported not to
	// exist, with NOT_FOUND.
	var removedOnce bool
	deadline := time.Now().Add(faultWait)
	for !removedOnce {
		resp := d.recvWithin(time.Until(deadline))
		removedOnce = slices.Contains(resp.GetRemovedResources(), "elsewhere")
		d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
	// The primary's stream then dies: the judgment is taken back, and the
	// relay falls back to the secondary for the name it now misses.
	proxy.Set(faultproxy.Silent, 0)
	deltaUntil(t, d, "", faultWait, func(got, _ []string, _ map[string]codes.Code) bool { return slices.Contains(got, "elsewhere") })
}

// grepLines keeps the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// An address that accepts connections and answers nothing is given up
// after upstream.connect_timeout: the relay falls back to the secondary
// for a name it has not cached (gRFC A71). The wait is bounded well under
// gRPC's own 20s minimum connect timeout, which would apply if the key
// did not reach the connection.
func TestSilentAddressGivenUpAfterConnectTimeout(t *testing.T) {
	t.Parallel()
	r, proxy, primary, secondary := silentSetup(t, testcp.DialectDelta)
	primary.Set(t, "c1", "1", testcp.Cluster("a"))
	secondary.Set(t, "c1", "1", testcp.Cluster("a"))
	proxy.Set(faultproxy.Silent, 0)
	start := time.Now()
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})
	deltaUntil(t, d, "a", wait, func(got, _ []string, _ map[string]codes.Code) bool { return slices.Contains(got, "a") })
	t.Logf("served from the secondary %v after the first attempt (connect_timeout 2s)", time.Since(start))
	waitMetric(t, r, `xdsrelay_upstream_fallbacks_total{upstream="default"} 1`)
}

// muteServer accepts TCP connections and never writes a byte: a server
// that is up but does not speak HTTP/2 (a hung process, a port that is not
// the control plane's gRPC one).
type muteServer struct {
	addr     string
	accepted atomic.Int64 // connections accepted
	closed   atomic.Int64 // of those, closed by the client: attempts given up
}

// startMute runs a muteServer until the test ends.
func startMute(t *testing.T) *muteServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &muteServer{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			m.accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(io.Discard, c) // until the client gives up
				m.closed.Add(1)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return m
}

// A server that accepts TCP and never speaks HTTP/2 is reported once per
// connection attempt: gRPC gives each attempt upstream.connect_timeout,
// and the streams that fail at once in between, with the same attempt's
// error, are neither logged nor counted again. The log line and /readyz
// name the case.
func TestSilentServerReportedOncePerAttempt(t *testing.T) {
	t.Parallel()
	mute := startMute(t)
	logs := &logBuffer{}
	r := startRelayLogged(t, mute.addr, slog.New(slog.NewJSONHandler(logs, nil)), func(c *Config) {
		c.Upstream.ConnectTimeout = time.Second
		c.Upstream.ReconnectBaseDelay, c.Upstream.ReconnectMaxDelay = 100*time.Millisecond, 300*time.Millisecond
	})
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"a"}})

	series := `xdsrelay_upstream_reconnects_total{group="` + keyOf("c1") + `"} `
	reported := func() (warned, counted int) {
		warned = len(logs.Lines(t, "upstream stream ended; reconnecting"))
		for _, l := range strings.Split(getMetrics(t, r), "\n") {
			if n, ok := strings.CutPrefix(l, series); ok {
				counted, _ = strconv.Atoi(n)
			}
		}
		return warned, counted
	}
	// Each failed attempt is reported after it ends, never more than once:
	// the reports never outnumber the connections accepted (but for one
	// the client gave up on that may wait in the listen queue still), and
	// once four attempts have failed they catch up with them.
	eventuallyWithin(t, faultWait, "a report for each of four failed attempts", func() bool {
		warned, counted := reported()
		accepted, closed := mute.accepted.Load(), mute.closed.Load()
		if int64(warned) > accepted+1 || int64(counted) > accepted+1 {
			t.Fatalf("%d warnings and %d reconnects counted for %d connections", warned, counted, accepted)
		}
		return closed >= 4 && int64(warned) == closed && int64(counted) == closed
	})
	for _, l := range logs.Lines(t, "upstream stream ended; reconnecting") {
		if l["why"] != upstream.SilentServer {
			t.Errorf("the warning does not name the case: %v", l)
		}
	}
	if rz := readyz(t, r); !strings.Contains(rz, "DOWN ("+upstream.SilentServer+": ") {
		t.Errorf("/readyz does not name the case:\n%s", rz)
	}
}

package relay

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
)

// forward starts a TCP proxy on loopback to backend, dialling it from
// source (nil: the system's choice); closed when the test ends.
func forward(t *testing.T, source net.IP, backend string) string {
	t.Helper()
	p, err := faultproxy.StartFrom(source, backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p.Addr
}

// getWith GETs url with the headers h.
func getWith(t *testing.T, url string, h http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The read-only views work through kubectl port-forward with no
// certificate, and nothing is opened to other pods. In a pod the admin
// endpoint listens on all interfaces (the kubelet's probes need it), so
// it serves no details; admin.local_address, bound to loopback, serves the
// views to what reaches it inside the pod: kubectl port-forward, which
// is a TCP proxy that dials it from 127.0.0.1, and kubectl exec. It
// refuses what changes the process, and every request that came through
// a proxy: from a sidecar's own loopback address (Istio's inbound
// passthrough connects from 127.0.0.6), or carrying a proxy's headers.
// Other pods cannot connect to it at all.
func TestAdminViewsInsideThePodOnly(t *testing.T) {
	r, _ := relayWithDownGroup(t, publicAdmin(t))
	views := []string{"/debug/groups", "/debug/clients", "/debug/convergence", "/debug/cache", "/debug/guard/holds", "/debug/rollout/changes"}
	for _, path := range views {
		if code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+path); code != http.StatusForbidden {
			t.Errorf("%s on the public admin.address: %d %s, want 403", path, code, body)
		}
	}

	portForward := forward(t, nil, r.AdminLocalAddr())
	for _, path := range views {
		if code, body := get(t, http.DefaultClient, "http://"+portForward+path); code != http.StatusOK {
			t.Errorf("%s through a port-forward to admin.local_address: %d %s, want 200", path, code, body)
		}
	}
	if code, body := get(t, http.DefaultClient, "http://"+portForward+"/readyz"); !strings.Contains(body, "group \""+keyOf("tenant-a")+"\"") {
		t.Errorf("/readyz through a port-forward: %d %q, want the details", code, body)
	}
	code, body := do(t, http.MethodPost, "http://"+portForward+"/debug/guard/release", "")
	if code != http.StatusForbidden || !strings.Contains(body, "not on admin.local_address") {
		t.Errorf("a release through a port-forward: %d %q, want 403 saying it needs more", code, body)
	}

	sidecar := forward(t, net.IPv4(127, 0, 0, 6), r.AdminLocalAddr())
	code, body = get(t, http.DefaultClient, "http://"+sidecar+"/debug/groups")
	if code != http.StatusForbidden || !strings.Contains(body, "127.0.0.6") || strings.Contains(body, "tenant-a") {
		t.Errorf("/debug/groups through a sidecar that forwards from 127.0.0.6: %d %q, want 403 naming the address", code, body)
	}
	for h, v := range map[string]string{"X-Forwarded-For": "10.0.0.7", "X-Forwarded-Proto": "http", "Forwarded": "for=10.0.0.7",
		"X-Envoy-Expected-Rq-Timeout-Ms": "15000", "X-Forwarded-Client-Cert": "By=spiffe://cluster.local/ns/a/sa/b", "L5d-Dst-Canonical": "xdsrelay.mesh.svc:9902"} {
		code, body := getWith(t, "http://"+portForward+"/debug/groups", http.Header{h: {v}})
		if code != http.StatusForbidden || !strings.Contains(body, h) {
			t.Errorf("/debug/groups with %s: %d %q, want 403 naming the header", h, code, body)
		}
	}
	target, err := url.Parse("http://" + r.AdminLocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	httpSidecar := httptest.NewServer(httputil.NewSingleHostReverseProxy(target)) // sets X-Forwarded-For
	t.Cleanup(httpSidecar.Close)
	if code, body := get(t, http.DefaultClient, httpSidecar.URL+"/debug/groups"); code != http.StatusForbidden {
		t.Errorf("/debug/groups through an HTTP proxy on loopback: %d %q, want 403", code, body)
	}

	// Another pod reaches the pod's own address, where nothing listens on
	// admin.local_address's port.
	if ip := nonLoopbackIP(); ip != "" {
		_, port, _ := net.SplitHostPort(r.AdminLocalAddr())
		c, err := net.Dial("tcp", net.JoinHostPort(ip, port))
		if err == nil {
			c.Close()
			t.Errorf("admin.local_address's port answers on %s", ip)
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dialling admin.local_address's port on %s: %v, want connection refused", ip, err)
		}
	}
}

// On a loopback admin.address every path answers, but not to a request
// that came through a proxy: a sidecar that forwards to loopback makes no
// one private.
func TestLoopbackAdminRefusesProxiedRequests(t *testing.T) {
	r, _ := relayWithDownGroup(t)
	if code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/debug/groups"); code != http.StatusOK {
		t.Fatalf("/debug/groups on a loopback admin.address: %d %s", code, body)
	}
	if code, body := getWith(t, "http://"+r.AdminAddr()+"/debug/groups", http.Header{"X-Forwarded-For": {"10.0.0.7"}}); code != http.StatusForbidden ||
		strings.Contains(body, "tenant-a") {
		t.Errorf("/debug/groups with X-Forwarded-For: %d %q, want 403", code, body)
	}
	if code, body := getWith(t, "http://"+r.AdminAddr()+"/readyz", http.Header{"X-Forwarded-For": {"10.0.0.7"}}); strings.Contains(body, "tenant-a") {
		t.Errorf("/readyz with X-Forwarded-For: %d %q, want it in general terms", code, body)
	}
	if r.AdminLocalAddr() != "" {
		t.Errorf("admin.local_address opened beside a loopback admin.address: %s", r.AdminLocalAddr())
	}
}

// admin.local_address must be a loopback address: anything else is a
// configuration error that names the key.
func TestAdminLocalAddressMustBeLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:9902", "10.1.2.3:9902", "relay.example.com:9902", "nonsense"} {
		cfg := Default()
		cfg.Upstream.Address = FilePrefix + t.TempDir()
		cfg.Admin.LocalAddress = addr
		if _, err := New(cfg, testLogger()); err == nil || !strings.Contains(err.Error(), "admin.local_address") {
			t.Errorf("admin.local_address %q: %v, want an error naming the key", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		cfg := Default()
		cfg.Upstream.Address = FilePrefix + t.TempDir()
		cfg.Admin.LocalAddress = addr
		if err := cfg.Validate(); err != nil {
			t.Errorf("admin.local_address %q: %v", addr, err)
		}
	}
}

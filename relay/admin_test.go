package relay

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// publicAdmin binds the admin endpoint to an address that is not loopback:
// the machine's own if it has one; else 127.0.0.1, with the relay's
// loopback rule answering no. admin.local_address opens on a port of its
// own.
func publicAdmin(t *testing.T) func(*Config) {
	ip, loopback := nonLoopbackIP(), func(net.Addr) bool { return false }
	if ip != "" {
		loopback = nil // the rule's own answer
	} else {
		ip = "127.0.0.1"
	}
	return func(c *Config) {
		c.Admin.Address = net.JoinHostPort(ip, "0")
		c.Admin.LocalAddress = "127.0.0.1:0" // tests run side by side
		c.hooks.loopback = loopback
	}
}

// nonLoopbackIP is an IPv4 address of this machine, not loopback, that can
// be listened on; empty if there is none.
func nonLoopbackIP() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.To4() == nil || !ipn.IP.IsGlobalUnicast() {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ipn.IP.String(), "0"))
		if err != nil {
			continue
		}
		ln.Close()
		return ipn.IP.String()
	}
	return ""
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// relayWithDownGroup starts a relay whose one group (keyOf("tenant-a"))
// has lost its control plane.
func relayWithDownGroup(t *testing.T, mutate ...func(*Config)) (*Relay, *testcp.ControlPlane) {
	cp := testcp.Start(t)
	cp.Set(t, "tenant-a", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, append(mutate, fastReconnect)...)
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	s.recv()
	cp.Stop()
	eventually(t, "the group's upstream down", func() bool {
		g := r.snapshotGroups()
		return len(g) == 1 && !g[0].feed.Status().Connected
	})
	return r, cp
}

// On an admin address that is not loopback, the probes and /metrics are
// served, and /readyz says how the relay is in general terms only: no group
// key, no control-plane address.
func TestAdminPublicReadyzIsGeneral(t *testing.T) {
	r, cp := relayWithDownGroup(t, publicAdmin(t))
	base := "http://" + r.AdminAddr()
	code, body := get(t, http.DefaultClient, base+"/readyz")
	if want := "ready; 1 group with upstream down, serving from cache\n"; code != http.StatusOK || body != want {
		t.Fatalf("/readyz: %d %q, want 200 %q", code, body, want)
	}
	for _, secret := range []string{"tenant-a", cp.Addr} {
		if strings.Contains(body, secret) {
			t.Errorf("/readyz reveals %q", secret)
		}
	}
	if code, body := get(t, http.DefaultClient, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, http.DefaultClient, base+"/metrics"); code != http.StatusOK || !strings.Contains(body, "xdsrelay_groups 1") {
		t.Errorf("/metrics: %d %q", code, body)
	}
	shutdown(t, r)
}

// Over admin.tls, a client certificate that admin.tls.client_ca_file
// verifies sees the per-group /readyz on any address; a client without one
// gets the general answer (probes need no certificate), and plain HTTP is
// not served.
func TestAdminTLSClientCertSeesDetails(t *testing.T) {
	certs := testcp.MakeCerts(t)
	r, _ := relayWithDownGroup(t, publicAdmin(t), func(c *Config) {
		c.Admin.TLS.CertFile, c.Admin.TLS.KeyFile = certs.ServerCert, certs.ServerKey
		c.Admin.TLS.CAFile = certs.CA
	})
	clientCert, err := tls.LoadX509KeyPair(certs.ClientCert, certs.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	client := func(cert ...tls.Certificate) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool(t, certs.CA), ServerName: "localhost", Certificates: cert}}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	url := "https://" + r.AdminAddr() + "/readyz"

	code, body := get(t, client(clientCert), url)
	if code != http.StatusOK || !strings.Contains(body, fmt.Sprintf("group %q: upstream DOWN", keyOf("tenant-a"))) {
		t.Errorf("/readyz with a client certificate: %d %q, want the group's details", code, body)
	}
	code, body = get(t, client(), url)
	if want := "ready; 1 group with upstream down, serving from cache\n"; code != http.StatusOK || body != want {
		t.Errorf("/readyz without a client certificate: %d %q, want %q", code, body, want)
	}
	if resp, err := http.Get("http://" + r.AdminAddr() + "/readyz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("/readyz answered over plain HTTP")
		}
	}
	shutdown(t, r)
}

// /readyz says why the relay is not ready, in general terms, on any address.
func TestAdminNotReadyWhileShuttingDown(t *testing.T) {
	r := startRelay(t, FilePrefix+t.TempDir(), publicAdmin(t))
	r.stopped.Store(true)
	r.ready.Store(false)
	code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz")
	if code != http.StatusServiceUnavailable || body != "not ready: shutting down\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}
}

package deploy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// The installs booted: the binary run as the pod would run it, with the
// ConfigMap's config.yaml and the Deployment's environment; only the listen
// addresses move (the admin endpoint stays on all interfaces, as in the
// pod, so that no caller is private by its address) and the log is JSON.

// bootInstall runs the relay as m's pod, with env added (KEY=value); the
// Secret mounted for admin.tls is secretDir. Its admin endpoint is asked
// as the kubelet's probes ask: HTTPS without verification when admin.tls
// is on, no client certificate.
func bootInstall(t *testing.T, m manifests, secretDir string, env ...string) *relayProc {
	t.Helper()
	c := relayContainer(t, m.deployment)
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(m.config.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	mount := path.Dir(envValue(c, adminCertEnv))
	var all []string
	for _, kv := range containerEnv(c)[1:] {
		if secretDir != "" && envValue(c, adminCertEnv) != "" {
			kv = strings.Replace(kv, "="+mount+"/", "="+secretDir+"/", 1)
		}
		all = append(all, kv)
	}
	all = append(all, "XDSRELAY_DOWNSTREAM_ADDRESS=127.0.0.1:0", "XDSRELAY_ADMIN_ADDRESS=0.0.0.0:0", "XDSRELAY_LOG_FORMAT=json")
	if local := str(relayConfig(t, m.config), "admin.local_address"); local != "" {
		host, _, _ := net.SplitHostPort(local)
		all = append(all, "XDSRELAY_ADMIN_LOCAL_ADDRESS="+net.JoinHostPort(host, "0")) // its host as configured
	}
	all = append(all, env...)
	scheme, probe := "http", &http.Client{Timeout: wait, Transport: &http.Transport{}}
	if envValue(c, adminCertEnv) != "" {
		scheme = "https"
		probe.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} // as the kubelet
	}
	return startProc(t, relayBinary(t), file, all, scheme, probe)
}

// A pod of each install whose control plane is not there never becomes
// ready, and its /readyz says why in general terms (what the kubelet and
// anyone without a client certificate get): never "serving from cache",
// never the address. Its log names the address.
func TestInstallWithBadUpstreamNeverReady(t *testing.T) {
	for _, m := range []manifests{renderKustomize(t, "."), renderChart(t, chartRelease, chartNamespace, nil)} {
		t.Run(m.source, func(t *testing.T) {
			dead := deadAddress(t)
			p := bootInstall(t, m, "", upstreamEnv+"="+dead)
			want := "not ready: waiting for the first upstream sync: the control plane cannot be reached (connection refused)\n"
			// Every answer is 503, until it says why and then for as long
			// again as a readiness probe's failureThreshold × periodSeconds.
			deadline := time.Now().Add(wait)
			var end time.Time // set once /readyz says why
			for end.IsZero() || time.Now().Before(end) {
				code, body, err := p.get("/readyz")
				if err != nil || code != http.StatusServiceUnavailable {
					t.Fatalf("/readyz with no control plane: %d %q %v, want 503", code, body, err)
				}
				if strings.Contains(string(body), "serving from cache") || strings.Contains(string(body), dead) {
					t.Fatalf("/readyz: %q", body)
				}
				if end.IsZero() && string(body) == want {
					end = time.Now().Add(probeWindow(t, m))
				}
				if end.IsZero() && time.Now().After(deadline) {
					t.Fatalf("/readyz: %q, want %q", body, want)
				}
				time.Sleep(100 * time.Millisecond)
			}
			waitLog(t, p, `"msg":"not ready: waiting for the first upstream sync"`, dead)
		})
	}
}

// probeWindow is how long the readiness probe takes to decide: its
// failureThreshold times its periodSeconds.
func probeWindow(t *testing.T, m manifests) time.Duration {
	t.Helper()
	p := relayContainer(t, m.deployment).ReadinessProbe
	return time.Duration(p.FailureThreshold*p.PeriodSeconds) * time.Second
}

// waitLog waits for a log line that holds every one of parts.
func waitLog(t *testing.T, p *relayProc, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		for _, l := range p.logLines() {
			found := true
			for _, s := range parts {
				found = found && strings.Contains(l, s)
			}
			if found {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q", parts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Once ready, a pod of the installs stays ready through an outage of its
// control plane while it serves a warm cache, and says so.
func TestInstallStaysReadyThroughOutage(t *testing.T) {
	m := renderKustomize(t, ".")
	cp := startControlPlane(t)
	p := bootInstall(t, m, "", upstreamEnv+"="+cp.addr)
	p.waitReady(t)
	client := dialClient(t, p.downstream)
	client.send(t, subscribe("n", "fleet", []string{"c0"}))
	up := cp.stream(t)
	up.recv(t)
	up.send(t, &discoverypb.DeltaDiscoveryResponse{TypeUrl: clusterType, Nonce: "1", Resources: []*discoverypb.Resource{cluster(t, "c0", "1", 1)}})
	recvOK(t, client)
	cp.stop()
	deadline := time.Now().Add(wait)
	for {
		code, body, err := p.get("/readyz")
		if err != nil || code != http.StatusOK {
			t.Fatalf("/readyz during the outage: %d %q %v, want 200", code, body, err)
		}
		if string(body) == "ready; 1 group with upstream down, serving from cache\n" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz during the outage: %q", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// adminPKI is what an operator sets up for admin access in a cluster: a
// CA, the relay's admin certificate (the Secret's tls.crt and tls.key, for
// the Service's name), the CA again as the Secret's ca.crt, and an
// operator's client certificate; and an impostor's, from another CA.
type adminPKI struct {
	secretDir                 string // tls.crt, tls.key, ca.crt: the Secret's layout
	ca                        string
	operatorCert, operatorKey string
	impostorCert, impostorKey string
	serverName                string
}

func makeAdminPKI(t *testing.T, serverName string) adminPKI {
	t.Helper()
	dir := t.TempDir()
	pki := adminPKI{secretDir: filepath.Join(dir, "secret"), serverName: serverName}
	if err := os.Mkdir(pki.secretDir, 0o700); err != nil {
		t.Fatal(err)
	}
	caCert, caKey := newCert(t, nil, nil, "xdsrelay admin CA", nil)
	other, otherKey := newCert(t, nil, nil, "another CA", nil)
	server, serverKey := newCert(t, caCert, caKey, serverName, []string{serverName})
	operator, operatorKey := newCert(t, caCert, caKey, "operator", nil)
	impostor, impostorKey := newCert(t, other, otherKey, "operator", nil)
	write := func(file string, cert *x509.Certificate, key *ecdsa.PrivateKey) {
		writePEM(t, file, "CERTIFICATE", cert.Raw)
		if key != nil {
			der, err := x509.MarshalECPrivateKey(key)
			if err != nil {
				t.Fatal(err)
			}
			writePEM(t, strings.TrimSuffix(file, ".crt")+".key", "EC PRIVATE KEY", der)
		}
	}
	write(filepath.Join(pki.secretDir, "tls.crt"), server, serverKey)
	write(filepath.Join(pki.secretDir, "ca.crt"), caCert, nil)
	pki.ca = filepath.Join(pki.secretDir, "ca.crt")
	pki.operatorCert, pki.operatorKey = filepath.Join(dir, "operator.crt"), filepath.Join(dir, "operator.key")
	write(pki.operatorCert, operator, operatorKey)
	pki.impostorCert, pki.impostorKey = filepath.Join(dir, "impostor.crt"), filepath.Join(dir, "impostor.key")
	write(pki.impostorCert, impostor, impostorKey)
	return pki
}

// newCert makes a certificate signed by parent (self-signed, a CA, when
// parent is nil), for dns names if any (a server's), else a client's.
func newCert(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, cn string, dns []string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), DNSNames: dns}
	switch {
	case parent == nil:
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
		parent, parentKey = tmpl, key
	case len(dns) > 0:
		tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	default:
		tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t *testing.T, file, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// cli runs the built xdsrelay with args and returns its exit code and
// outputs.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(relayBinary(t), args...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// Admin access in a cluster, end to end with generated certificates: the
// admin mTLS install (the overlay, and the chart with adminTLS) booted with
// its Secret, reached as through kubectl port-forward. The probes get
// their answers without a certificate; an operator's client certificate
// reaches /debug/ with `xdsrelay admin`, `guard release` and `rollout
// release`; without one, or with one from another CA, /debug/ is refused.
func TestAdminMTLSEndToEnd(t *testing.T) {
	for _, m := range []manifests{
		renderKustomize(t, "overlays/admin-mtls"),
		renderChart(t, chartRelease, chartNamespace, chartValues(t, "adminTLS: {enabled: true}")),
	} {
		t.Run(m.source, func(t *testing.T) {
			pki := makeAdminPKI(t, m.service.Name+"."+chartNamespace+".svc")
			cp := startControlPlane(t)
			p := bootInstall(t, m, pki.secretDir, upstreamEnv+"="+cp.addr)
			p.waitReady(t) // as the kubelet's probe: HTTPS, no certificate
			if code, body, err := p.get("/readyz"); err != nil || code != http.StatusOK || string(body) != "ready\n" {
				t.Errorf("the probe's /readyz: %d %q %v, want the general answer", code, body, err)
			}
			if resp, err := http.Get("http://" + p.admin + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Error("the admin endpoint answered plain HTTP")
				}
			}

			// kubectl port-forward deploy/xdsrelay 9901: the operator
			// reaches the pod's port on localhost.
			server := []string{"--admin", p.admin, "--ca-file", pki.ca, "--server-name", pki.serverName}
			operator := append(append([]string{}, server...), "--cert-file", pki.operatorCert, "--key-file", pki.operatorKey)
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"admin", "/debug/groups"}, "[]\n"},
				{[]string{"admin", "/debug/clients"}, "[]\n"},
				{[]string{"admin", "-X", "PUT", "-d", "debug", "/debug/loglevel"}, "debug\n"},
				{[]string{"guard", "release"}, "nothing was held\n"},
				{[]string{"rollout", "release"}, "nothing was held\n"},
			} {
				args := append(append([]string{tc.args[0]}, operator...), tc.args[1:]...)
				if tc.args[0] != "admin" {
					args = append(append([]string{tc.args[0], tc.args[1]}, operator...), tc.args[2:]...)
				}
				if code, out, errOut := cli(t, args...); code != 0 || out != tc.want {
					t.Errorf("xdsrelay %s: exit %d, %q %q, want %q", strings.Join(tc.args, " "), code, out, errOut, tc.want)
				}
			}
			// docs/kubernetes.md's commands, as written but for the files
			// and the forwarded port.
			shown := map[string]string{"localhost:9901": p.admin, "ca.crt": pki.ca, "operator.crt": pki.operatorCert,
				"operator.key": pki.operatorKey, "xdsrelay.mesh.svc": pki.serverName}
			ran := 0
			for _, line := range docCommands(t, "docs/kubernetes.md", "Kubernetes") {
				words := strings.Fields(line)
				if words[0] != "xdsrelay" || !slices.Contains(words, "--cert-file") {
					continue // the views without a certificate: TestAdminViewsThroughPortForward
				}
				for i, w := range words {
					if v, ok := shown[w]; ok {
						words[i] = v
					}
				}
				if code, out, errOut := cli(t, words[1:]...); code != 0 {
					t.Errorf("docs/kubernetes.md's %q: exit %d, %q %q", line, code, out, errOut)
				}
				ran++
			}
			if ran == 0 {
				t.Error("docs/kubernetes.md shows no xdsrelay command for admin access in a cluster")
			}
			// A group, which the operator's /readyz shows and the probe's does not.
			dialClient(t, p.downstream).send(t, subscribe("n", "fleet", []string{"c0"}))
			for deadline := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
				code, out, _ := cli(t, append(append([]string{"admin"}, operator...), "/readyz")...)
				if code == 0 && strings.HasPrefix(out, "ready\ngroup ") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the operator's /readyz: exit %d, %q, want the detailed answer with the group", code, out)
				}
			}
			if code, body, err := p.get("/readyz"); err != nil || code != http.StatusOK || string(body) != "ready\n" {
				t.Errorf("the probe's /readyz with a group: %d %q %v, want the general answer", code, body, err)
			}
			code, _, errOut := cli(t, append(append([]string{"admin"}, server...), "/debug/groups")...)
			if code != 1 || !strings.Contains(errOut, "403 Forbidden") {
				t.Errorf("/debug/groups without a client certificate: exit %d, %q, want 1 and 403", code, errOut)
			}
			impostor := append(append([]string{"admin"}, server...), "--cert-file", pki.impostorCert, "--key-file", pki.impostorKey, "/debug/groups")
			if code, out, errOut := cli(t, impostor...); code != 1 || strings.Contains(out, "[") {
				t.Errorf("/debug/groups with another CA's certificate: exit %d, %q %q, want refused", code, out, errOut)
			}
		})
	}
}

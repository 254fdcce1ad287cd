package realcp

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// EnvVar names the Envoy Gateway binary the opt-in tests run
// (`go install github.com/envoyproxy/gateway/cmd/envoy-gateway@v1.9.1`);
// they are skipped when it is unset.
const EnvVar = "XDSRELAY_TEST_ENVOY_GATEWAY"

// EnvoyGatewayAddr is where Envoy Gateway serves xDS: its port is fixed
// (bootstrap.DefaultXdsServerPort), on every address.
const EnvoyGatewayAddr = "127.0.0.1:18000"

// EnvoyGatewayNodeCluster is the node cluster Envoy Gateway chooses a
// Gateway's configuration by: the Gateway's namespace and name, here the
// quick start's.
const EnvoyGatewayNodeCluster = "envoy-gateway-system/eg"

// EnvoyGateway is a running Envoy Gateway, standalone: its resources are
// files in Resources (the File provider), its infrastructure the Host's
// (it cannot start Envoy here, logs so, and serves xDS all the same).
type EnvoyGateway struct {
	// Resources is the folder it watches: a file written or removed
	// there changes what it serves within seconds.
	Resources string
	// The client certificate, key and CA of its xDS server's mTLS; the
	// server's certificate is for ServerName, not an IP address.
	CertFile, KeyFile, CAFile string
	ServerName                string
	// Log is its log file.
	Log string
}

// StartEnvoyGateway runs the Envoy Gateway binary that EnvVar names,
// standalone, with files (name to content: Gateway API resources, as
// Gateway and Route write them) in its folder of resources, until the test
// ends; it skips the test when EnvVar is unset, and when port 18000 is
// taken (run the test in a network namespace of its own then: `unshare
// -n`). It returns once the xDS server completes a TLS handshake.
func StartEnvoyGateway(t testing.TB, files map[string]string) *EnvoyGateway {
	t.Helper()
	bin := os.Getenv(EnvVar)
	if bin == "" {
		t.Skipf("%s is not set: the Envoy Gateway tests are opt-in", EnvVar)
	}
	if ln, err := net.Listen("tcp", ":18000"); err != nil {
		t.Skipf("Envoy Gateway's xDS port 18000 is taken (%v); run in a network namespace of its own (unshare -n)", err)
	} else {
		ln.Close()
	}
	dir := t.TempDir()
	eg := &EnvoyGateway{
		Resources:  filepath.Join(dir, "resources"),
		CertFile:   filepath.Join(dir, "eghome", "certs", "envoy", "tls.crt"),
		KeyFile:    filepath.Join(dir, "eghome", "certs", "envoy", "tls.key"),
		CAFile:     filepath.Join(dir, "eghome", "certs", "envoy", "ca.crt"),
		ServerName: "envoy-gateway",
		Log:        filepath.Join(dir, "envoy-gateway.log"),
	}
	if out, err := exec.Command(bin, "certgen", "--local", "--config-home", filepath.Join(dir, "eghome")).CombinedOutput(); err != nil {
		t.Fatalf("envoy-gateway certgen: %v: %s", err, out)
	}
	if err := os.MkdirAll(eg.Resources, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		eg.Write(t, name, content)
	}
	config := filepath.Join(dir, "standalone.yaml")
	if err := os.WriteFile(config, []byte(strings.ReplaceAll(standalone, "${EGDIR}", dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(eg.Log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "server", "--config-path", config)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		log.Close()
		if t.Failed() {
			eg.tail(t)
		}
	})
	eg.awaitTLS(t, exited)
	return eg
}

// awaitTLS waits, at most a minute, until the xDS server completes a TLS
// handshake with the client certificate.
func (eg *EnvoyGateway) awaitTLS(t testing.TB, exited <-chan struct{}) {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(eg.CertFile, eg.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", EnvoyGatewayAddr,
			&tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, NextProtos: []string{"h2"}})
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			eg.tail(t)
			t.Fatal("envoy-gateway exited before serving xDS")
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			eg.tail(t)
			t.Fatalf("envoy-gateway's xDS server did not answer TLS within a minute: %v", err)
		}
	}
}

// Write writes a resource file, which it picks up within seconds.
func (eg *EnvoyGateway) Write(t testing.TB, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(eg.Resources, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// tail logs the last lines of its log that are not at debug.
func (eg *EnvoyGateway) tail(t testing.TB) {
	b, _ := os.ReadFile(eg.Log)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "\tdebug\t") {
			lines = append(lines, l)
		}
	}
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	t.Logf("envoy-gateway's log (%s), its last lines not at debug:\n%s", eg.Log, strings.Join(lines, "\n"))
}

// standalone is Envoy Gateway's configuration: the File provider watching
// ${EGDIR}/resources, the Host infrastructure.
const standalone = `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
provider:
  type: Custom
  custom:
    resource:
      type: File
      file:
        paths: ["${EGDIR}/resources"]
    infrastructure:
      type: Host
      host:
        configHome: ${EGDIR}/eghome
        dataHome: ${EGDIR}/egdata
        stateHome: ${EGDIR}/egstate
        runtimeDir: ${EGDIR}/egrun
logging:
  level:
    default: info
extensionApis:
  enableBackend: true
`

// Gateway is the quick start's GatewayClass and Gateway (eg, an HTTP
// listener on 8888), and Route an HTTPRoute to a Backend at 127.0.0.1:port
// named name: each a resource file of its own, so that a route can be
// taken away.
const Gateway = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: eg
spec:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: eg
spec:
  gatewayClassName: eg
  listeners:
    - name: http
      protocol: HTTP
      port: 8888
`

// Route is an HTTPRoute of the Gateway, name, for host, to a Backend of
// the same name at 127.0.0.1:port.
func Route(name, host string, port int) string {
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: %[1]s
spec:
  parentRefs:
    - name: eg
  hostnames: [%[2]q]
  rules:
    - backendRefs:
        - group: gateway.envoyproxy.io
          kind: Backend
          name: %[1]s
      matches:
        - path: {type: PathPrefix, value: /}
---
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: Backend
metadata:
  name: %[1]s
spec:
  endpoints:
    - ip: {address: 127.0.0.1, port: %[3]d}
`, name, host, port)
}

// Remove removes a resource file, which it picks up within seconds.
func (eg *EnvoyGateway) Remove(t testing.TB, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(eg.Resources, name)); err != nil {
		t.Fatal(err)
	}
}

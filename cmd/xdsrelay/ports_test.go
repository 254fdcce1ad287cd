package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/relay"
)

// One flag, one port: each command pointed at the other kind of port says
// so in one line and exits 1 at once (wait does not retry until its
// timeout), without the other protocol's bytes; --server still names the
// admin endpoint of the admin commands, with a warning.
func TestWrongPort(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "listener.yaml"), listenerFile("10001"))
	r := startFileRelay(t, dir, func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })
	xdsPort, admin := r.Addr(), r.AdminAddr()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"admin at the xDS port", []string{"admin", "--admin", xdsPort, "/readyz"},
			"--admin " + xdsPort + ": it answers in gRPC (HTTP/2), as the relay's xDS port does"},
		{"groups at the xDS port", []string{"groups", "--admin", xdsPort}, "as the relay's xDS port does"},
		{"guard release at the xDS port", []string{"guard", "release", "--admin", xdsPort}, "as the relay's xDS port does"},
		// With a minute to wait, only stopping at once passes within the
		// test's bound (runCLI's caller has cliWait).
		{"wait at the xDS port", []string{"wait", "--admin", xdsPort, "--type", "clusters", "--timeout", "1m"},
			"--admin " + xdsPort + ": it answers in gRPC (HTTP/2)"},
		{"status --summary at the xDS port", []string{"status", "--summary", "--admin", xdsPort}, "as the relay's xDS port does"},
		{"status at the admin endpoint", []string{"status", "--server", admin},
			"--server " + admin + ": it answers in HTTP/1.1, as the relay's admin endpoint does (admin.address, 127.0.0.1:9901 by default), not the xDS port"},
		{"watch at the admin endpoint", []string{"watch", "--server", admin, "--node-id", "n", "--type", "lds"},
			"--server " + admin + ": it answers in HTTP/1.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(tc.args...)
			if code != 1 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
				t.Errorf("exit %d, stdout %q, stderr %q; want 1 and one line with %q", code, out, errOut, tc.want)
			}
			for _, raw := range []string{`\x00`, "malformed", "frame too large", "Unavailable"} {
				if strings.Contains(errOut, raw) {
					t.Errorf("stderr %q shows %q", errOut, raw)
				}
			}
		})
	}

	// Each admin command still takes --server, and says it is deprecated.
	code, out, errOut := runCLI("admin", "--server", admin, "/readyz")
	if code != 0 || !strings.HasPrefix(out, "ready") || !strings.Contains(errOut, "--server is deprecated here: name the admin endpoint with --admin") {
		t.Errorf("admin --server ADMIN: exit %d, %q, %q", code, out, errOut)
	}
	code, _, errOut = runCLI("status", "--summary", "--server", admin)
	if code != 0 || !strings.Contains(errOut, "--server is deprecated here") {
		t.Errorf("status --summary --server ADMIN: exit %d, %q", code, errOut)
	}
}

// Over TLS too: an admin command with TLS flags at an xDS port over TLS
// (which offers only HTTP/2) is told so, not a handshake error.
func TestWrongPortTLS(t *testing.T) {
	certs := testcp.MakeCerts(t)
	r := startFileRelay(t, t.TempDir(), func(c *relay.Config) {
		c.Downstream.TLS.CertFile, c.Downstream.TLS.KeyFile = certs.ServerCert, certs.ServerKey
	})
	code, _, errOut := runCLI("admin", "--admin", r.Addr(), "--ca-file", certs.CA, "--server-name", "localhost", "/readyz")
	if code != 1 || !strings.Contains(errOut, "as the relay's xDS port does") {
		t.Errorf("admin over TLS at the xDS port: exit %d, %q", code, errOut)
	}
}

// The REST-JSON port is told apart from the admin endpoint, both HTTP/1.1:
// a command of the admin endpoint pointed at it, or a client command
// (gRPC) pointed at it, names it as the REST-JSON port; a command that
// never took --server (groups, config-dump, the lists) refuses it as any
// unknown flag, and the deprecation warning of the others has one prefix.
func TestWrongPortREST(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "listener.yaml"), listenerFile("10001"))
	r := startFileRelay(t, dir, func(c *relay.Config) {
		c.Admin.Address = "127.0.0.1:0"
		c.Downstream.RESTAddress = "127.0.0.1:0"
	})
	rest := r.RESTAddr()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"groups at the REST port", []string{"groups", "--admin", rest}, "--admin " + rest + ": it answers as the relay's REST-JSON port does (downstream.rest_address), not the admin endpoint"},
		{"admin at the REST port", []string{"admin", "--admin", rest, "/readyz"}, "as the relay's REST-JSON port does"},
		{"wait at the REST port", []string{"wait", "--admin", rest, "--type", "clusters", "--timeout", "1m"}, "as the relay's REST-JSON port does"},
		{"status at the REST port", []string{"status", "--server", rest}, "--server " + rest + ": it answers in HTTP/1.1, as the relay's REST-JSON port does (downstream.rest_address), not the xDS port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(tc.args...)
			if code != 1 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || strings.Count(errOut, rest) != 1 {
				t.Errorf("exit %d, stdout %q, stderr %q; want 1 and one line with %q, naming the address once", code, out, errOut, tc.want)
			}
		})
	}
	for _, args := range [][]string{{"groups"}, {"config-dump", "--node", "n"}, {"guard", "list"}, {"rollout", "list"}} {
		if code, _, errOut := runCLI(append(args, "--server", r.AdminAddr())...); code != 2 || !strings.Contains(errOut, "unknown flag: --server") {
			t.Errorf("%q --server: exit %d, %q; want 2, an unknown flag", args, code, errOut)
		}
	}
	if _, _, errOut := runCLI("guard", "release", "--server", r.AdminAddr()); !strings.HasPrefix(errOut, "xdsrelay guard release: --server is deprecated here") {
		t.Errorf("guard release --server: %q; want one prefix", errOut)
	}
}

package relay

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// wantWarning fails the test unless the relay warned about key, naming doc,
// a document of the repository and a heading in it: one log line at warn,
// the gauge at 1, and a line in the /readyz details.
func wantWarning(t *testing.T, r *Relay, log *logBuffer, key, doc string) {
	t.Helper()
	var warned []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		l := map[string]any{}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if l["key"] == key {
			warned = append(warned, l)
		}
	}
	if len(warned) != 1 || warned[0]["level"] != "WARN" || warned[0]["doc"] != doc ||
		!strings.HasPrefix(warned[0]["msg"].(string), key+" ") {
		t.Errorf("logged %v, want one warning naming %s and %q", warned, key, doc)
	}
	file, anchor, _ := strings.Cut(doc, "#")
	if b, err := os.ReadFile(filepath.Join("..", file)); err != nil || !hasHeading(string(b), anchor) {
		t.Errorf("the warning names %s: no such document and heading (%v)", doc, err)
	}
	if m := `xdsrelay_config_warnings{key="` + key + `"} 1`; !strings.Contains(getMetrics(t, r), m+"\n") {
		t.Errorf("/metrics has no %s", m)
	}
	var detail bytes.Buffer
	r.readyDetail(&detail)
	if want := "(see " + doc + ")"; !slices.ContainsFunc(strings.Split(detail.String(), "\n"), func(l string) bool {
		return strings.HasPrefix(l, "warning: "+key+" ") && strings.HasSuffix(l, want)
	}) {
		t.Errorf("/readyz details %q: no warning about %s", detail.String(), key)
	}
}

// mode: allow-all with mTLS starts, admits a certificate to any node, and is
// warned about: log, xdsrelay_config_warnings and the private /readyz.
func TestAllowAllIsWarnedAbout(t *testing.T) {
	log := &logBuffer{}
	ca := newTestCA(t)
	cp := testcp.Start(t)
	cp.Set(t, "tenant-b", "1", testcp.Cluster("b-secret"))
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(log, nil)), func(c *Config) {
		c.Downstream.TLS.CertFile, c.Downstream.TLS.KeyFile = ca.serverCert, ca.serverKey
		c.Downstream.TLS.CAFile = ca.file
		c.Downstream.Authorization.Mode = AuthorizationAllowAll
	})
	cc := ca.dialAs(r.Addr(), ca.client("spiffe://example.org/tenant/a"))
	s := newStream(t, discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources)
	s.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("a-1", "tenant-b")}))
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"b-secret"}) {
		t.Fatalf("tenant-a's certificate claiming tenant-b under allow-all: %v", got)
	}
	wantWarning(t, r, log, "downstream.authorization.mode", "docs/protection.md#tenant-isolation")
	code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz") // loopback: private
	if code != http.StatusOK || !strings.Contains(body, "warning: downstream.authorization.mode is allow-all") {
		t.Errorf("private /readyz: %d %q", code, body)
	}
	if strings.Contains(getMetrics(t, r), `xdsrelay_config_warnings{key="admin.address"} 1`) {
		t.Error("a loopback admin.address was warned about")
	}
}

// An admin endpoint on an address that is not loopback, without admin.tls,
// is warned about; with admin.tls it is not.
func TestOpenAdminIsWarnedAbout(t *testing.T) {
	public := publicAdmin(t)
	t.Run("plaintext", func(t *testing.T) {
		log := &logBuffer{}
		r := startRelayLogged(t, testcp.Start(t).Addr, slog.New(slog.NewJSONHandler(log, nil)), public)
		wantWarning(t, r, log, "admin.address", "docs/operations.md#admin-exposure")
		code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/readyz")
		if code != http.StatusOK || strings.Contains(body, "warning") {
			t.Errorf("public /readyz: %d %q, want the general answer", code, body)
		}
	})
	t.Run("admin.tls", func(t *testing.T) {
		certs := testcp.MakeCerts(t)
		r := startRelay(t, testcp.Start(t).Addr, public, func(c *Config) {
			c.Admin.TLS.CertFile, c.Admin.TLS.KeyFile = certs.ServerCert, certs.ServerKey
		})
		var detail bytes.Buffer
		r.readyDetail(&detail)
		if strings.Contains(detail.String(), "warning") {
			t.Errorf("warned with admin.tls: %q", detail.String())
		}
	})
}

// upstream.tls.insecure_skip_verify is warned about as the other choices
// are: log, xdsrelay_config_warnings and the private /readyz; a control
// plane whose certificate the relay does verify is not.
func TestInsecureUpstreamIsWarnedAbout(t *testing.T) {
	log := &logBuffer{}
	r := startRelayLogged(t, testcp.Start(t).Addr, slog.New(slog.NewJSONHandler(log, nil)), func(c *Config) {
		c.Upstream.TLS.Insecure = true
	})
	wantWarning(t, r, log, "upstream.tls.insecure_skip_verify", "docs/control-planes.md#relaying-a-control-plane")

	certs := testcp.MakeCerts(t)
	verified := startRelay(t, testcp.Start(t).Addr, func(c *Config) { c.Upstream.TLS.CAFile = certs.CA })
	var detail bytes.Buffer
	verified.readyDetail(&detail)
	if strings.Contains(detail.String(), "warning") {
		t.Errorf("warned with a verified control plane: %q", detail.String())
	}
}

// hasHeading reports whether Markdown text has a heading whose anchor, as
// GitHub makes it (lower case, punctuation dropped, spaces made hyphens), is
// anchor; an empty anchor is the document itself.
func hasHeading(text, anchor string) bool {
	if anchor == "" {
		return true
	}
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		h = strings.ReplaceAll(strings.Map(func(r rune) rune {
			if r == ' ' || r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) {
				return r
			}
			return -1
		}, h), " ", "-")
		if h == anchor {
			return true
		}
	}
	return false
}

package relay

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clustersvc "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// testCA issues the certificates of one test: the relay's server certificate
// (files, as the configuration takes them) and client certificates with the
// identities a test needs.
type testCA struct {
	t                     *testing.T
	cert                  *x509.Certificate
	key                   *ecdsa.PrivateKey
	pool                  *x509.CertPool
	file                  string // the CA, PEM
	serverCert, serverKey string // files
	serial                int64
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tenant CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{t: t, key: key, pool: x509.NewCertPool(), serial: 1}
	ca.cert, _ = x509.ParseCertificate(der)
	ca.pool.AddCert(ca.cert)
	dir := t.TempDir()
	ca.file = writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", der)
	server := ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: "relay"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	kder, _ := x509.MarshalECPrivateKey(server.PrivateKey.(*ecdsa.PrivateKey))
	ca.serverCert = writePEM(t, filepath.Join(dir, "server.crt"), "CERTIFICATE", server.Certificate[0])
	ca.serverKey = writePEM(t, filepath.Join(dir, "server.key"), "EC PRIVATE KEY", kder)
	return ca
}

func writePEM(t *testing.T, path, typ string, der []byte) string {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue signs tmpl (its subject, SANs and usage) with a fresh key.
func (ca *testCA) issue(tmpl *x509.Certificate) tls.Certificate {
	ca.t.Helper()
	ca.serial++
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl.SerialNumber = big.NewInt(ca.serial)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// client returns a client certificate whose URI SAN is spiffeID.
func (ca *testCA) client(spiffeID string) tls.Certificate {
	ca.t.Helper()
	u, err := url.Parse(spiffeID)
	if err != nil {
		ca.t.Fatal(err)
	}
	return ca.issue(&x509.Certificate{Subject: pkix.Name{CommonName: "workload"}, URIs: []*url.URL{u},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

func (ca *testCA) clientTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{cert}}
}

// dialAs connects to the relay over mTLS with cert.
func (ca *testCA) dialAs(addr string, cert tls.Certificate) *grpc.ClientConn {
	ca.t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(ca.clientTLS(cert))))
	if err != nil {
		ca.t.Fatal(err)
	}
	ca.t.Cleanup(func() { cc.Close() })
	return cc
}

// tenantRule lets spiffe://example.org/tenant/X claim the nodes of cluster
// tenant-X only.
var tenantRule = AuthorizationRule{Identity: "spiffe://example.org/tenant/{tenant}", Node: map[string]string{"cluster": "tenant-{tenant}"}}

// startTenantRelay runs a relay with mTLS and tenantRule, REST-JSON on, in
// front of a control plane holding a cluster for each of tenant-a and
// tenant-b.
func startTenantRelay(t *testing.T) (*Relay, *testcp.ControlPlane, *testCA) {
	return startTenantRelayLogged(t, testLogger())
}

// startTenantRelayLogged is startTenantRelay with its log going to logger,
// and the configuration changed by mutate.
func startTenantRelayLogged(t *testing.T, logger *slog.Logger, mutate ...func(*Config)) (*Relay, *testcp.ControlPlane, *testCA) {
	t.Helper()
	ca := newTestCA(t)
	cp := testcp.Start(t)
	cp.Set(t, "tenant-a", "1", testcp.Cluster("a-service"))
	cp.Set(t, "tenant-b", "1", testcp.Cluster("b-secret"))
	tenant := func(cfg *Config) {
		cfg.Downstream.RESTAddress = "127.0.0.1:0"
		cfg.Downstream.TLS.CertFile, cfg.Downstream.TLS.KeyFile = ca.serverCert, ca.serverKey
		cfg.Downstream.TLS.CAFile = ca.file
		cfg.Downstream.PollTimeout = time.Second
		cfg.Downstream.Authorization.Rules = []AuthorizationRule{tenantRule}
	}
	r := startRelayLogged(t, cp.Addr, logger, append([]func(*Config){tenant}, mutate...)...)
	return r, cp, ca
}

// firstReply sends req on a new stream and returns the stream's first
// answer: nil for a response, else the error that ended the stream.
func firstReply[Req, Resp any](t *testing.T, open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error), req *Req) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := open(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(req); err != nil && err != io.EOF {
		return err
	}
	_, err = st.Recv()
	return err
}

// A client holding tenant-a's certificate is served tenant-a's nodes, and
// refused tenant-b's on every gRPC variant, with PERMISSION_DENIED naming
// its identity and the field; no group, so no upstream stream, is ever made
// for tenant-b.
func TestAuthorizationBindsNodesToCertificates(t *testing.T) {
	r, cp, ca := startTenantRelay(t)
	tenantA := ca.client("spiffe://example.org/tenant/a")
	cc := ca.dialAs(r.Addr(), tenantA)
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)

	own := newStream(t, ads.DeltaAggregatedResources)
	own.send(&discoverypb.DeltaDiscoveryRequest{Node: node("a-1", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	if got := deltaNames(own.recv()); !slices.Equal(got, []string{"a-service"}) {
		t.Fatalf("tenant-a's own node was served %v", got)
	}

	claimB := node("a-1", "tenant-b")
	cds := clustersvc.NewClusterDiscoveryServiceClient(cc)
	variants := map[string]func() error{
		"sotw-ads": func() error {
			return firstReply(t, ads.StreamAggregatedResources, &discoverypb.DiscoveryRequest{Node: claimB, TypeUrl: resourcev3.ClusterType})
		},
		"delta-ads": func() error {
			return firstReply(t, ads.DeltaAggregatedResources, &discoverypb.DeltaDiscoveryRequest{Node: claimB, TypeUrl: resourcev3.ClusterType})
		},
		"sotw": func() error {
			return firstReply(t, cds.StreamClusters, &discoverypb.DiscoveryRequest{Node: claimB})
		},
		"delta": func() error {
			return firstReply(t, cds.DeltaClusters, &discoverypb.DeltaDiscoveryRequest{Node: claimB})
		},
		"fetch": func() error {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			_, err := cds.FetchClusters(ctx, &discoverypb.DiscoveryRequest{Node: claimB})
			return err
		},
	}
	want := `xdsrelay: identity "spiffe://example.org/tenant/a" may not claim node cluster "tenant-b" (rules[0] wants "tenant-a")`
	for variant, claim := range variants {
		err := claim()
		if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != want {
			t.Errorf("%s: %v, want PERMISSION_DENIED %q", variant, err, want)
		}
	}

	if r.groupCache(keyOf("tenant-b")) != nil {
		t.Error("a denied client created a group for tenant-b")
	}
	for _, n := range cp.Nodes() {
		if n.GetCluster() == "tenant-b" {
			t.Errorf("the control plane saw a stream for tenant-b: %v", n)
		}
	}
	m := getMetrics(t, r)
	for variant := range variants {
		if line := `xdsrelay_downstream_denied_total{reason="node",variant="` + variant + `"} 1`; !strings.Contains(m, line) {
			t.Errorf("/metrics lacks %s:\n%s", line, m)
		}
	}
}

// A certificate that no rule matches is refused whatever node it claims.
func TestAuthorizationRefusesUnknownIdentity(t *testing.T) {
	r, _, ca := startTenantRelay(t)
	stranger := ca.client("spiffe://other.org/tenant/a")
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(ca.dialAs(r.Addr(), stranger))
	err := firstReply(t, ads.DeltaAggregatedResources, &discoverypb.DeltaDiscoveryRequest{Node: node("x", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	want := `xdsrelay: no rule matches identities "spiffe://other.org/tenant/a", "workload"`
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != want {
		t.Fatalf("%v, want PERMISSION_DENIED %q", err, want)
	}
	if m := getMetrics(t, r); !strings.Contains(m, `xdsrelay_downstream_denied_total{reason="identity",variant="delta-ads"} 1`) {
		t.Errorf("/metrics does not count the denial:\n%s", m)
	}
	if r.groupCache(keyOf("tenant-a")) != nil {
		t.Error("a denied client created a group")
	}
}

// REST-JSON answers 403 to a node the certificate may not claim, and serves
// the ones it may.
func TestAuthorizationREST(t *testing.T) {
	r, _, ca := startTenantRelay(t)
	hc := &http.Client{Timeout: wait, Transport: &http.Transport{TLSClientConfig: ca.clientTLS(ca.client("spiffe://example.org/tenant/a"))}}
	t.Cleanup(hc.CloseIdleConnections)
	poll := func(cluster string) (int, string) {
		t.Helper()
		body, _ := protojson.Marshal(&discoverypb.DiscoveryRequest{Node: node("a-1", cluster)})
		resp, err := hc.Post("https://"+r.RESTAddr()+"/v3/discovery:clusters", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := poll("tenant-b")
	want := `xdsrelay: identity "spiffe://example.org/tenant/a" may not claim node cluster "tenant-b" (rules[0] wants "tenant-a")`
	if code != http.StatusForbidden || strings.TrimSpace(body) != want {
		t.Errorf("claiming tenant-b: %d %q, want 403 %q", code, body, want)
	}
	if r.groupCache(keyOf("tenant-b")) != nil {
		t.Error("a denied REST client created a group for tenant-b")
	}
	if m := getMetrics(t, r); !strings.Contains(m, `xdsrelay_downstream_denied_total{reason="node",variant="rest"} 1`) {
		t.Errorf("/metrics does not count the denial:\n%s", m)
	}
	if code, body := poll("tenant-a"); code != http.StatusOK || !strings.Contains(body, "a-service") {
		t.Errorf("claiming tenant-a: %d %s", code, body)
	}
}

// Rules need client certificates, client certificates need rules (or
// mode: allow-all), and malformed rules stop the relay at startup with an
// error naming the key.
func TestAuthorizationConfigErrors(t *testing.T) {
	ca := newTestCA(t)
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"no client_ca_file", func(c *Config) {
			c.Downstream.TLS.CertFile, c.Downstream.TLS.KeyFile = ca.serverCert, ca.serverKey
			c.Downstream.Authorization.Rules = []AuthorizationRule{tenantRule}
		}, "downstream.authorization.rules: require downstream.tls.client_ca_file (mTLS)"},
		{"no TLS at all", func(c *Config) {
			c.Downstream.TLS.CertFile, c.Downstream.TLS.KeyFile = "", ""
			c.Downstream.Authorization.Rules = []AuthorizationRule{tenantRule}
		}, "client_ca_file"},
		{"unknown node field", func(c *Config) {
			c.Downstream.TLS.CAFile = ca.file
			c.Downstream.Authorization.Rules = []AuthorizationRule{{Identity: "x", Node: map[string]string{"foo": "y"}}}
		}, "downstream.authorization.rules[0].node.foo: unknown node field"},
		{"undefined capture", func(c *Config) {
			c.Downstream.TLS.CAFile = ca.file
			c.Downstream.Authorization.Rules = []AuthorizationRule{tenantRule, {Identity: "spiffe://x/{a}", Node: map[string]string{"cluster": "{b}"}}}
		}, "downstream.authorization.rules[1].node.cluster"},
		{"unbalanced braces", func(c *Config) {
			c.Downstream.TLS.CAFile = ca.file
			c.Downstream.Authorization.Rules = []AuthorizationRule{{Identity: "spiffe://x/{a"}}
		}, "downstream.authorization.rules[0].identity"},
		{"empty identity", func(c *Config) {
			c.Downstream.TLS.CAFile = ca.file
			c.Downstream.Authorization.Rules = []AuthorizationRule{{Node: map[string]string{"cluster": "a"}}}
		}, "downstream.authorization.rules[0].identity: empty"},
		{"mTLS without rules", func(c *Config) {
			c.Downstream.TLS.CAFile = ca.file
		}, "downstream.authorization.rules: none, with downstream.tls.client_ca_file set: any client certificate could claim any node; " +
			"add downstream.authorization.rules, or set downstream.authorization.mode: allow-all"},
		{"allow-all with rules", func(c *Config) {
			c.Downstream.TLS.CAFile = ca.file
			c.Downstream.Authorization.Mode = AuthorizationAllowAll
			c.Downstream.Authorization.Rules = []AuthorizationRule{tenantRule}
		}, "downstream.authorization.mode: allow-all admits every node, yet downstream.authorization.rules lists 1"},
		{"unknown mode", func(c *Config) {
			c.Downstream.Authorization.Mode = "none"
		}, `downstream.authorization.mode: "none" is neither rules nor allow-all`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			cfg.Downstream.TLS.CertFile, cfg.Downstream.TLS.KeyFile = ca.serverCert, ca.serverKey
			tc.mutate(&cfg)
			_, err := New(cfg, testLogger())
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
			}
		})
	}
}

// A denial is logged at warn as a stream ended with an error; a rule that
// leaves a group_by field open is reported at startup.
func TestAuthorizationLogs(t *testing.T) {
	log := &logBuffer{}
	logger := slog.New(slog.NewJSONHandler(log, nil))
	r, _, ca := startTenantRelayLogged(t, logger, func(c *Config) {
		c.Upstream.GroupBy = []string{"cluster", "locality.zone"}
	})
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(ca.dialAs(r.Addr(), ca.client("spiffe://example.org/tenant/a")))
	err := firstReply(t, ads.StreamAggregatedResources, &discoverypb.DiscoveryRequest{Node: node("a-1", "tenant-b"), TypeUrl: resourcev3.ClusterType})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("claiming tenant-b: %v", err)
	}
	var ended []map[string]any
	eventually(t, "the denial in the log", func() bool {
		ended = log.Lines(t, "stream ended with an error")
		return len(ended) > 0
	})
	if l := ended[0]; l["level"] != "WARN" || l["code"] != "PermissionDenied" || l["node"] != "a-1" ||
		!strings.Contains(l["message"].(string), `identity "spiffe://example.org/tenant/a"`) {
		t.Errorf("logged %v", l)
	}
	open := log.Lines(t, "an authorization rule leaves a group_by field open: the clients it admits may join any group")
	if len(open) != 1 || open[0]["field"] != "locality.zone" || open[0]["rule"] != "downstream.authorization.rules[0]" {
		t.Errorf("startup warnings %v", open)
	}
}

// A rule's authorities bound the xdstp names its clients may ask for: a
// name of another authority is refused with PERMISSION_DENIED for that
// name alone (gRFC A88), on every stream variant, and never asked of a
// control plane; the client's other names are served; a poll asking for
// one is refused whole.
func TestAuthorizationRefusesOtherAuthorities(t *testing.T) {
	own := "xdstp://a.example.com/envoy.config.cluster.v3.Cluster/mine"
	other := "xdstp://b.example.com/envoy.config.cluster.v3.Cluster/theirs"
	r, cp, ca := startTenantRelayLogged(t, testLogger(), func(c *Config) {
		rule := tenantRule
		rule.Authorities = []string{"{tenant}.example.com"}
		c.Downstream.Authorization.Rules = []AuthorizationRule{rule}
		c.Upstream.Authorities = []string{"a.example.com", "b.example.com"}
	})
	cp.Set(t, "tenant-a", "2", testcp.Cluster("a-service"), testcp.Cluster(own), testcp.Cluster(other))
	cc := ca.dialAs(r.Addr(), ca.client("spiffe://example.org/tenant/a"))
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)

	d := newStream(t, ads.DeltaAggregatedResources)
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("a-1", "tenant-a"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{own, other}})
	deltaUntil(t, d, other, wait, func(got, _ []string, errs map[string]codes.Code) bool {
		if slices.Contains(got, other) {
			t.Fatalf("the client was sent %s", other)
		}
		return slices.Contains(got, own) && errs[other] == codes.PermissionDenied
	})

	// SotW, answered before: the error comes with the complete state.
	s := newStream(t, ads.StreamAggregatedResources)
	s.send(&discoverypb.DiscoveryRequest{Node: node("a-2", "tenant-a"), TypeUrl: resourcev3.ClusterType, ResourceNames: []string{own}})
	first := s.recv()
	s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNames: []string{own, other},
		VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()})
	resp := s.recv()
	if names := resourceNames(t, resp); !slices.Equal(names, []string{own}) || len(resp.GetResourceErrors()) != 1 ||
		resp.GetResourceErrors()[0].GetErrorDetail().GetCode() != int32(codes.PermissionDenied) {
		t.Fatalf("SotW client got %v with errors %v", names, resp.GetResourceErrors())
	}

	// A poll asking for it is refused whole.
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := clustersvc.NewClusterDiscoveryServiceClient(cc).FetchClusters(ctx,
		&discoverypb.DiscoveryRequest{Node: node("a-3", "tenant-a"), ResourceNames: []string{other}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("poll: %v, want PERMISSION_DENIED", err)
	}
	for _, n := range upstreamSubscriptions(cp) {
		if strings.HasSuffix(n, other) {
			t.Errorf("the control plane was asked for %s", other)
		}
	}
}

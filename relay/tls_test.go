package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

func pool(t *testing.T, caFile string) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(pem)
	return p
}

// Secure links: mTLS to the control plane (which requires the relay's
// client certificate and sees its configured headers), and mTLS for
// downstream clients (a client without a certificate is refused).
func TestMutualTLSBothWays(t *testing.T) {
	certs := testcp.MakeCerts(t)
	serverCert, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	var sawToken atomic.Bool
	cp := testcp.StartWith(t,
		grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{serverCert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    pool(t, certs.CA),
		})),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			md, _ := metadata.FromIncomingContext(ss.Context())
			sawToken.Store(slices.Contains(md.Get("authorization"), "Bearer relay-token"))
			return h(srv, ss)
		}),
	)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Upstream.TLS.CAFile = certs.CA
		c.Upstream.TLS.CertFile, c.Upstream.TLS.KeyFile = certs.ClientCert, certs.ClientKey
		c.Upstream.Headers = map[string]string{"authorization": "Bearer relay-token"}
		c.Downstream.TLS.CertFile, c.Downstream.TLS.KeyFile = certs.ServerCert, certs.ServerKey
		c.Downstream.TLS.CAFile = certs.CA
		c.Downstream.Authorization.Mode = AuthorizationAllowAll // any certificate the CA signed may claim any node
	})

	clientCert, err := tls.LoadX509KeyPair(certs.ClientCert, certs.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	dialTLS := func(cfg *tls.Config) discoverypb.AggregatedDiscoveryServiceClient {
		cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return discoverypb.NewAggregatedDiscoveryServiceClient(cc)
	}
	good := newStream(t, dialTLS(&tls.Config{RootCAs: pool(t, certs.CA), Certificates: []tls.Certificate{clientCert}}).DeltaAggregatedResources)
	good.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType})
	if got := deltaNames(good.recv()); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("over mTLS both ways: %v", got)
	}
	if !sawToken.Load() {
		t.Error("the control plane did not see upstream.headers")
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	anon, err := dialTLS(&tls.Config{RootCAs: pool(t, certs.CA)}).DeltaAggregatedResources(ctx)
	if err == nil {
		if err = anon.Send(&discoverypb.DeltaDiscoveryRequest{Node: node("anon", "c1"), TypeUrl: resourcev3.ClusterType}); err == nil {
			_, err = anon.Recv()
		}
	}
	if err == nil {
		t.Fatal("a client without a certificate was served")
	}
}

// A control plane that requires a client certificate the relay does not
// have ends the connection after the handshake: the relay's errors (the
// private /readyz, the group's upstream error) name what is missing and
// the keys that set it, not only "write: broken pipe".
func TestUpstreamRequiringClientCertificateIsExplained(t *testing.T) {
	certs := testcp.MakeCerts(t)
	serverCert, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cp := testcp.StartWith(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool(t, certs.CA),
	})))
	cp.Set(t, "tenant-a", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, fastReconnect, func(c *Config) {
		c.Upstream.TLS.CAFile = certs.CA
		c.Admin.ReadyAfterSync = true
	})
	const want = "the server asked for a client certificate and none is set (upstream.tls.cert_file and key_file); it may require one"
	eventually(t, "/readyz naming the missing client certificate", func() bool {
		return strings.Contains(r.notReadyLine(r.notReady(), true), want)
	})
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "tenant-a"), TypeUrl: resourcev3.ClusterType})
	eventually(t, "the group's upstream error naming the missing client certificate", func() bool {
		g := r.snapshotGroups()
		return len(g) == 1 && strings.Contains(g[0].feed.Status().LastError, want)
	})
}

package creds

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// wait bounds every wait in these tests.
const wait = 5 * time.Second

// ca is a certificate authority made for one test.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *ca {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &ca{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate for localhost and 127.0.0.1, and its key.
func (c *ca) issue(t *testing.T, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "xdsrelay test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// writeFile replaces path atomically, as a careful writer does.
func writeFile(t *testing.T, path string, data []byte) string {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// pair writes a certificate and key into dir and returns a TLS naming them.
func pair(t *testing.T, dir, name string, certPEM, keyPEM []byte) TLS {
	t.Helper()
	return TLS{
		CertFile: writeFile(t, filepath.Join(dir, name+".crt"), certPEM),
		KeyFile:  writeFile(t, filepath.Join(dir, name+".key"), keyPEM),
	}
}

// secret writes files as Kubernetes updates a mounted secret: into a new
// directory, made current by renaming a symlink over ..data, which the files
// point through.
type secret struct {
	dir string
	n   int
}

func (s *secret) write(t *testing.T, files map[string][]byte) {
	t.Helper()
	s.n++
	v := fmt.Sprintf("..v%d", s.n)
	if err := os.Mkdir(filepath.Join(s.dir, v), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(s.dir, v, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if s.n == 1 {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(s.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(s.dir, "..data_tmp")
	if err := os.Symlink(v, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

func reloader(t *testing.T, tl TLS, logger *slog.Logger) *Reloader {
	t.Helper()
	r, err := NewReloader(t.Context(), tl, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// server is a gRPC server with the health service; md receives the metadata
// of each unary RPC.
type server struct {
	addr string
	md   chan metadata.MD
}

func startServer(t *testing.T, creds credentials.TransportCredentials) *server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{addr: lis.Addr().String(), md: make(chan metadata.MD, 16)}
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		select {
		case s.md <- md:
		default:
		}
		return h(ctx, req)
	}
	gs := grpc.NewServer(grpc.Creds(creds), grpc.UnaryInterceptor(record))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return s
}

// check makes one health check over a new connection.
func check(addr string, creds credentials.TransportCredentials, opts ...grpc.DialOption) error {
	cc, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// eventually retries check until it succeeds or the wait is over.
func eventually(t *testing.T, addr string, creds credentials.TransportCredentials) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check(addr, creds)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("health check still fails after %v: %v", wait, err)
		case <-tick.C:
		}
	}
}

// logs is a slog handler that passes each message to a channel.
type logs chan string

func (l logs) Enabled(context.Context, slog.Level) bool { return true }
func (l logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l logs) WithGroup(string) slog.Handler            { return l }
func (l logs) Handle(_ context.Context, r slog.Record) error {
	select {
	case l <- r.Message:
	default:
	}
	return nil
}

func (l logs) drain() {
	for {
		select {
		case <-l:
		default:
			return
		}
	}
}

func (l logs) await(t *testing.T, substr string) {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case msg := <-l:
			if strings.Contains(msg, substr) {
				return
			}
		case <-timeout:
			t.Fatalf("no log %q after %v", substr, wait)
		}
	}
}

func TestGRPC(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, otherCA := newCA(t, "server CA"), newCA(t, "client CA"), newCA(t, "other CA")
	srvCert, srvKey := serverCA.issue(t, x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := clientCA.issue(t, x509.ExtKeyUsageClientAuth)
	otherCert, otherKey := otherCA.issue(t, x509.ExtKeyUsageClientAuth)
	serverCAFile := writeFile(t, filepath.Join(dir, "server-ca.crt"), serverCA.pem)
	clientCAFile := writeFile(t, filepath.Join(dir, "client-ca.crt"), clientCA.pem)
	otherCAFile := writeFile(t, filepath.Join(dir, "other-ca.crt"), otherCA.pem)

	tlsOnly := pair(t, dir, "server", srvCert, srvKey)
	mtls := tlsOnly
	mtls.CAFile = clientCAFile
	withCert := func(certPEM, keyPEM []byte, name string) TLS {
		tl := pair(t, dir, name, certPEM, keyPEM)
		tl.CAFile = serverCAFile
		return tl
	}
	for _, tc := range []struct {
		name           string
		server, client TLS
		ok             bool
	}{
		{name: "TLS", server: tlsOnly, client: TLS{CAFile: serverCAFile}, ok: true},
		{name: "TLS, client trusts another CA", server: tlsOnly, client: TLS{CAFile: otherCAFile}},
		{name: "TLS, client skips verification", server: tlsOnly, client: TLS{Insecure: true}, ok: true},
		{name: "TLS, server name override", server: tlsOnly, client: TLS{CAFile: serverCAFile, ServerName: "localhost"}, ok: true},
		{name: "TLS, wrong server name", server: tlsOnly, client: TLS{CAFile: serverCAFile, ServerName: "elsewhere.example"}},
		{name: "mTLS", server: mtls, client: withCert(cliCert, cliKey, "client"), ok: true},
		{name: "mTLS, client without certificate", server: mtls, client: TLS{CAFile: serverCAFile}},
		{name: "mTLS, client certificate from another CA", server: mtls, client: withCert(otherCert, otherKey, "other")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t, reloader(t, tc.server, nil).ServerCredentials())
			err := check(srv.addr, reloader(t, tc.client, nil).ClientCredentials("the test's cert_file and key_file"))
			switch {
			case tc.ok && err != nil:
				t.Fatalf("health check: %v", err)
			case !tc.ok && err == nil:
				t.Fatal("health check succeeded; want it refused")
			case !tc.ok:
				t.Logf("refused: %v", err)
			}
		})
	}
}

// handshake runs one TLS handshake between the configurations over loopback
// and returns both sides' errors.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	serverErr := make(chan error, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			serverErr <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(wait))
		serverErr <- c.(*tls.Conn).Handshake()
	}()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	d := tls.Dialer{Config: client}
	c, clientErr := d.DialContext(ctx, "tcp", lis.Addr().String())
	if clientErr == nil {
		c.Close()
	}
	return errors.Join(clientErr, <-serverErr)
}

func TestConfigs(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, otherCA := newCA(t, "server CA"), newCA(t, "client CA"), newCA(t, "other CA")
	srvCert, srvKey := serverCA.issue(t, x509.ExtKeyUsageServerAuth)
	cliCert, cliKey := clientCA.issue(t, x509.ExtKeyUsageClientAuth)
	serverCAFile := writeFile(t, filepath.Join(dir, "server-ca.crt"), serverCA.pem)
	tlsOnly := pair(t, dir, "server", srvCert, srvKey)
	mtls := tlsOnly
	mtls.CAFile = writeFile(t, filepath.Join(dir, "client-ca.crt"), clientCA.pem)
	withCert := pair(t, dir, "client", cliCert, cliKey)
	withCert.CAFile, withCert.ServerName = serverCAFile, "localhost"

	for _, tc := range []struct {
		name           string
		server, client TLS
		ok             bool
	}{
		{name: "server name", server: tlsOnly, client: TLS{CAFile: serverCAFile, ServerName: "localhost"}, ok: true},
		{name: "IP address without server name", server: tlsOnly, client: TLS{CAFile: serverCAFile}},
		{name: "wrong server name", server: tlsOnly, client: TLS{CAFile: serverCAFile, ServerName: "elsewhere.example"}},
		{name: "another CA", server: tlsOnly, client: TLS{CAFile: writeFile(t, filepath.Join(dir, "other-ca.crt"), otherCA.pem), ServerName: "localhost"}},
		{name: "insecure", server: tlsOnly, client: TLS{Insecure: true}, ok: true},
		{name: "mTLS", server: mtls, client: withCert, ok: true},
		{name: "mTLS without client certificate", server: mtls, client: TLS{CAFile: serverCAFile, ServerName: "localhost"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := handshake(t, reloader(t, tc.server, nil).ServerConfig(), reloader(t, tc.client, nil).ClientConfig())
			switch {
			case tc.ok && err != nil:
				t.Fatalf("handshake: %v", err)
			case !tc.ok && err == nil:
				t.Fatal("handshake succeeded; want it refused")
			case !tc.ok:
				t.Logf("refused: %v", err)
			}
		})
	}
}

func TestServerReload(t *testing.T) {
	dir, caDir := t.TempDir(), t.TempDir()
	oldCA, newCA := newCA(t, "old CA"), newCA(t, "new CA")
	oldCert, oldKey := oldCA.issue(t, x509.ExtKeyUsageServerAuth)
	newCert, newKey := newCA.issue(t, x509.ExtKeyUsageServerAuth)
	trustOld := reloader(t, TLS{CAFile: writeFile(t, filepath.Join(caDir, "old.crt"), oldCA.pem)}, nil).ClientCredentials("the test's cert_file and key_file")
	trustNew := reloader(t, TLS{CAFile: writeFile(t, filepath.Join(caDir, "new.crt"), newCA.pem)}, nil).ClientCredentials("the test's cert_file and key_file")

	s := &secret{dir: dir}
	s.write(t, map[string][]byte{"tls.crt": oldCert, "tls.key": oldKey})
	log := make(logs, 64)
	r := reloader(t, TLS{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}, slog.New(log))
	srv := startServer(t, r.ServerCredentials())
	if err := check(srv.addr, trustOld); err != nil {
		t.Fatalf("before the reload: %v", err)
	}

	s.write(t, map[string][]byte{"tls.crt": newCert, "tls.key": newKey})
	eventually(t, srv.addr, trustNew)
	if err := check(srv.addr, trustOld); err == nil {
		t.Fatal("after the reload, a client trusting only the old CA still connects")
	}

	log.drain()
	s.write(t, map[string][]byte{"tls.crt": []byte("not a certificate"), "tls.key": newKey})
	log.await(t, "do not load")
	if err := check(srv.addr, trustNew); err != nil {
		t.Fatalf("after a broken update: %v", err)
	}
}

func TestClientReload(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCA := newCA(t, "old CA"), newCA(t, "new CA")
	srvCert, srvKey := newCA.issue(t, x509.ExtKeyUsageServerAuth)
	srv := reloader(t, pair(t, dir, "server", srvCert, srvKey), nil)
	addr := startServer(t, srv.ServerCredentials()).addr

	caFile := writeFile(t, filepath.Join(t.TempDir(), "ca.crt"), oldCA.pem)
	log := make(logs, 64)
	r := reloader(t, TLS{CAFile: caFile, ServerName: "localhost"}, slog.New(log))
	creds, cfg := r.ClientCredentials("the test's cert_file and key_file"), r.ClientConfig()
	if err := check(addr, creds); err == nil {
		t.Fatal("a client trusting another CA connects")
	}

	writeFile(t, caFile, newCA.pem)
	eventually(t, addr, creds)
	if err := handshake(t, srv.ServerConfig(), cfg); err != nil {
		t.Fatalf("ClientConfig after the reload: %v", err)
	}
}

func TestNewReloaderErrors(t *testing.T) {
	dir := t.TempDir()
	c := newCA(t, "CA")
	certPEM, keyPEM := c.issue(t, x509.ExtKeyUsageServerAuth)
	_, otherKey := c.issue(t, x509.ExtKeyUsageServerAuth)
	good := pair(t, dir, "good", certPEM, keyPEM)
	garbage := writeFile(t, filepath.Join(dir, "garbage.pem"), []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"))
	text := writeFile(t, filepath.Join(dir, "text.pem"), []byte("hello\n"))
	otherKeyFile := writeFile(t, filepath.Join(dir, "other.key"), otherKey)
	missing := filepath.Join(dir, "missing.pem")

	for _, tc := range []struct {
		name string
		tls  TLS
		want []string // in the error
	}{
		{name: "nothing", tls: TLS{}, want: []string{"no TLS settings"}},
		{name: "certificate without key", tls: TLS{CertFile: good.CertFile}, want: []string{"go together"}},
		{name: "insecure with a CA", tls: TLS{Insecure: true, CAFile: good.CertFile}, want: []string{"insecure"}},
		{name: "missing certificate", tls: TLS{CertFile: missing, KeyFile: good.KeyFile}, want: []string{missing}},
		{name: "missing key", tls: TLS{CertFile: good.CertFile, KeyFile: missing}, want: []string{missing}},
		{name: "missing CA", tls: TLS{CAFile: missing}, want: []string{missing}},
		{name: "certificate not PEM", tls: TLS{CertFile: text, KeyFile: good.KeyFile}, want: []string{text, "no PEM certificate"}},
		{name: "certificate garbled", tls: TLS{CertFile: garbage, KeyFile: good.KeyFile}, want: []string{garbage}},
		{name: "key not PEM", tls: TLS{CertFile: good.CertFile, KeyFile: text}, want: []string{text, "no PEM private key"}},
		{name: "key not matching", tls: TLS{CertFile: good.CertFile, KeyFile: otherKeyFile}, want: []string{otherKeyFile, good.CertFile, "does not match"}},
		{name: "CA not PEM", tls: TLS{CAFile: text}, want: []string{text}},
		{name: "CA garbled", tls: TLS{CAFile: garbage}, want: []string{garbage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewReloader(t.Context(), tc.tls, nil)
			if err == nil {
				r.Close()
				t.Fatal("NewReloader succeeded; want an error")
			}
			t.Log(err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestHeaders(t *testing.T) {
	dir := t.TempDir()
	c := newCA(t, "CA")
	certPEM, keyPEM := c.issue(t, x509.ExtKeyUsageServerAuth)
	srv := startServer(t, reloader(t, pair(t, dir, "server", certPEM, keyPEM), nil).ServerCredentials())
	creds := reloader(t, TLS{CAFile: writeFile(t, filepath.Join(dir, "ca.crt"), c.pem)}, nil).ClientCredentials("the test's cert_file and key_file")
	token := writeFile(t, filepath.Join(dir, "token"), []byte("Bearer one\n"))
	fromFile, err := HeadersFromFile("Authorization", token)
	if err != nil {
		t.Fatal(err)
	}

	got := func(t *testing.T, srv *server, creds credentials.TransportCredentials, rpc credentials.PerRPCCredentials, key string) string {
		t.Helper()
		if err := check(srv.addr, creds, grpc.WithPerRPCCredentials(rpc)); err != nil {
			t.Fatalf("health check: %v", err)
		}
		select {
		case md := <-srv.md:
			return strings.Join(md.Get(key), ",")
		case <-time.After(wait):
			t.Fatal("the server saw no RPC")
			return ""
		}
	}
	t.Run("static", func(t *testing.T) {
		h := Headers(map[string]string{"Authorization": "Bearer static", "x-tenant": "blue"})
		if v := got(t, srv, creds, h, "authorization"); v != "Bearer static" {
			t.Errorf("authorization = %q, want %q", v, "Bearer static")
		}
		if v := got(t, srv, creds, h, "x-tenant"); v != "blue" {
			t.Errorf("x-tenant = %q, want %q", v, "blue")
		}
	})
	t.Run("static without TLS", func(t *testing.T) {
		plain := startServer(t, insecure.NewCredentials())
		h := Headers(map[string]string{"authorization": "Bearer plain"})
		if v := got(t, plain, insecure.NewCredentials(), h, "authorization"); v != "Bearer plain" {
			t.Errorf("authorization = %q, want %q", v, "Bearer plain")
		}
	})
	t.Run("from a file", func(t *testing.T) {
		if v := got(t, srv, creds, fromFile, "authorization"); v != "Bearer one" {
			t.Errorf("authorization = %q, want %q", v, "Bearer one")
		}
		writeFile(t, token, []byte("Bearer two"))
		if v := got(t, srv, creds, fromFile, "authorization"); v != "Bearer two" {
			t.Errorf("after rotation, authorization = %q, want %q", v, "Bearer two")
		}
	})
	t.Run("missing file", func(t *testing.T) {
		missing := filepath.Join(dir, "missing")
		if _, err := HeadersFromFile("authorization", missing); err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("HeadersFromFile(missing) = %v, want an error naming %s", err, missing)
		}
	})
}

func TestCloseStopsWatching(t *testing.T) {
	dir := t.TempDir()
	c := newCA(t, "CA")
	certPEM, keyPEM := c.issue(t, x509.ExtKeyUsageServerAuth)
	ctx, cancel := context.WithCancel(t.Context())
	r, err := NewReloader(ctx, pair(t, dir, "server", certPEM, keyPEM), nil)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	r.Close() // waits for the watcher, which the cancelled context already stopped
	r.Close()
}

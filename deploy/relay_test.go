package deploy

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// wait bounds every wait on the relay, its control plane and its clients.
const wait = 20 * time.Second

const clusterType = "type.googleapis.com/envoy.config.cluster.v3.Cluster"

// relayProc is a running xdsrelay process.
type relayProc struct {
	downstream, admin string       // listen addresses, from its "relay serving" log line
	adminLocal        string       // admin.local_address's, from the same line; empty if not opened
	scheme            string       // of the admin endpoint: http or https
	client            *http.Client // for the admin endpoint

	mu  sync.Mutex
	log []string // its log lines; guarded by mu
}

// startRelay runs bin --config config (YAML, logging in JSON) until the
// test ends, and waits for /readyz on its admin endpoint (HTTPS, verified
// against ca).
func startRelay(t *testing.T, bin, config string, ca *x509.CertPool) *relayProc {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: wait, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS12}}}
	p := startProc(t, bin, file, nil, "https", client)
	p.waitReady(t)
	return p
}

// startProc runs bin --config file with env (KEY=value entries) added to
// the environment until the test ends, and waits for its "relay serving"
// log line (JSON: set log.format). Its admin endpoint is asked with client
// over scheme.
func startProc(t *testing.T, bin, file string, env []string, scheme string, client *http.Client) *relayProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config", file)
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second // then killed
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &relayProc{scheme: scheme, client: client}
	serving := make(chan struct{})
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		p.readLog(stderr, serving)
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait() // context.Canceled: the exit code is the process state's
		<-logged
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("the relay exited with code %d on SIGTERM, want 0 (%s)", code, cmd.ProcessState)
		}
		if tr, ok := p.client.Transport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
		if t.Failed() {
			t.Logf("relay log:\n%s", strings.Join(p.logLines(), "\n"))
		}
	})
	select {
	case <-serving:
	case <-logged:
		t.Fatal("the relay exited before serving")
	case <-time.After(wait):
		t.Fatal("the relay did not log \"relay serving\"")
	}
	return p
}

// readLog keeps the relay's log lines and takes its listen addresses from
// the "relay serving" line, then closes serving.
func (p *relayProc) readLog(r io.Reader, serving chan<- struct{}) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg        string `json:"msg"`
			Downstream string `json:"downstream"`
			Admin      string `json:"admin"`
			AdminLocal string `json:"admin_local"`
		}
		p.mu.Lock()
		p.log = append(p.log, sc.Text())
		p.mu.Unlock()
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "relay serving" && p.downstream == "" {
			p.downstream, p.admin, p.adminLocal = line.Downstream, loopbackFor(line.Admin), line.AdminLocal
			close(serving)
		}
	}
}

// loopbackFor is the address to reach a listener bound to addr: on all
// interfaces (0.0.0.0, [::]), its port on 127.0.0.1, as kubectl
// port-forward reaches a pod's port from inside it.
func loopbackFor(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !net.ParseIP(host).IsUnspecified() {
		return addr
	}
	return net.JoinHostPort("127.0.0.1", port)
}

func (p *relayProc) logLines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.log...)
}

func (p *relayProc) get(path string) (int, []byte, error) {
	resp, err := p.client.Get(p.scheme + "://" + p.admin + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func (p *relayProc) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		code, body, err := p.get("/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %s %v", code, body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scrape is one GET /metrics, by family name.
func (p *relayProc) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	code, body, err := p.get("/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return families
}

// makeCert writes a self-signed certificate for 127.0.0.1, valid for 30
// days, and its key; pool trusts it.
func makeCert(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "xdsrelay admin"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(30 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	for file, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// deadAddress is a loopback address that refuses connections.
func deadAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

type deltaStream = grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]

// controlPlane is a delta-ADS control plane played by the test: it reads
// the relay's requests and writes the responses, including those a real
// control plane should not send (names twice, mass removals).
type controlPlane struct {
	discoverypb.UnimplementedAggregatedDiscoveryServiceServer
	addr    string
	streams chan deltaStream
	stop    func() // ends it: the relay's stream fails, and reconnects fail
}

// startControlPlane serves on 127.0.0.1:0 until the test ends.
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	cp := &controlPlane{streams: make(chan deltaStream, 4)}
	srv := grpc.NewServer()
	discoverypb.RegisterAggregatedDiscoveryServiceServer(srv, cp)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp.addr = ln.Addr().String()
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	var once sync.Once
	cp.stop = func() { once.Do(func() { srv.Stop(); <-done }) }
	t.Cleanup(cp.stop)
	return cp
}

// DeltaAggregatedResources hands the stream to the test.
func (cp *controlPlane) DeltaAggregatedResources(st deltaStream) error {
	cp.streams <- st
	<-st.Context().Done()
	return nil
}

// cpStream is the relay's stream to the control plane.
type cpStream struct {
	st    deltaStream
	reqs  chan *discoverypb.DeltaDiscoveryRequest
	first *discoverypb.DeltaDiscoveryRequest // its first request, not read yet by recv
}

// stream waits for the relay's next stream that asks something: a stream
// that ends without a request is readiness asking the control plane's
// dialect before any group (admin.ready_after_sync), not a group's.
func (cp *controlPlane) stream(t *testing.T) *cpStream {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case st := <-cp.streams:
			s := &cpStream{st: st, reqs: make(chan *discoverypb.DeltaDiscoveryRequest, 100)}
			go func() {
				defer close(s.reqs)
				for {
					r, err := st.Recv()
					if err != nil {
						return
					}
					s.reqs <- r
				}
			}()
			select {
			case r, ok := <-s.reqs:
				if !ok {
					continue // readiness's question, answered by staying open
				}
				s.first = r
				return s
			case <-deadline:
			}
		case <-deadline:
		}
		t.Fatal("the relay opened no stream to the control plane that asked anything")
		return nil
	}
}

func (s *cpStream) recv(t *testing.T) *discoverypb.DeltaDiscoveryRequest {
	t.Helper()
	if r := s.first; r != nil {
		s.first = nil
		return r
	}
	select {
	case r, ok := <-s.reqs:
		if !ok {
			t.Fatal("the relay's stream to the control plane ended")
		}
		return r
	case <-time.After(wait):
		t.Fatal("no request from the relay")
	}
	return nil
}

// answer returns the relay's ACK or NACK of the response with nonce.
func (s *cpStream) answer(t *testing.T, nonce string) *discoverypb.DeltaDiscoveryRequest {
	t.Helper()
	for {
		if r := s.recv(t); r.GetResponseNonce() == nonce {
			return r
		}
	}
}

func (s *cpStream) send(t *testing.T, r *discoverypb.DeltaDiscoveryResponse) {
	t.Helper()
	if err := s.st.Send(r); err != nil {
		t.Fatal(err)
	}
}

// cluster is a valid Cluster resource; seconds tells versions apart.
func cluster(t *testing.T, name, version string, seconds int64) *discoverypb.Resource {
	t.Helper()
	a, err := anypb.New(&clusterpb.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_STATIC},
		ConnectTimeout:       durationpb.New(time.Duration(seconds) * time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	return &discoverypb.Resource{Name: name, Version: version, Resource: a}
}

// xdsClient is one delta-ADS stream to the relay.
type xdsClient struct {
	conn   *grpc.ClientConn
	stream grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse]
	cancel context.CancelFunc
}

// dialClient opens a delta-ADS stream to addr, closed when the test ends.
func dialClient(t *testing.T, addr string) *xdsClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &xdsClient{conn: conn, cancel: cancel}
	t.Cleanup(func() { cancel(); conn.Close() })
	c.stream, err = discoverypb.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *xdsClient) send(t *testing.T, r *discoverypb.DeltaDiscoveryRequest) {
	t.Helper()
	if err := c.stream.Send(r); err != nil {
		t.Fatal(err)
	}
}

// recv returns the next response, or the error that ended the stream.
func (c *xdsClient) recv(t *testing.T) (*discoverypb.DeltaDiscoveryResponse, error) {
	t.Helper()
	type result struct {
		r   *discoverypb.DeltaDiscoveryResponse
		err error
	}
	got := make(chan result, 1)
	go func() {
		r, err := c.stream.Recv()
		got <- result{r, err}
	}()
	select {
	case res := <-got:
		return res.r, res.err
	case <-time.After(wait):
		c.cancel() // ends the Recv
		<-got
		t.Fatal("no response from the relay")
	}
	return nil, nil
}

// subscribe is the first request of node (id, cluster) for names.
func subscribe(id, nodeCluster string, names []string) *discoverypb.DeltaDiscoveryRequest {
	return &discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: id, Cluster: nodeCluster},
		TypeUrl: clusterType, ResourceNamesSubscribe: names}
}

func ack(r *discoverypb.DeltaDiscoveryResponse) *discoverypb.DeltaDiscoveryRequest {
	return &discoverypb.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce()}
}

func nack(r *discoverypb.DeltaDiscoveryResponse, why string) *discoverypb.DeltaDiscoveryRequest {
	return &discoverypb.DeltaDiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(),
		ErrorDetail: &statuspb.Status{Code: 3, Message: fmt.Sprintf("rejected: %s", why)}}
}

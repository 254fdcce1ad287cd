package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/relay"
)

// runCLI runs the command line and returns its exit code and outputs.
func runCLI(args ...string) (int, string, string) {
	return runCLIEnv(nil, args...)
}

// runCLIEnv runs the command line with env as its environment.
func runCLIEnv(env map[string]string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, environ(env), &out, &errOut)
	return code, out.String(), errOut.String()
}

// On an admin endpoint that is not loopback, served over admin.tls, `xdsrelay
// admin` with a client certificate (--ca-file, --cert-file, --key-file, and
// --server-name for the name in the relay's certificate, as through kubectl
// port-forward) reaches /debug/ and the detailed /readyz; without one it
// gets 403 and exits 1.
func TestAdminCommandOverMTLS(t *testing.T) {
	certs := testcp.MakeCerts(t)
	r := startFileRelay(t, t.TempDir(), func(c *relay.Config) {
		c.Admin.Address = "0.0.0.0:0" // not loopback: only a certificate makes a caller private
		c.Admin.LocalAddress = ""
		c.Admin.TLS.CertFile, c.Admin.TLS.KeyFile, c.Admin.TLS.CAFile = certs.ServerCert, certs.ServerKey, certs.CA
		c.LogLevel = new(slog.LevelVar) // PUT /debug/loglevel
	})
	adsClient(t, r.Addr(), "ingress-1") // a group, which only a private caller is shown
	_, port, _ := net.SplitHostPort(r.AdminAddr())
	server := "127.0.0.1:" + port // as kubectl port-forward makes it
	tlsFlags := []string{"--admin", server, "--ca-file", certs.CA, "--server-name", "localhost"}
	client := append(tlsFlags, "--cert-file", certs.ClientCert, "--key-file", certs.ClientKey)

	code, out, errOut := runCLI(append([]string{"admin"}, append(client, "/debug/groups")...)...)
	var groups []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &groups) != nil || len(groups) != 1 {
		t.Fatalf("admin /debug/groups with a client certificate: exit %d, %q %q; want the one group", code, out, errOut)
	}
	if code, out, _ = runCLI(append([]string{"admin"}, append(client, "-X", "PUT", "-d", "debug", "/debug/loglevel")...)...); code != 0 || out != "debug\n" {
		t.Errorf("admin -X PUT -d debug /debug/loglevel: exit %d, %q", code, out)
	}
	if code, out, _ = runCLI(append([]string{"admin"}, append(client, "/readyz")...)...); code != 0 || !strings.HasPrefix(out, "ready\ngroup ") {
		t.Errorf("admin /readyz with a client certificate: exit %d, %q, want the detailed answer", code, out)
	}
	code, _, errOut = runCLI(append([]string{"admin"}, append(tlsFlags, "/debug/groups")...)...)
	if code != 1 || !strings.Contains(errOut, "GET /debug/groups: 403 Forbidden") {
		t.Errorf("admin /debug/groups without a client certificate: exit %d, %q", code, errOut)
	}
	if code, out, _ = runCLI(append([]string{"admin"}, append(tlsFlags, "/readyz")...)...); code != 0 || out != "ready\n" {
		t.Errorf("admin /readyz without a client certificate: exit %d, %q, want the general answer", code, out)
	}
	code, _, errOut = runCLI("admin", "--admin", server, "--ca-file", certs.CA, "/readyz")
	if code != 1 || !strings.Contains(errOut, "certificate") {
		t.Errorf("admin without --server-name, by IP address: exit %d, %q, want a certificate error", code, errOut)
	}
}

// `xdsrelay rollout release` releases a change a canary NACKed to the rest
// of the group.
func TestRolloutReleaseCommand(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", timedCluster(time.Second))
	cfg := relay.Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address, cfg.Admin.Address = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Rollout.Canary, cfg.Rollout.Bake = 1, time.Hour
	r := startRelayConfig(t, cfg)
	a, b := judgingClient(t, r.Addr(), "node-a"), judgingClient(t, r.Addr(), "node-b")
	a.wait(t, "1s")
	b.wait(t, "1s")

	cp.Set(t, "c1", "2", timedCluster(13*time.Second)) // the canary NACKs it
	eventually(t, func() string {
		if code, out, _ := runCLI("admin", "--admin", r.AdminAddr(), "/debug/groups"); code != 0 || !strings.Contains(out, `"held": true`) {
			return fmt.Sprintf("no held rollout: exit %d, %s", code, out)
		}
		return ""
	})
	key := relay.GroupKey(&corepb.Node{Id: "node-a", Cluster: "c1"}, cfg.Upstream.GroupBy)
	code, out, errOut := runCLI("rollout", "release", "--admin", r.AdminAddr(), "--group", key, "--type", "clusters")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("released a change of 1 Cluster resources in group %q, NACKed by canary \"node-", key)) ||
		!strings.Contains(out, "13s is too slow") {
		t.Fatalf("rollout release: exit %d, %q %q", code, out, errOut)
	}
	a.wait(t, "13s")
	b.wait(t, "13s")
	if code, out, _ := runCLI("rollout", "release", "--admin", r.AdminAddr()); code != 0 || out != "nothing was held\n" {
		t.Errorf("a second release: exit %d, %q", code, out)
	}
	if code, _, errOut := runCLI("rollout", "release", "--admin", r.AdminAddr(), "--group", "nope"); code != 1 || !strings.Contains(errOut, `no group "nope"`) {
		t.Errorf("unknown group: exit %d, %q", code, errOut)
	}
}

func timedCluster(d time.Duration) *clusterpb.Cluster {
	c := testcp.Cluster("app")
	c.ConnectTimeout = durationpb.New(d)
	return c
}

// judge is a delta-ADS client that NACKs a cluster whose connect timeout
// is 13s and records the timeouts it was sent.
type judge struct{ seen chan string }

func judgingClient(t *testing.T, addr, id string) *judge {
	t.Helper()
	return deltaJudge(t, addr, id, "13s")
}

// acceptingClient is a judge that NACKs nothing.
func acceptingClient(t *testing.T, addr, id string) *judge {
	t.Helper()
	return deltaJudge(t, addr, id, "")
}

// deltaJudge is a judge that NACKs a cluster whose connect timeout is
// reject (nothing if "").
func deltaJudge(t *testing.T, addr, id, reject string) *judge {
	t.Helper()
	ctx, st, run := clusterStream(t, addr, &corepb.Node{Id: id, Cluster: "c1"})
	j := &judge{seen: make(chan string, 16)}
	run(func() {
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			ack := &discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
			for _, res := range resp.GetResources() {
				var c clusterpb.Cluster
				if res.GetResource().UnmarshalTo(&c) != nil {
					continue
				}
				timeout := c.GetConnectTimeout().AsDuration().String()
				select {
				case j.seen <- timeout:
				case <-ctx.Done(): // nobody waits any more: the test is ending
					return
				}
				if reject != "" && timeout == reject {
					ack.ErrorDetail = &rpcstatus.Status{Code: 3, Message: reject + " is too slow"}
				}
			}
			if st.Send(ack) != nil {
				return
			}
		}
	})
	return j
}

// clusterStream is a delta ADS stream to addr with node n, subscribed to
// every Cluster. run starts loop, which reads the stream, in a goroutine of
// its own; the stop it returns, also called at the test's end, cancels the
// stream, waits for loop to return and closes the connection.
func clusterStream(t *testing.T, addr string, n *corepb.Node) (context.Context, discoverypb.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, func(loop func()) (stop func())) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	started := false
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if started {
				<-done
			}
			cc.Close()
		})
	}
	t.Cleanup(stop)
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	return ctx, st, func(loop func()) func() {
		started = true
		go func() {
			defer close(done)
			loop()
		}()
		return stop
	}
}

// wait waits for the client to be sent a cluster with this timeout.
func (j *judge) wait(t *testing.T, timeout string) {
	t.Helper()
	deadline := time.After(cliWait)
	for {
		select {
		case got := <-j.seen:
			if got == timeout {
				return
			}
		case <-deadline:
			t.Fatalf("no cluster with a %s timeout", timeout)
		}
	}
}

// `xdsrelay admin` takes --server as an http:// URL too, and exits 1 with
// one line for each way a call fails: an answer other than 2xx (its status
// and first line), a refused connection, and an endpoint that answers
// nothing within --timeout.
func TestAdminCommandErrors(t *testing.T) {
	r := startFileRelay(t, t.TempDir(), func(c *relay.Config) {
		c.Admin.Address = "127.0.0.1:0"
		c.LogLevel = new(slog.LevelVar)
	})
	if code, out, errOut := runCLI("admin", "--admin", "http://"+r.AdminAddr()+"/", "/readyz"); code != 0 || !strings.HasPrefix(out, "ready\n") {
		t.Errorf("admin --server http://ADDR/ /readyz: exit %d, %q %q", code, out, errOut)
	}

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var held []net.Conn // open, never answered
		for {
			c, err := silent.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() { silent.Close(); <-done })
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"an unknown path", []string{"--admin", r.AdminAddr(), "/nope"}, "xdsrelay: GET /nope: 404 Not Found: 404 page not found\n"},
		{"a body the endpoint refuses", []string{"--admin", r.AdminAddr(), "-X", "PUT", "-d", "loud", "/debug/loglevel"},
			"xdsrelay: PUT /debug/loglevel: 400 Bad Request: want one of debug, info, warn, error\n"},
		{"a refused connection", []string{"--admin", deadAddr(t), "/readyz"}, "GET /readyz: connection refused: nothing listens at that address"},
		{"no answer within --timeout", []string{"--admin", silent.Addr().String(), "--timeout", "200ms", "/readyz"}, "GET /readyz: no answer in time (--timeout)"},
	} {
		code, out, errOut := runCLI(append([]string{"admin"}, tc.args...)...)
		if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 and one line with %q", tc.name, code, out, errOut, tc.want)
		}
	}
}

// docs/operations.md's admin commands run as written, but for the admin
// endpoint's address and the certificates' files: the two curl commands
// that turn debug logging on and off, on the loopback endpoint; and, on an
// endpoint that is not loopback served over admin.tls, the curl command and
// `xdsrelay admin` that a client certificate makes private.
func TestDocOperationsAdminCommands(t *testing.T) {
	level := new(slog.LevelVar)
	r := startFileRelay(t, t.TempDir(), func(c *relay.Config) {
		c.Admin.Address = "127.0.0.1:0"
		c.LogLevel = level
	})
	var levels []string
	for _, c := range shellCommands(t, docBlock(t, "docs/operations.md", "sh", "/debug/loglevel")) {
		args := slices.Clone(c.words[1:])
		for i, a := range args {
			args[i] = strings.Replace(a, "localhost:9901/", r.AdminAddr()+"/", 1)
		}
		if c.words[0] != "curl" || slices.Equal(args, c.words[1:]) {
			t.Fatalf("not a curl command on localhost:9901: %q", c.words)
		}
		body := strings.TrimSpace(string(runCurl(t, args)))
		if body != strings.ToLower(level.Level().String()) {
			t.Errorf("%q answered %q; the level is %s", c.words, body, level.Level())
		}
		levels = append(levels, body)
	}
	if !slices.Equal(levels, []string{"debug", "info"}) {
		t.Errorf("docs/operations.md's curl commands set the levels %q, want debug then info", levels)
	}

	certs := testcp.MakeCerts(t)
	r = startFileRelay(t, t.TempDir(), func(c *relay.Config) {
		c.Admin.Address = "0.0.0.0:0" // not loopback: only the certificate makes the caller private
		c.Admin.LocalAddress = ""
		c.Admin.TLS.CertFile, c.Admin.TLS.KeyFile, c.Admin.TLS.CAFile = certs.ServerCert, certs.ServerKey, certs.CA
	})
	adsClient(t, r.Addr(), "ingress-1") // a group, which only a private caller is shown
	_, port, _ := net.SplitHostPort(r.AdminAddr())
	shown := map[string]string{"ca.crt": certs.CA, "operator.crt": certs.ClientCert, "operator.key": certs.ClientKey,
		"relay:9901": "localhost:" + port, "https://relay:9901/readyz": "https://localhost:" + port + "/readyz"}
	cmds := shellCommands(t, docBlock(t, "docs/operations.md", "sh", "--cert operator.crt"))
	if len(cmds) != 2 || cmds[0].words[0] != "curl" || cmds[1].words[0] != "xdsrelay" {
		t.Fatalf("docs/operations.md's admin.tls block: want curl, then xdsrelay: %+v", cmds)
	}
	for _, c := range cmds {
		for i, w := range c.words {
			if v, ok := shown[w]; ok {
				c.words[i] = v
			}
		}
	}
	if ready := string(runCurl(t, cmds[0].words[1:])); !strings.HasPrefix(ready, "ready\ngroup ") {
		t.Errorf("curl /readyz with the operator's certificate: %q, want the detailed answer", ready)
	}
	code, out, errOut := runCLI(cmds[1].words[1:]...)
	var groups []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &groups) != nil || len(groups) != 1 {
		t.Errorf("%q: exit %d, %q %q; want the one group", cmds[1].words, code, out, errOut)
	}
}

// deadAddr is a loopback address that refuses connections.
func deadAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", freePort(t))
}

// `xdsrelay admin /` prints the admin endpoint's index: every path
// docs/admin.md lists, with who may call it; a path it does not list is
// still 404.
func TestAdminIndex(t *testing.T) {
	r := startFileRelay(t, t.TempDir(), func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })
	code, out, errOut := runCLI("admin", "--admin", r.AdminAddr(), "/")
	if code != 0 || !strings.HasPrefix(out, "xdsrelay admin endpoint (docs/admin.md)") {
		t.Fatalf("admin /: exit %d, %q %q", code, out, errOut)
	}
	doc := docText(t, "docs/admin.md")
	for _, p := range relay.AdminPaths() {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(p.Shown()) + ` +` + regexp.QuoteMeta(p.Access)).MatchString(out) {
			t.Errorf("the index lacks %s (%s):\n%s", p.Shown(), p.Access, out)
		}
		if !strings.Contains(doc, "| `"+p.Shown()+"` |") {
			t.Errorf("docs/admin.md lacks %s", p.Shown())
		}
	}
	if code, _, errOut := runCLI("admin", "--admin", r.AdminAddr(), "/nope"); code != 1 || !strings.Contains(errOut, "404") {
		t.Errorf("admin /nope: exit %d, %q", code, errOut)
	}
}

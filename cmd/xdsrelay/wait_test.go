package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/relay"
)

// `xdsrelay wait`, the built binary, against a relay with two real
// clients: exit 0 once they accepted a change, 1 at once when one rejects
// it (with its error and node id), 0 again for a fraction the rejection
// leaves reachable, 1 at the timeout for a version nobody is sent, and 2
// for a command line it does not take (a --fraction or --timeout out of
// range among them). status --summary counts the same.
func TestWaitExitCodes(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "xdsrelay")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(args ...string) (int, string, time.Duration) {
		t.Helper()
		start := time.Now()
		out, err := exec.Command(bin, args...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out), time.Since(start)
	}

	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", timedCluster(time.Second))
	cfg := relay.Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address, cfg.Admin.Address = "127.0.0.1:0", "127.0.0.1:0"
	r := startRelayConfig(t, cfg)
	a, b := judgingClient(t, r.Addr(), "node-a"), acceptingClient(t, r.Addr(), "node-b")
	a.wait(t, "1s")
	b.wait(t, "1s")
	admin := r.AdminAddr()

	if code, out, _ := run("wait", "--admin", admin, "--type", "clusters", "--timeout", "20s"); code != 0 || out != "2 of 2 clients accepted\n" {
		t.Fatalf("wait for the first version: exit %d, %q", code, out)
	}

	cp.Set(t, "c1", "2", timedCluster(13*time.Second)) // node-a NACKs it
	a.wait(t, "13s")
	b.wait(t, "13s")
	code, out, took := run("wait", "--admin", admin, "--type", "Cluster", "--name", "app", "--timeout", "20s")
	if code != 1 || !strings.Contains(out, `1 rejected: "13s is too slow" by node-a`) || !strings.Contains(out, "1 of 2 clients rejected") {
		t.Fatalf("wait for a version one client rejects: exit %d, %q", code, out)
	}
	if took > 10*time.Second {
		t.Errorf("wait took %v to see the rejection, not at once", took)
	}
	if code, out, _ := run("wait", "--admin", admin, "--type", "cds", "--fraction", "0.5", "--timeout", "20s"); code != 0 || out != "1 of 2 clients accepted\n" {
		t.Errorf("wait for half the clients: exit %d, %q", code, out)
	}
	code, out, _ = run("status", "--summary", "--admin", admin)
	if code != 0 || !regexp.MustCompile(`(?m)^cluster=c1\S*\s+CDS\s+1\s+2\s+1\s+1\s+0\s+0\s+0$`).MatchString(out) {
		t.Errorf("status --summary: exit %d, %q; want one CDS resource, 2 clients: 1 accepted, 1 rejected", code, out)
	}
	code, out, _ = run("wait", "--admin", admin, "--type", "clusters", "--version", "nosuch", "--fraction", "0.5", "--timeout", "500ms")
	if code != 1 || !strings.Contains(out, "0 of 2 clients accepted after 500ms") || !strings.Contains(out, "2 behind") {
		t.Errorf("wait for a version nobody is sent: exit %d, %q", code, out)
	}

	// An admin endpoint that refuses (a path it does not serve stands in
	// for a caller that is not private) ends the wait at once.
	code, out, took = run("wait", "--admin", "http://"+admin+"/nosuch", "--type", "clusters", "--timeout", "20s")
	if code != 1 || !strings.Contains(out, "404") || took > 10*time.Second {
		t.Errorf("wait on an endpoint that refuses: exit %d after %v, %q", code, took, out)
	}

	for _, args := range [][]string{
		{"wait", "--admin", admin},
		{"wait", "--type", "clusters"},
		{"wait", "--admin", admin, "--type", "nosuchtype"},
		{"wait", "--admin", admin, "--type", "clusters", "--fraction", "1.5"},
		{"wait", "--admin", admin, "--type", "clusters", "--fraction", "0"},
		{"wait", "--admin", admin, "--type", "clusters", "--timeout", "0s"},
		{"wait", "--admin", admin, "--type", "clusters", "extra"},
	} {
		if code, out, _ := run(args...); code != 2 {
			t.Errorf("%q: exit %d, %q; want 2", args, code, out)
		}
	}
}

// wait asks every replica given and sums their clients: two relays, one
// client each, are two clients; one of them that rejects the change is
// one rejection of the two.
func TestWaitSumsReplicas(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "xdsrelay")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", timedCluster(time.Second))
	replica := func() *relay.Relay {
		cfg := relay.Default()
		cfg.Upstream.Address = cp.Addr
		cfg.Downstream.Address, cfg.Admin.Address = "127.0.0.1:0", "127.0.0.1:0"
		return startRelayConfig(t, cfg)
	}
	r1, r2 := replica(), replica()
	a, b := acceptingClient(t, r1.Addr(), "node-a"), judgingClient(t, r2.Addr(), "node-b")
	a.wait(t, "1s")
	b.wait(t, "1s")
	args := []string{"wait", "--admin", r1.AdminAddr(), "--admin", "http://" + r2.AdminAddr(), "--type", "clusters", "--timeout", "20s"}
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil || string(out) != "2 of 2 clients accepted\n" {
		t.Fatalf("wait on two replicas: %v, %q", err, out)
	}
	cp.Set(t, "c1", "2", timedCluster(13*time.Second)) // node-b, on the second, NACKs it
	a.wait(t, "13s")
	b.wait(t, "13s")
	out, err := exec.Command(bin, args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "1 of 2 clients rejected") ||
		!strings.Contains(string(out), "http://"+r2.AdminAddr()+` group`) {
		t.Fatalf("wait on two replicas, one client rejecting: %v, %q", err, out)
	}
}

// A name that resolves to several addresses is one replica each, verified
// as the name over TLS; localhost is one relay, whichever address it
// answers on.
func TestWaitReplicasOfAName(t *testing.T) {
	f := waitFlags{}
	if got := f.resolve(t.Context(), "localhost:9901"); len(got) != 1 || got[0].server != "localhost:9901" {
		t.Errorf("localhost: %+v", got)
	}
	if got := f.resolve(t.Context(), "127.0.0.1:9901"); len(got) != 1 || got[0].server != "127.0.0.1:9901" {
		t.Errorf("an address: %+v", got)
	}
}

// A replica that cannot be counted (unreachable, a 5xx, an answer that is
// not JSON, more resources than it lists for --version) is named with why,
// and the wait is neither done nor lost while it is; one that never
// answers ends the wait at --timeout; a long error line is clipped.
func TestWaitReplicasThatCannotBeCounted(t *testing.T) {
	serve := func(code int, body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(code)
			io.WriteString(w, body)
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	good := `{"summary":[{"subscribed":2,"accepted":2}],"resources":[{"name":"a","version":"1","subscribed":2,"versions":[{"version":"1","accepted":2}]}],"more":3}`
	for name, tc := range map[string]struct {
		server, version, want string
	}{
		"unreachable": {gone.URL, "", "connect"},
		"5xx":         {serve(http.StatusInternalServerError, strings.Repeat("x", 10*xds.MaxText)), "", "500 Internal Server Error: " + strings.Repeat("x", xds.MaxText) + "…"},
		"not JSON":    {serve(http.StatusOK, "{"), "", "unexpected end of JSON input"},
		"more":        {serve(http.StatusOK, good), "1", "3 resources past the 1 listed"},
	} {
		f := waitFlags{servers: []string{tc.server}, typ: "clusters", version: tc.version, fraction: 1}
		c, refused := f.count(t.Context())
		if refused != nil {
			t.Errorf("%s: refused: %v", name, refused)
			continue
		}
		if len(c.unknown) != 1 || !strings.HasPrefix(c.unknown[0], tc.server+": ") || !strings.Contains(c.unknown[0], tc.want) {
			t.Errorf("%s: unknown %.300q, want one line naming %s with %.300q", name, c.unknown, tc.server, tc.want)
		} else if len(c.unknown[0]) > 2*xds.MaxText {
			t.Errorf("%s: %d bytes of error, not clipped", name, len(c.unknown[0]))
		}
		if done, lost := c.verdict(f.fraction); done || lost {
			t.Errorf("%s: done %v, lost %v with a replica not counted", name, done, lost)
		}
	}

	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang }))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(hang) })
	f := waitFlags{servers: []string{slow.URL}, typ: "clusters", fraction: 1, timeout: 300 * time.Millisecond}
	var out strings.Builder
	start := time.Now()
	err := f.run(t.Context(), &out)
	if took := time.Since(start); err == nil || took > 5*time.Second {
		t.Errorf("a replica that never answers: %v after %v, %q", err, took, out.String())
	}
}

// A verdict names at most waitShown resources not there yet, and says how
// many more, the relay's own past its limit among them.
func TestWaitShowsBoundedResources(t *testing.T) {
	var dc relay.DebugConvergence
	for i := range waitShown + 2 {
		dc.Resources = append(dc.Resources, relay.ConvergenceResource{Name: fmt.Sprintf("r%d", i), Version: "2", Subscribed: 2,
			Versions: []relay.ConvergenceVersion{{Version: "2", Accepted: 1, Rejected: 1, Error: "no", RejectedBy: []string{"node-a"}}}})
	}
	dc.Resources = append(dc.Resources, relay.ConvergenceResource{Name: "done", Version: "2", Subscribed: 2,
		Versions: []relay.ConvergenceVersion{{Version: "2", Accepted: 2}}})
	dc.More = 5
	dc.Summary = []relay.ConvergenceSummary{{Subscribed: 40, Accepted: 20, Rejected: 12}}
	var c waitCount
	f := waitFlags{}
	f.add(&c, "relay-0", dc)
	if len(c.shown) != waitShown || c.more != 2+5 {
		t.Fatalf("%d shown, %d more; want %d and 7", len(c.shown), c.more, waitShown)
	}
	var out strings.Builder
	c.print(&out)
	if !strings.Contains(out.String(), `1 rejected: "no" by node-a`) || !strings.HasSuffix(out.String(), "... and 7 more resources\n") ||
		strings.Contains(out.String(), `/done`) {
		t.Errorf("printed %q", out.String())
	}
}

// A replica wait cannot count keeps it from a verdict until the timeout,
// and the verdict names the replica and why: one that does not answer,
// one whose answer is not JSON, and, with --version, one listing fewer
// resources than match. A replica that answers alone still decides.
func TestWaitUncountedReplicas(t *testing.T) {
	serve := func(body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
		t.Cleanup(s.Close)
		return s.URL
	}
	ok := serve(`{"summary":[{"subscribed":2,"accepted":2}],"resources":[{"name":"app","version":"1","subscribed":2,"versions":[{"version":"1","accepted":2}]}]}`)
	notJSON := serve("<html>")
	past := serve(`{"resources":[{"name":"app","version":"1","subscribed":2,"versions":[{"version":"1","accepted":2}]}],"more":3}`)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, tc := range []struct {
		name     string
		servers  []string
		version  string
		wantErr  string
		wantLine string
	}{
		{name: "one that answers", servers: []string{ok}, wantErr: ""},
		{name: "one that does not answer", servers: []string{ok, closed.URL}, wantErr: "2 of 2 clients accepted after 600ms; 2 must (--fraction 1); 1 relay not counted", wantLine: closed.URL + ": "},
		{name: "an answer not JSON", servers: []string{notJSON}, wantErr: "wait: no relay could be counted in 600ms: " + notJSON, wantLine: notJSON + ": invalid character"},
		{name: "resources past those listed", servers: []string{past}, version: "1", wantErr: "2 of 2 clients accepted after 600ms; 2 must (--fraction 1); 1 relay not counted",
			wantLine: past + ": 3 resources past the 1 listed: name those to wait for with --name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := waitFlags{servers: tc.servers, typ: resourcev3.ClusterType, version: tc.version, fraction: 1, timeout: 600 * time.Millisecond}
			var out strings.Builder
			err := f.run(t.Context(), &out)
			if tc.wantErr == "" {
				if err != nil || out.String() != "2 of 2 clients accepted\n" {
					t.Fatalf("err %v, out %q", err, out.String())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(out.String(), tc.wantLine) {
				t.Fatalf("err %v, out %q; want %q and a line %q", err, out.String(), tc.wantErr, tc.wantLine)
			}
		})
	}
}

// status --summary prints the admin endpoint's summary as JSON with -o
// json, and an answer that is not JSON is an error that says whose.
func TestStatusSummaryJSON(t *testing.T) {
	serve := func(body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
		t.Cleanup(s.Close)
		return s.URL
	}
	ok := serve(`{"summary":[{"group":"cluster=c1","type":"` + resourcev3.ClusterType + `","resources":1,"subscribed":2,"accepted":1,"rejected":1}]}`)
	code, out, errOut := runCLI("status", "--summary", "--admin", ok, "-o", "json")
	if code != 0 || !strings.Contains(out, `"group": "cluster=c1"`) || !strings.Contains(out, `"rejected": 1`) {
		t.Errorf("status --summary -o json: exit %d, %q %q", code, out, errOut)
	}
	code, out, errOut = runCLI("status", "--summary", "--admin", serve("<html>"))
	if code != 1 || !strings.Contains(errOut, "the admin endpoint's answer: invalid character") {
		t.Errorf("status --summary on an answer not JSON: exit %d, %q %q", code, out, errOut)
	}
}

// Clients are counted as clients: with two clients of five Clusters, one
// rejecting them all, wait says 1 of 2 clients rejected (not 5 of 10),
// and status --summary shows 2 clients, 1 rejecting, of 5 resources.
func TestWaitCountsClients(t *testing.T) {
	dir := t.TempDir()
	for i := range 5 {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("c%d.yaml", i)), clusterFile(fmt.Sprintf("c%d", i)))
	}
	r := startFileRelay(t, dir, func(c *relay.Config) { c.Admin.Address = "127.0.0.1:0" })
	for _, args := range [][]string{{"--node-id", "acker"}, {"--node-id", "nacker", "--nack"}} {
		out := &syncBuffer{}
		stop := runAsync(t, out, append([]string{"watch", "--server", r.Addr(), "--cluster", "c1", "--type", "cds"}, args...)...)
		defer stop()
		waitForOutput(t, out, "name: c4")
	}
	var code int
	var out, errOut string
	eventually(t, func() string { // the NACK may be on its way
		code, out, errOut = runCLI("wait", "--admin", r.AdminAddr(), "--type", "clusters", "--timeout", "20s")
		if code == 1 && strings.Contains(errOut, "wait: 1 of 2 clients rejected it: 2 of them must accept (--fraction 1), 1 at most still can") {
			return ""
		}
		return fmt.Sprintf("wait: exit %d, %q %q", code, out, errOut)
	})
	if !strings.HasPrefix(out, "2 clients: 1 accepted, 1 rejected, 0 pending, 0 behind, 0 waiting\n") {
		t.Errorf("wait's counts: %q", out)
	}
	code, sum, _ := runCLI("status", "--summary", "--admin", r.AdminAddr())
	if code != 0 || !regexp.MustCompile(`(?m)^\S+\s+CDS\s+5\s+2\s+1\s+1\s+0\s+0\s+0$`).MatchString(sum) {
		t.Errorf("status --summary: exit %d, %q; want 5 resources, 2 clients: 1 accepted, 1 rejected", code, sum)
	}
}

// Every resource --name asks for must have clients: with one name that a
// client accepted and one no client subscribes to, wait keeps waiting,
// exits 1 at the timeout and names the resource with no client; the name
// with clients alone is accepted at once.
func TestWaitNameWithoutClients(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", timedCluster(time.Second))
	cfg := relay.Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address, cfg.Admin.Address = "127.0.0.1:0", "127.0.0.1:0"
	r := startRelayConfig(t, cfg)
	acceptingClient(t, r.Addr(), "node-a").wait(t, "1s")

	var code int
	var out, errOut string
	eventually(t, func() string { // the ACK may be on its way
		if code, out, errOut = runCLI("wait", "--admin", r.AdminAddr(), "--type", "cds", "--name", "app", "--timeout", "5s"); code != 0 || out != "1 of 1 clients accepted\n" {
			return fmt.Sprintf("wait --name app: exit %d, %q %q", code, out, errOut)
		}
		return ""
	})
	code, out, errOut = runCLI("wait", "--admin", r.AdminAddr(), "--type", "cds", "--name", "app", "--name", "nope", "--timeout", "1s")
	if code != 1 || !strings.Contains(out, "Cluster/nope: no client subscribes to it") || !strings.Contains(errOut, "no client subscribes to Cluster/nope") {
		t.Errorf("wait --name app --name nope: exit %d, %q %q; want exit 1 naming Cluster/nope as having no client", code, out, errOut)
	}
}

// wait's verdicts say what happened in words: an admin endpoint nothing
// listens at is named as such (not "0 of 0 clients"), a name nobody
// holds ends at the timeout without a raw HTTP error, a --version the
// relay never had is said to be unknown to it (not "not sent yet"), a
// version the relay has and has not sent names the holds, an xDS port
// is named once, and a fraction is said as the flag was given.
func TestWaitSaysWhy(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", timedCluster(time.Second))
	cfg := relay.Default()
	cfg.Upstream.Address = cp.Addr
	cfg.Downstream.Address, cfg.Admin.Address = "127.0.0.1:0", "127.0.0.1:0"
	r := startRelayConfig(t, cfg)
	acceptingClient(t, r.Addr(), "node-a").wait(t, "1s")
	admin := r.AdminAddr()

	dead := deadAddr(t)
	code, out, errOut := runCLI("wait", "--admin", dead, "--type", "cds", "--timeout", "500ms")
	if code != 1 || !strings.Contains(errOut, "wait: no relay could be counted in 500ms: "+dead+": GET /debug/convergence: connection refused: nothing listens at that address") ||
		strings.Contains(out+errOut, "0 of 0") || strings.Contains(out, "0 clients:") {
		t.Errorf("wait on nothing listening: exit %d, %q %q", code, out, errOut)
	}
	code, out, errOut = runCLI("wait", "--admin", admin, "--type", "cds", "--name", "nope", "--timeout", "500ms")
	if code != 1 || strings.Contains(out+errOut, "deadline") || strings.Contains(out+errOut, "http://") ||
		!strings.Contains(errOut, "no client subscribes to Cluster/nope") {
		t.Errorf("wait for a name nobody holds: exit %d, %q %q", code, out, errOut)
	}
	code, out, errOut = runCLI("wait", "--admin", admin, "--type", "cds", "--version", "nope", "--timeout", "500ms")
	if code != 1 || !strings.Contains(out, `1 behind (the relay has no version "nope" of it: its version is "`) || !strings.HasPrefix(out, "1 client: ") {
		t.Errorf("wait for a version the relay never had: exit %d, %q %q", code, out, errOut)
	}
	code, out, errOut = runCLI("wait", "--admin", r.Addr(), "--type", "cds", "--timeout", "5s")
	if code != 1 || strings.Count(errOut, r.Addr()) != 1 || !strings.Contains(errOut, "it answers in gRPC") {
		t.Errorf("wait on the xDS port: exit %d, %q %q; want the address named once", code, out, errOut)
	}

	held := relay.ConvergenceResource{Type: resourcev3.ClusterType, Name: "app", Version: "v2", Subscribed: 2,
		Versions: []relay.ConvergenceVersion{{Version: "v2"}, {Version: "v1", Accepted: 2}}}
	if line := resourceLine("relay-0", held, "v2", held.Versions[0], 2); strings.Contains(line, `version is "v2"`) || !strings.Contains(line, "rollout list") {
		t.Errorf("a version the relay holds back: %q; want the holds named, not the same version again", line)
	}
	c := waitCount{byResource: true, res: map[tierKey]tally{{resourcev3.ClusterType, "a"}: {subscribed: 2, accepted: 2}, {resourcev3.ClusterType, "b"}: {subscribed: 2, accepted: 2}}}
	if got := c.accepted(1); got != "2 resources accepted, each by all of its clients" {
		t.Errorf("accepted at --fraction 1: %q", got)
	}
	if got := c.accepted(0.5); got != "2 resources accepted, each by 50% of its clients or more" {
		t.Errorf("accepted at --fraction 0.5: %q", got)
	}
}

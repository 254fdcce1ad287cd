package relay

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func fileCluster(name, timeout string) string {
	return "\"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\nname: " + name + "\nconnect_timeout: " + timeout + "\n---\n"
}

// connectTimeouts decodes the clusters of a SotW response: name → timeout.
func connectTimeouts(t *testing.T, resp *discoverypb.DiscoveryResponse) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	for _, a := range resp.GetResources() {
		c := &clusterpb.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		out[c.GetName()] = c.GetConnectTimeout().AsDuration()
	}
	return out
}

// A resource file edited into an invalid resource (a negative
// connect_timeout) does not reach clients: they keep its last good version
// while the file's valid changes still reach them, and /readyz and /metrics
// name what is rejected until it is fixed.
func TestFileInvalidResourceKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "clusters.yaml")
	write := func(content string) {
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fileCluster("a", "1s") + fileCluster("b", "1s"))
	r := startRelay(t, FilePrefix+dir)
	envoy := openSotW(t, r.Addr())
	envoy.send(&discoverypb.DiscoveryRequest{Node: node("envoy", "c1"), TypeUrl: resourcev3.ClusterType})
	next := func(want map[string]time.Duration) {
		t.Helper()
		resp := envoy.recv()
		got := connectTimeouts(t, resp)
		if len(got) != len(want) || got["a"] != want["a"] || got["b"] != want["b"] {
			t.Fatalf("clusters %v, want %v", got, want)
		}
		envoy.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	next(map[string]time.Duration{"a": time.Second, "b": time.Second})

	write(fileCluster("a", "-1s") + fileCluster("b", "2s") + fileCluster("new", "-1s"))
	next(map[string]time.Duration{"a": time.Second, "b": 2 * time.Second})
	ready := readyz(t, r)
	for _, want := range []string{file + `: Cluster "a": invalid Cluster.ConnectTimeout: value must be greater than 0s`,
		file + `: Cluster "new": invalid Cluster.ConnectTimeout`} {
		if !strings.Contains(ready, want) {
			t.Errorf("/readyz does not say %q:\n%s", want, ready)
		}
	}
	if m := getMetrics(t, r); !strings.Contains(m, "xdsrelay_file_invalid_resources 2\n") {
		t.Errorf("/metrics does not count 2 invalid resources:\n%s", m)
	}

	write(fileCluster("a", "3s") + fileCluster("b", "2s"))
	next(map[string]time.Duration{"a": 3 * time.Second, "b": 2 * time.Second})
	if ready := readyz(t, r); strings.Contains(ready, "invalid") {
		t.Errorf("/readyz after the fix:\n%s", ready)
	}
}

// At startup there is no good version to serve instead: an invalid resource
// stops the relay with an error naming the file, the resource and the field.
func TestFileInvalidResourceAtStartup(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "clusters.yaml"), []byte(fileCluster("a", "-1s")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.Upstream.Address = FilePrefix + dir
	_, err := New(cfg, testLogger())
	for _, want := range []string{"upstream.address", "clusters.yaml", `Cluster "a"`, "Cluster.ConnectTimeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want one naming %s", err, want)
		}
	}
}

// The resource files are the whole of what there is: a name no file
// defines does not exist at once, not after a does-not-exist timer. A real
// gRPC client (SotW, reading no resource_errors) of a listener the files
// lack fails its RPC at once; a SotW client asking for a name that exists
// and one that does not gets the first with NOT_FOUND for the second; a
// delta client gets removed_resources with NOT_FOUND.
func TestFileAbsentNameDoesNotExistAtOnce(t *testing.T) {
	r := startRelay(t, exampleFiles())

	cc := grpcXDSClient(t, r.Addr(), "grpc-files-1", "example", "xds:///nosuchservice")
	err, took := rpcFails(t, cc, 10*time.Second)
	t.Logf("the RPC failed after %v: %v", took, err)
	if err == nil || status.Code(err) == codes.DeadlineExceeded || took > 2*time.Second {
		t.Errorf("RPC to a listener no file defines: %v after %v, want a failure within 2s", err, took)
	}
	waitMetric(t, r, `xdsrelay_resource_errors_total{code="NOT_FOUND",type="Listener"} 1`)

	notFound := func(errs []*discoverypb.ResourceError, name string) bool {
		return len(errs) == 1 && errs[0].GetResourceName().GetName() == name && errs[0].GetErrorDetail().GetCode() == int32(codes.NotFound)
	}
	s := openSotW(t, r.Addr())
	s.send(&discoverypb.DiscoveryRequest{Node: node("sotw", "example"), TypeUrl: resourcev3.EndpointType,
		ResourceNames: []string{"greeter-cluster", "nosuch-cluster"}})
	resp := s.recvWithin(2 * time.Second)
	if names := resourceNames(t, resp); !slices.Equal(names, []string{"greeter-cluster"}) || !notFound(resp.GetResourceErrors(), "nosuch-cluster") {
		t.Errorf("SotW: %v with errors %v, want [greeter-cluster] with NOT_FOUND for nosuch-cluster", names, resp.GetResourceErrors())
	}

	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("delta", "example"), TypeUrl: resourcev3.ClusterType,
		ResourceNamesSubscribe: []string{"nosuch-cluster"}})
	dresp := d.recvWithin(2 * time.Second)
	if !slices.Equal(dresp.GetRemovedResources(), []string{"nosuch-cluster"}) || !notFound(dresp.GetResourceErrors(), "nosuch-cluster") {
		t.Errorf("delta: removed %v, errors %v, want nosuch-cluster removed with NOT_FOUND", dresp.GetRemovedResources(), dresp.GetResourceErrors())
	}
}

// Files removed in a mass are held by the guard, as a control plane's
// removals are: clients subscribed to them by name are sent neither the
// removals nor a NOT_FOUND for them while the hold lasts.
func TestFileRemovalsHeldWithoutErrors(t *testing.T) {
	dir := t.TempDir()
	var names []string
	for i := range 12 {
		name := fmt.Sprintf("c%02d", i)
		names = append(names, name)
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(fileCluster(name, "1s")), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := startRelay(t, FilePrefix+dir)
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names})
	for got := 0; got < len(names); {
		resp := d.recv()
		got += len(resp.GetResources())
		d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.GetNonce()})
	}
	for _, n := range names {
		if err := os.Remove(filepath.Join(dir, n+".yaml")); err != nil {
			t.Fatal(err)
		}
	}
	waitMetric(t, r, `xdsrelay_guard_holds_total{type="Cluster"} 1`)
	d.quiet(500 * time.Millisecond)
}

// Resource files are the whole of what there is, and they are applied in
// make-before-break order: what a resource points at (a Route's Cluster
// and its endpoints) reaches the cache before it, so that a gRPC client
// of the example resources (listener -> route -> cluster -> endpoints)
// is served with nothing waiting, and the warning that a control plane
// sends in an unsafe order is not logged: there is none.
func TestFileAppliedInOrder(t *testing.T) {
	backend := startBackend(t, "backend-1")
	_, port, _ := strings.Cut(backend, ":")
	example, err := os.ReadFile(filepath.Join("..", "examples", "resources", "greeter.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "greeter.yaml"), []byte(strings.Replace(string(example), "port_value: 50051", "port_value: "+port, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	r := startRelayLogged(t, FilePrefix+dir, slog.New(slog.NewJSONHandler(logs, nil)))
	cc := grpcXDSClient(t, r.Addr(), "grpc-client-1", "example", "xds:///greeter")
	rpcReaches(t, cc, "backend-1", func() { t.Logf("relay log:\n%s", logs) })
	if strings.Contains(logs.String(), "consistency:") {
		t.Errorf("the relay warns of an unsafe order of its own resource files:\n%s", logs)
	}
	code, body := get(t, &http.Client{Transport: &http.Transport{Proxy: nil}}, "http://"+r.AdminAddr()+"/metrics")
	if code != 200 || regexp.MustCompile(`(?m)^xdsrelay_reference_waits_total\{[^}]*\} [1-9]`).MatchString(body) {
		t.Errorf("/metrics: %d; a reference wait counted:\n%s", code, grepLines(body, "xdsrelay_reference_waits_total"))
	}
}

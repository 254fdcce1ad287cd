package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// The canary rollout's proof: a group of 20 clients, delta and SotW, that
// NACK what they cannot use (a cluster with a 13s connect timeout, a
// CLA with port 6666): with rollout.canary 2, only the two canaries ever
// see a broken change.

const (
	badTimeout = 13 * time.Second
	badPort    = 6666
)

// canaryClient is a scripted ADS client of group c1 subscribed to the
// cluster "app" and its CLA. It records what it is sent, in order, as
// "cds:<timeout>" and "eds:<port>", and NACKs what it cannot use.
type canaryClient struct {
	id     string
	delta  bool
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	seen []string
}

func (c *canaryClient) saw(v string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.seen, v)
}

func (c *canaryClient) index(v string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Index(c.seen, v)
}

func (c *canaryClient) stop() {
	c.cancel()
	<-c.done
}

// judge records a resource and tells whether the client can use it.
func (c *canaryClient) judge(t *testing.T, a *anypb.Any) bool {
	var v string
	ok := true
	switch a.GetTypeUrl() {
	case resourcev3.ClusterType:
		var cl clusterpb.Cluster
		if err := a.UnmarshalTo(&cl); err != nil {
			t.Error(err)
		}
		v, ok = "cds:"+cl.GetConnectTimeout().AsDuration().String(), cl.GetConnectTimeout().AsDuration() != badTimeout
	case resourcev3.EndpointType:
		var cla endpointpb.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			t.Error(err)
		}
		port := cla.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
		v, ok = fmt.Sprintf("eds:%d", port), port != badPort
	}
	c.mu.Lock()
	c.seen = append(c.seen, v)
	c.mu.Unlock()
	return ok
}

func startCanaryClient(t *testing.T, addr, id string, delta bool) *canaryClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &canaryClient{id: id, delta: delta, cancel: cancel, done: make(chan struct{})}
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(dial(t, addr))
	types := []string{resourcev3.ClusterType, resourcev3.EndpointType}
	nack := &rpcstatus.Status{Code: 3, Message: "cannot use it"}
	if delta {
		st, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, typ := range types {
			if err := st.Send(&discoverypb.DeltaDiscoveryRequest{Node: node(id, "c1"), TypeUrl: typ, ResourceNamesSubscribe: []string{"app"}}); err != nil {
				t.Fatal(err)
			}
		}
		go func() {
			defer close(c.done)
			for {
				resp, err := st.Recv()
				if err != nil {
					return
				}
				ack := &discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
				for _, r := range resp.GetResources() {
					if !c.judge(t, r.GetResource()) {
						ack.ErrorDetail = nack
					}
				}
				if st.Send(ack) != nil {
					return
				}
			}
		}()
		return c
	}
	st, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range types {
		if err := st.Send(&discoverypb.DiscoveryRequest{Node: node(id, "c1"), TypeUrl: typ, ResourceNames: []string{"app"}}); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		defer close(c.done)
		accepted := map[string]string{}
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			req := &discoverypb.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResourceNames: []string{"app"}, ResponseNonce: resp.GetNonce()}
			good := true
			for _, r := range resp.GetResources() {
				good = c.judge(t, r) && good
			}
			if good {
				accepted[resp.GetTypeUrl()] = resp.GetVersionInfo()
			} else {
				req.ErrorDetail = nack
			}
			req.VersionInfo = accepted[resp.GetTypeUrl()]
			if st.Send(req) != nil {
				return
			}
		}
	}()
	return c
}

func appCluster(timeout time.Duration) *clusterpb.Cluster {
	c := testcp.Cluster("app")
	c.ConnectTimeout = durationpb.New(timeout)
	return c
}

func appEndpoints(port int) *endpointpb.ClusterLoadAssignment {
	return testcp.Endpoints("app", fmt.Sprintf("127.0.0.1:%d", port))
}

// heldRolloutFixture is a relay with one canary and a bake of an hour,
// and n clients (client-0…, every other one delta) that saw the first
// version of app: a change the canary NACKs is held from the rest.
func heldRolloutFixture(t *testing.T, n int) (*testcp.ControlPlane, *Relay, []*canaryClient) {
	t.Helper()
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", appCluster(time.Second), appEndpoints(1001))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Rollout.Canary, c.Rollout.Bake = 1, time.Hour })
	var clients []*canaryClient
	for i := range n {
		c := startCanaryClient(t, r.Addr(), fmt.Sprintf("client-%d", i), i%2 == 0)
		t.Cleanup(c.stop)
		clients = append(clients, c)
	}
	waitAll(t, clients, "cds:1s")
	return cp, r, clients
}

// waitAll waits until every client saw v.
func waitAll(t *testing.T, clients []*canaryClient, v string) {
	t.Helper()
	eventually(t, "every client to see "+v, func() bool {
		for _, c := range clients {
			if !c.saw(v) {
				return false
			}
		}
		return true
	})
}

func TestRolloutCanariesGateChanges(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", appCluster(time.Second), appEndpoints(1001))
	const bake = time.Second // a canary NACKs well within it, even under load
	r := startRelay(t, cp.Addr, func(c *Config) { c.Rollout.Canary, c.Rollout.Bake = 2, bake })

	var ids []string
	for i := range 20 {
		ids = append(ids, fmt.Sprintf("client-%02d", i))
	}
	byRank := slices.Clone(ids)
	slices.SortFunc(byRank, func(a, b string) int { return compareRank(downstream.Rank(a), downstream.Rank(b)) })
	canaries := byRank[:2]
	var clients, others []*canaryClient
	var canaryClients []*canaryClient
	for i, id := range ids {
		c := startCanaryClient(t, r.Addr(), id, i%2 == 0)
		t.Cleanup(c.stop)
		clients = append(clients, c)
		if slices.Contains(canaries, id) {
			canaryClients = append(canaryClients, c)
		} else {
			others = append(others, c)
		}
	}
	// A first configuration is not held.
	waitAll(t, clients, "cds:1s")
	waitAll(t, clients, "eds:1001")

	// A broken change reaches the canaries, which NACK it; the other 18
	// never see it, within three times the bake.
	cp.Set(t, "c1", "2", appCluster(badTimeout), appEndpoints(1001))
	waitAll(t, canaryClients, "cds:13s")
	eventually(t, "the halt to be counted", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_rollout_halts_total{type="Cluster"} 1`)
	})
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) != 1 || len(groups[0].Rollouts) != 1 || !groups[0].Rollouts[0].Held ||
		!slices.Contains(canaries, groups[0].Rollouts[0].Canary) || groups[0].Rollouts[0].Error != "cannot use it" {
		t.Fatalf("/debug/groups rollouts: %+v", groups)
	}
	// A canary that reconnects is a canary again: it is sent the candidate.
	old := canaryClients[0]
	old.stop()
	again := startCanaryClient(t, r.Addr(), old.id, old.delta)
	t.Cleanup(again.stop)
	canaryClients[0] = again
	waitAll(t, []*canaryClient{again}, "cds:13s")
	// A client that connects during the hold gets the released version.
	late := "late-client"
	for i := 0; downstream.Rank(late) <= downstream.Rank(canaries[1]); i++ {
		late = fmt.Sprintf("late-client-%d", i)
	}
	newcomer := startCanaryClient(t, r.Addr(), late, true)
	t.Cleanup(newcomer.stop)
	waitAll(t, []*canaryClient{newcomer}, "cds:1s")
	others = append(others, newcomer)
	for end := time.Now().Add(3 * bake); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, c := range others {
			if c.saw("cds:13s") {
				t.Fatalf("%s, not a canary, got the change the canaries NACKed", c.id)
			}
		}
	}

	// A good change supersedes it: the canaries ACK it and it reaches all
	// 20; an EDS change the control plane sends after it reaches them
	// after it, on every ADS stream (the control plane's order; it sends
	// CDS and EDS of one snapshot in no set order, so they are two).
	cp.Set(t, "c1", "3", appCluster(2*time.Second), appEndpoints(1001))
	cp.Set(t, "c1", "4", appCluster(2*time.Second), appEndpoints(1002))
	all := append(slices.Clone(others), canaryClients...)
	waitAll(t, all, "cds:2s")
	waitAll(t, all, "eds:1002")
	for _, c := range others {
		if c.saw("cds:13s") {
			t.Errorf("%s got the NACKed change", c.id)
		}
		if c.index("cds:2s") > c.index("eds:1002") {
			t.Errorf("%s got EDS before CDS: %v", c.id, c.seen)
		}
	}
}

func compareRank(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// A change a canary NACKed shows on /readyz (DEGRADED, with the type and
// the canary's error; to anyone, degraded in general terms), and an
// operator's POST /debug/rollout/release passes it to the whole group.
func TestRolloutHeldShowsOnReadyzAndReleases(t *testing.T) {
	cp, r, clients := heldRolloutFixture(t, 3)
	cp.Set(t, "c1", "2", appCluster(badTimeout), appEndpoints(1001))
	eventually(t, "the halt to be counted", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_rollout_halts_total{type="Cluster"} 1`)
	})
	key := GroupKey(node("client-0", "c1"), r.cfg.Upstream.GroupBy)
	detail := readyz(t, r)
	if !strings.Contains(detail, fmt.Sprintf("group %q", key)) || !strings.Contains(detail, "DEGRADED: rollout of 1 Cluster resources held since ") ||
		!strings.Contains(detail, "NACKed it: cannot use it (release: POST /debug/rollout/release)") {
		t.Errorf("/readyz does not show the held rollout:\n%s", detail)
	}
	if want := "ready; degraded: a canary rejected a change from the control plane, held from the rest of 1 group"; r.readySummary() != want {
		t.Errorf("general /readyz: %q, want %q", r.readySummary(), want)
	}

	for query, want := range map[string]int{"?group=nope": http.StatusNotFound, "?type=nope": http.StatusBadRequest} {
		if code, body := do(t, http.MethodPost, "http://"+r.AdminAddr()+"/debug/rollout/release"+query, ""); code != want {
			t.Errorf("release%s: %d %s, want %d", query, code, body, want)
		}
		if code, body := do(t, http.MethodGet, "http://"+r.AdminAddr()+"/debug/rollout/changes"+query, ""); code != want {
			t.Errorf("changes%s: %d %s, want %d", query, code, body, want)
		}
	}
	// GET /debug/rollout/changes lists what a release would release.
	var changes []debugRollout
	getJSON(t, r, "/debug/rollout/changes?type=clusters", &changes)
	if len(changes) != 1 || changes[0].Group != key || !changes[0].Held || changes[0].Error != "cannot use it" {
		t.Fatalf("/debug/rollout/changes: %+v", changes)
	}
	if getJSON(t, r, "/debug/rollout/changes?type=endpoints", &changes); len(changes) != 0 {
		t.Fatalf("/debug/rollout/changes?type=endpoints: %+v", changes)
	}
	code, body := do(t, http.MethodPost, "http://"+r.AdminAddr()+"/debug/rollout/release?group="+url.QueryEscape(key)+"&type=clusters", "")
	var released []debugRollout
	if err := json.Unmarshal([]byte(body), &released); code != http.StatusOK || err != nil {
		t.Fatalf("release: %d %s %v", code, body, err)
	}
	if len(released) != 1 || released[0].Group != key || !released[0].Held || released[0].Error != "cannot use it" ||
		!slices.Equal(released[0].Types, []string{resourcev3.ClusterType}) {
		t.Fatalf("release answered %+v", released)
	}
	waitAll(t, clients, "cds:13s")
	if getJSON(t, r, "/debug/rollout/changes", &changes); len(changes) != 0 {
		t.Fatalf("/debug/rollout/changes after the release: %+v", changes)
	}
	eventually(t, "the operator's release to be counted", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_rollout_releases_total{how="operator",type="Cluster"} 1`)
	})
	if d := readyz(t, r); strings.Contains(d, "DEGRADED") {
		t.Errorf("/readyz after the release:\n%s", d)
	}
}

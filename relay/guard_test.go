package relay

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// endpoints returns n CLAs named e000... and their names.
func endpoints(n int) ([]types.Resource, []string) {
	var rs []types.Resource
	var names []string
	for i := range n {
		name := fmt.Sprintf("e%03d", i)
		rs = append(rs, testcp.Endpoints(name, "127.0.0.1:1"))
		names = append(names, name)
	}
	return rs, names
}

// subscribeAll subscribes a delta client of group c1 to names and reads
// until it holds them all, ACKing.
func subscribeAll(t *testing.T, r *Relay, id string, names []string) *deltaStream {
	t.Helper()
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node(id, "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names})
	got := 0
	for got < len(names) {
		resp := s.recv()
		got += len(resp.GetResources())
		s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
	return s
}

func postRelease(t *testing.T, r *Relay, query string) []debugHold {
	t.Helper()
	resp, err := http.Post("http://"+r.AdminAddr()+"/debug/guard/release"+query, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("release: %d %s", resp.StatusCode, b)
	}
	var out []debugHold
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// The control plane clears a group's EDS (100 resources): with the guard,
// no client sees a removal, /readyz says degraded, the hold is counted and
// listed; an operator's release passes the removals on.
func TestGuardHoldsAClearedType(t *testing.T) {
	cp := testcp.Start(t)
	rs, names := endpoints(100)
	cp.Set(t, "c1", "1", rs...)
	r := startRelay(t, cp.Addr)
	s := subscribeAll(t, r, "n", names)

	cp.Set(t, "c1", "2") // empty: the control plane removes all 100
	eventually(t, "the guard to hold the removal", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_guard_holds_total{type="ClusterLoadAssignment"} 1`)
	})
	s.quiet(200 * time.Millisecond) // no removal reaches the client
	if d := readyz(t, r); !strings.Contains(d, "DEGRADED: guard holding 100 removals of ClusterLoadAssignment") {
		t.Errorf("/readyz does not show the hold:\n%s", d)
	}
	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) != 1 || len(groups[0].Holds) != 1 || groups[0].Holds[0].Names != 100 {
		t.Fatalf("/debug/groups: %+v", groups)
	}
	// GET /debug/guard/holds lists what a release would end.
	var holds []debugHold
	getJSON(t, r, "/debug/guard/holds?type=endpoints", &holds)
	if len(holds) != 1 || holds[0].Group != keyOf("c1") || holds[0].Type != resourcev3.EndpointType || holds[0].Names != 100 {
		t.Fatalf("/debug/guard/holds: %+v", holds)
	}
	getJSON(t, r, "/debug/guard/holds?type=clusters", &holds)
	if len(holds) != 0 {
		t.Fatalf("/debug/guard/holds?type=clusters: %+v", holds)
	}
	// A new client is still served the held resources.
	subscribeAll(t, r, "late", names)

	if got := postRelease(t, r, "?group="+url.QueryEscape(keyOf("c1"))+"&type=endpoints"); len(got) != 1 || got[0].Names != 100 {
		t.Fatalf("released %+v", got)
	}
	getJSON(t, r, "/debug/guard/holds", &holds)
	if len(holds) != 0 {
		t.Fatalf("/debug/guard/holds after the release: %+v", holds)
	}
	removed := 0
	for removed < 100 {
		removed += len(s.recv().GetRemovedResources())
	}
	if !strings.Contains(getMetrics(t, r), `xdsrelay_guard_hold_ends_total{reason="released",type="ClusterLoadAssignment"} 1`) {
		t.Error("the release is not counted")
	}
}

// Below guard.min_resources, and below the fraction, removals pass at once.
func TestGuardLetsSmallRemovalsPass(t *testing.T) {
	for _, tc := range []struct {
		name          string
		total, remove int
	}{{"below min_resources", 9, 9}, {"below the fraction", 20, 10}} {
		t.Run(tc.name, func(t *testing.T) {
			cp := testcp.Start(t)
			rs, names := endpoints(tc.total)
			cp.Set(t, "c1", "1", rs...)
			r := startRelay(t, cp.Addr)
			s := subscribeAll(t, r, "n", names)
			cp.Set(t, "c1", "2", rs[tc.remove:]...)
			if got := len(s.recv().GetRemovedResources()); got != tc.remove {
				t.Fatalf("%d removed, want %d", got, tc.remove)
			}
		})
	}
}

// The classic case: a control plane restarts and briefly serves an empty
// state. The guard holds the removal, the fleet never sees it, and the
// hold ends by itself when the control plane sends the resources again.
func TestGuardHoldsAnEmptyRestart(t *testing.T) {
	cp := testcp.Start(t)
	rs, names := endpoints(50)
	cp.Set(t, "c1", "1", rs...)
	r := startRelay(t, cp.Addr, fastReconnect)
	s := subscribeAll(t, r, "n", names)

	cp.Stop()
	cp.Set(t, "c1", "2") // it comes back empty
	cp.Restart()
	eventually(t, "the guard to hold the empty state", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_guard_holds_total{type="ClusterLoadAssignment"} 1`)
	})
	cp.Set(t, "c1", "3", rs...) // and then serves its state again
	eventually(t, "the hold to end", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_guard_hold_ends_total{reason="resent",type="ClusterLoadAssignment"} 1`)
	})
	// Whatever reached the client meanwhile (nothing, as the versions are
	// the same again) removed nothing.
	for quiet := time.After(300 * time.Millisecond); ; {
		select {
		case resp := <-s.resps:
			if len(resp.GetRemovedResources()) > 0 {
				t.Fatalf("the client saw removals: %v", resp.GetRemovedResources())
			}
			s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
			continue
		case <-quiet:
		}
		break
	}
	if !strings.HasPrefix(readyz(t, r), "ready") || strings.Contains(readyz(t, r), "DEGRADED") {
		t.Errorf("/readyz after the hold ended:\n%s", readyz(t, r))
	}
}

// The release endpoint refuses what it cannot act on, naming it.
func TestGuardReleaseErrors(t *testing.T) {
	cp := testcp.Start(t)
	r := startRelay(t, cp.Addr)
	for query, want := range map[string]int{"?type=bogus": http.StatusBadRequest, "?group=nope": http.StatusNotFound, "": http.StatusOK} {
		resp, err := http.Post("http://"+r.AdminAddr()+"/debug/guard/release"+query, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("release%s: %d, want %d", query, resp.StatusCode, want)
		}
	}
}

// A control plane that read its input mid-write removes every Listener
// and sends them again moments later (Envoy Gateway, 130 ms): two
// Listeners, below guard.min_resources, so the mass guard lets it
// through; the wipe hold keeps them, and an Envoy-like SotW wildcard
// client never sees the gap. A wipe that stays is applied once
// guard.wipe_hold passes. Both are counted.
func TestGuardHoldsAWipe(t *testing.T) {
	listeners := []types.Resource{testcp.Listener("l1", "r1"), testcp.Listener("l2", "r1")}
	for _, tc := range []struct {
		name     string
		wipeHold time.Duration
		back     bool // the control plane sends the Listeners again
		reason   string
	}{
		{"resent", time.Minute, true, "resent"},
		{"expired", 300 * time.Millisecond, false, "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := testcp.Start(t)
			cp.Set(t, "c1", "1", listeners...)
			r := startRelay(t, cp.Addr, func(c *Config) { c.Guard.WipeHold = tc.wipeHold })
			waitMetric(t, r, `xdsrelay_guard_wipe_holds_total{reason="`+tc.reason+`",type="Listener"} 0`)
			s := openSotW(t, r.Addr())
			s.send(&discoverypb.DiscoveryRequest{Node: node("envoy-1", "c1"), TypeUrl: resourcev3.ListenerType})
			resp := s.recv()
			if got := resourceNames(t, resp); len(got) != 2 {
				t.Fatalf("first response: %v", got)
			}
			s.send(&discoverypb.DiscoveryRequest{TypeUrl: resourcev3.ListenerType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})

			cp.Set(t, "c1", "2") // every Listener removed
			if tc.back {
				eventually(t, "the wipe to be held", func() bool { return len(r.groupCache(keyOf("c1")).Holds()) == 1 })
				if d := readyz(t, r); !strings.Contains(d, "DEGRADED: guard holding the removal of every Listener (2)") {
					t.Errorf("/readyz during the wipe hold: %q", d)
				}
				var groups []debugGroup
				getJSON(t, r, "/debug/groups", &groups)
				if len(groups) != 1 || len(groups[0].Holds) != 1 || !groups[0].Holds[0].Wipe {
					t.Errorf("/debug/groups during the wipe hold: %+v", groups)
				}
				cp.Set(t, "c1", "3", listeners...)
				waitMetric(t, r, `xdsrelay_guard_wipe_holds_total{reason="resent",type="Listener"} 1`)
				for len(s.resps) > 0 {
					if got := resourceNames(t, <-s.resps); len(got) != 2 {
						t.Fatalf("the client was sent %v during the wipe", got)
					}
				}
				return
			}
			resp = s.recv()
			if got := resourceNames(t, resp); len(got) != 0 {
				t.Fatalf("after guard.wipe_hold: %v, want the removal", got)
			}
			waitMetric(t, r, `xdsrelay_guard_wipe_holds_total{reason="expired",type="Listener"} 1`)
			if strings.Contains(getMetrics(t, r), `xdsrelay_guard_holds_total{type="Listener"} 1`) {
				t.Error("a wipe hold was counted as a mass removal's hold")
			}
		})
	}
}

// Where no one can release a hold (a default Kubernetes install: no
// admin.tls, and the local listener serves reads only), a relay started
// anew without cache.persist_dir holds nothing: it takes the control
// plane's state as it is, and its clients get the removal the old one
// holds (docs/kubernetes.md, "A hold in a default install").
func TestGuardHoldEndsWithARestart(t *testing.T) {
	cp := testcp.Start(t)
	rs, names := endpoints(20)
	cp.Set(t, "c1", "1", rs...)
	old := startRelay(t, cp.Addr)
	subscribeAll(t, old, "n", names)
	cp.Set(t, "c1", "2", rs[:5]...) // 15 of 20 removed: held
	eventually(t, "the guard to hold the removal", func() bool {
		return strings.Contains(getMetrics(t, old), `xdsrelay_guard_holds_total{type="ClusterLoadAssignment"} 1`)
	})

	restarted := startRelay(t, cp.Addr)
	s := openDelta(t, restarted.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names})
	got := map[string]bool{}
	for len(got) < 5 {
		resp := s.recv()
		for _, r := range resp.GetResources() {
			got[r.GetName()] = true
		}
		s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
	s.quiet(200 * time.Millisecond) // and nothing more: the 15 removed do not come
	if m := getMetrics(t, restarted); !strings.Contains(m, `xdsrelay_guard_holds_total{type="ClusterLoadAssignment"} 0`) {
		t.Errorf("the restarted relay holds something:\n%s", grepLines(m, "xdsrelay_guard_holds_total"))
	}
}

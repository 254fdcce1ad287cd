package relay

import (
	"slices"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// "Knowing When a Requested Resource Does Not Exist": go-control-plane never
// says a name does not exist, so a delta client subscribed to one that never
// arrives learns it from the does-not-exist timer (cache.not_found_timeout),
// in removed_resources; once the name appears, it is delivered as usual.
func TestNotFoundTimeoutWithGoControlPlane(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("present", "127.0.0.1:1"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Cache.NotFoundTimeout = 300 * time.Millisecond })
	s := openDelta(t, r.Addr())
	start := time.Now()
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"present", "missing"}})
	seen, removed := map[string]bool{}, []string{}
	for !seen["present"] || len(removed) == 0 {
		resp := s.recv()
		for _, n := range deltaNames(resp) {
			seen[n] = true
		}
		removed = append(removed, resp.GetRemovedResources()...)
	}
	if !slices.Equal(removed, []string{"missing"}) {
		t.Fatalf("removed %v, want [missing]", removed)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("reported missing after %v, before the timeout", took)
	}
	cp.Set(t, "c1", "2", testcp.Endpoints("present", "127.0.0.1:1"), testcp.Endpoints("missing", "127.0.0.1:2"))
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"missing"}) {
		t.Fatalf("once it exists: %v", got)
	}
}

// With the timer off (0), a name that never arrives is never reported.
func TestNotFoundTimeoutDisabled(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Endpoints("present", "127.0.0.1:1"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Cache.NotFoundTimeout = 0 })
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1"), TypeUrl: resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"present", "missing"}})
	if got := deltaNames(s.recv()); !slices.Equal(got, []string{"present"}) {
		t.Fatalf("first response: %v", got)
	}
	s.quiet(500 * time.Millisecond)
}

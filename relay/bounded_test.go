package relay

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// Admin bodies are bounded whatever clients put in their nodes: with 40
// groups whose node.cluster is 1 MiB each (40 MiB of group keys; and a
// quarter MiB each of node id, user agent and client features), every
// admin body is small, each group is shown by its id (GroupID) as the
// metrics' group label shows it, and the id names the group in the paths
// that take one.
func TestAdminBodiesBounded(t *testing.T) {
	// A few KiB a group at most, whatever its clients' nodes hold.
	const groups, keyBytes = 40, 1 << 20
	const bound = groups * 8 << 10
	r := startRelay(t, FilePrefix+t.TempDir())
	var first string
	var features []string // 256 KiB of client_features, which group_by names too
	for i := range 256 {
		features = append(features, fmt.Sprintf("%03d", i)+strings.Repeat("f", 1<<10))
	}
	for i := range groups {
		n := node(strings.Repeat("n", keyBytes/4), fmt.Sprintf("%02d", i)+strings.Repeat("x", keyBytes))
		n.UserAgentName, n.ClientFeatures = strings.Repeat("u", keyBytes/4), features
		s := openDelta(t, r.Addr())
		s.send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType})
		if i == 0 {
			first = GroupID(GroupKey(n, r.cfg.Upstream.GroupBy))
		}
	}
	eventually(t, "40 groups", func() bool { return len(r.snapshotGroups()) == groups })
	eventually(t, "40 clients", func() bool { return len(r.down.Clients(nil)) == groups })

	base := "http://" + r.AdminAddr()
	for _, c := range []struct {
		method, path string
		bound        int
	}{
		{http.MethodGet, "/", bound},
		{http.MethodGet, "/readyz", bound},
		{http.MethodGet, "/debug/groups", bound},
		{http.MethodGet, "/debug/clients", bound},
		{http.MethodGet, "/debug/convergence", bound},
		// Every family's series, a few dozen per group.
		{http.MethodGet, "/metrics", 1 << 20},
		{http.MethodPost, "/debug/guard/release", bound},
		{http.MethodPost, "/debug/rollout/release", bound},
		{http.MethodGet, "/debug/cache?type=" + url.QueryEscape(resourcev3.ClusterType) + "&group=" + url.QueryEscape(first), bound},
		{http.MethodPost, "/debug/guard/release?group=" + url.QueryEscape(first), bound},
	} {
		code, body := do(t, c.method, base+c.path, "")
		if code != http.StatusOK {
			t.Errorf("%s %s: %d %.200s", c.method, c.path, code, body)
		}
		if len(body) > c.bound {
			t.Errorf("%s %s: %d bytes, want at most %d", c.method, c.path, len(body), c.bound)
		}
		t.Logf("%s %s: %d bytes", c.method, c.path, len(body))
	}
	// A type that is not one, however long, is refused in a bounded body.
	huge := strings.Repeat("x", 1<<20)
	for _, path := range []string{"/debug/cache?group=" + url.QueryEscape(first) + "&type=" + huge, "/debug/guard/release?type=" + huge} {
		method := http.MethodGet
		if strings.HasPrefix(path, "/debug/guard/") {
			method = http.MethodPost
		}
		if code, body := do(t, method, base+path, ""); code != http.StatusBadRequest || len(body) > bound {
			t.Errorf("%s %.40s...: %d, %d bytes, want 400 in at most %d", method, path, code, len(body), bound)
		}
	}
	var gs []debugGroup
	getJSON(t, r, "/debug/groups", &gs)
	if len(gs) != groups || len(gs[0].ID) > IDMax || !strings.HasSuffix(gs[0].Key, "bytes)") {
		t.Fatalf("/debug/groups: %d groups, first %.80q, key %.80q", len(gs), gs[0].ID, gs[0].Key)
	}
	if !strings.Contains(readyz(t, r), fmt.Sprintf("group %q:", first)) {
		t.Errorf("/readyz does not show the group as %q", first)
	}
}

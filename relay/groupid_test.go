package relay

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

func TestGroupID(t *testing.T) {
	long := "cluster=envoy-gateway-system/eg,user_agent=envoy/1.31,client_features=envoy.lb.does_not_support_overprovisioning,envoy.lrs.supports_send_all_clusters"
	for _, tc := range []struct {
		key, want string
	}{
		{"cluster=load,user_agent=,client_features=", "cluster=load,user_agent=,client_features="},
		{"", ""},
		{long, "cluster=envoy-gateway-system/eg~"},
		// Characters a shell, a URL or a log line would quote are never
		// shown as they are: the id is hashed, and they read '_'.
		{"cluster=a b", "cluster=a_b~"},
		{"cluster=tab\there", "cluster=tab_here~"},
		{"id=sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local", "id=sidecar_10.0.0.1_pod.ns_ns.sv~"},
		{"cluster=" + strings.Repeat("é", 40), "cluster=________________________~"},
	} {
		got := GroupID(tc.key)
		if !strings.HasSuffix(tc.want, "~") {
			if got != tc.want {
				t.Errorf("GroupID(%q) = %q, want the key", tc.key, got)
			}
			continue
		}
		prefix, hash, ok := strings.Cut(got, "~")
		if !ok || prefix+"~" != tc.want || len(hash) != idHash || len(got) > IDMax {
			t.Errorf("GroupID(%q) = %q, want %q and %d hex digits, at most %d bytes", tc.key, got, tc.want, idHash, IDMax)
		}
		// The hash is the one the group's saved cache file is named by.
		if file := filepath.Base(persistFile("", tc.key)); !strings.HasPrefix(file, "group-"+hash) {
			t.Errorf("GroupID(%q) = %q, its saved cache %s", tc.key, got, file)
		}
		if GroupID(tc.key) != got {
			t.Errorf("GroupID(%q) is not stable", tc.key)
		}
	}
	if a, b := GroupID(long), GroupID(long+"x"); a == b {
		t.Errorf("two keys, one id %q", a)
	}
}

// envoyFeatured is Envoy's node (envoyNode) in cluster, with the features
// an Envoy of a recent release announces.
func envoyFeatured(id, cluster string) *corepb.Node {
	n := envoyNode(id)
	n.Cluster = cluster
	n.ClientFeatures = []string{"envoy.lb.does_not_support_overprovisioning", "envoy.lrs.supports_send_all_clusters"}
	return n
}

// A group whose key is longer than an id is one name everywhere: the log
// lines about it, the metrics' group label, /readyz, every /debug/ path,
// and the paths that take a group; /debug/groups maps that id to the whole
// key, its clients and its upstream.
func TestGroupOneName(t *testing.T) {
	cp := testcp.Start(t)
	n := envoyFeatured("envoy-1", "envoy-gateway-system/eg")
	key := GroupKey(n, Default().Upstream.GroupBy)
	id := GroupID(key)
	if !strings.Contains(id, "~") {
		t.Fatalf("the key %q is its own id: the test needs a longer one", key)
	}
	cp.Set(t, "envoy-gateway-system/eg", "1", testcp.Cluster("c0"))
	logs := &logBuffer{}
	r := startRelayLogged(t, cp.Addr, slog.New(slog.NewJSONHandler(logs, nil)))
	s := openDelta(t, r.Addr())
	s.send(&discoverypb.DeltaDiscoveryRequest{Node: n, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"c0"}})
	s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: s.recv().GetNonce()})

	started := logs.Lines(t, "group started")
	if len(started) != 1 || started[0]["group"] != id || started[0]["key"] != key {
		t.Fatalf("group started: %v, want group %q and key %q", started, id, key)
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, `"group":`) && !strings.Contains(line, `"group":"`+id+`"`) {
			t.Errorf("a log line names the group otherwise: %s", line)
		}
	}

	mfs := scrape(t, r)
	if got := value(mfs, "xdsrelay_upstream_connected", map[string]string{"group": id}); got != 1 {
		t.Errorf("xdsrelay_upstream_connected{group=%q} = %v, want 1", id, got)
	}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "group" && l.GetValue() != id {
					t.Errorf("%s{group=%q}, want %q", name, l.GetValue(), id)
				}
			}
		}
	}
	if rz := readyz(t, r); !strings.Contains(rz, fmt.Sprintf("group %q:", id)) {
		t.Errorf("/readyz does not name the group %q:\n%s", id, rz)
	}

	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) != 1 || groups[0].ID != id || groups[0].Key != key || groups[0].Clients != 1 ||
		len(groups[0].Upstreams) != 1 || groups[0].Upstreams[0].Server != cp.Addr {
		t.Fatalf("/debug/groups: %+v, want %q for %q, 1 client, upstream %s", groups, id, key, cp.Addr)
	}
	var clients []debugClient
	getJSON(t, r, "/debug/clients", &clients)
	if len(clients) != 1 || clients[0].Group != id {
		t.Errorf("/debug/clients: %+v", clients)
	}
	var conv DebugConvergence
	getJSON(t, r, "/debug/convergence", &conv)
	if len(conv.Summary) != 1 || conv.Summary[0].Group != id || len(conv.Resources) != 1 || conv.Resources[0].Group != id {
		t.Errorf("/debug/convergence: %+v", conv)
	}
	for _, name := range []string{id, key} {
		var res []debugResource
		getJSON(t, r, "/debug/cache?type=clusters&group="+url.QueryEscape(name), &res)
		if len(res) != 1 || res[0].Name != "c0" {
			t.Errorf("/debug/cache?group=%q: %+v", name, res)
		}
	}
	if code, body := do(t, http.MethodPost, "http://"+r.AdminAddr()+"/debug/guard/release?group="+url.QueryEscape(id), ""); code != http.StatusOK {
		t.Errorf("guard release of group %q: %d %s", id, code, body)
	}
}

package relay

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	adminpb "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/envoysim"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// dumpOf is one stream's config dump, decoded: its typed dumps by the
// short name of their message, and the CSDS generic entries.
type dumpOf struct {
	group, variant string
	typed          map[string]proto.Message
	generic        []*statuspb.ClientConfig_GenericXdsConfig
}

// configDump calls GET /debug/config_dump?node=id&query and decodes each
// stream's dump as Envoy's tools would: protojson into
// envoy.admin.v3.ConfigDump.
func configDump(t *testing.T, r *Relay, id, query string) []dumpOf {
	t.Helper()
	var out DebugConfigDump
	getJSON(t, r, "/debug/config_dump?node="+url.QueryEscape(id)+query, &out)
	if out.Node != id {
		t.Fatalf("config dump of %q answered for %q", id, out.Node)
	}
	var dumps []dumpOf
	for _, s := range out.Streams {
		var cd adminpb.ConfigDump
		if err := protojson.Unmarshal(s.ConfigDump, &cd); err != nil {
			t.Fatalf("config dump is not an envoy.admin.v3.ConfigDump: %v\n%s", err, s.ConfigDump)
		}
		d := dumpOf{group: s.Group, variant: s.Variant, typed: map[string]proto.Message{}}
		for _, a := range cd.GetConfigs() {
			m, err := a.UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			if cc, ok := m.(*statuspb.ClientConfig); ok {
				d.generic = cc.GetGenericXdsConfigs()
				continue
			}
			d.typed[string(m.ProtoReflect().Descriptor().Name())] = m
		}
		dumps = append(dumps, d)
	}
	return dumps
}

// sameBody reports whether a dump's body is the resource m.
func sameBody(t *testing.T, body *anypb.Any, m proto.Message) bool {
	t.Helper()
	if body == nil {
		return false
	}
	got, err := body.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	return proto.Equal(got, m)
}

// GET /debug/config_dump shows what one Envoy (simulated on the wire, delta
// ADS) holds through the relay, in the form of Envoy's own /config_dump:
// its Listener, Route, Cluster and endpoints, each the body the control
// plane sent, ACKED, with the version it was sent; the group and variant
// of its stream. ?type= narrows it to one type.
func TestConfigDumpOfAnEnvoy(t *testing.T) {
	cp := testcp.Start(t)
	listener, route, cluster, cla := testcp.Listener("ingress", "ingress-route"), testcp.Route("ingress-route", "app"),
		testcp.Cluster("app"), testcp.Endpoints("app", "10.0.0.1:80")
	cp.Set(t, "c1", "1", listener, route, cluster, cla)
	r := startRelay(t, cp.Addr)
	sim := startSim(t, r.Addr(), envoysim.Options{Node: envoyNode("envoy-1"), Delta: true, Listeners: true})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := sim.WaitState(ctx, func(s envoysim.State) bool {
		l, ok := s.Listeners["ingress"]
		return ok && l.Serving && !l.Warming && s.Clusters["app"].Endpoints != nil
	}); err != nil {
		t.Fatal(err)
	}
	var dumps []dumpOf
	eventually(t, "every resource ACKED in the config dump", func() bool {
		dumps = configDump(t, r, "envoy-1", "")
		if len(dumps) != 1 || len(dumps[0].generic) > 0 {
			return false
		}
		cds, _ := dumps[0].typed["ClustersConfigDump"].(*adminpb.ClustersConfigDump)
		eds, _ := dumps[0].typed["EndpointsConfigDump"].(*adminpb.EndpointsConfigDump)
		lds, _ := dumps[0].typed["ListenersConfigDump"].(*adminpb.ListenersConfigDump)
		rds, _ := dumps[0].typed["RoutesConfigDump"].(*adminpb.RoutesConfigDump)
		return len(cds.GetDynamicActiveClusters()) == 1 && cds.GetDynamicActiveClusters()[0].GetClientStatus() == adminpb.ClientResourceStatus_ACKED &&
			len(eds.GetDynamicEndpointConfigs()) == 1 && eds.GetDynamicEndpointConfigs()[0].GetClientStatus() == adminpb.ClientResourceStatus_ACKED &&
			len(lds.GetDynamicListeners()) == 1 && lds.GetDynamicListeners()[0].GetClientStatus() == adminpb.ClientResourceStatus_ACKED &&
			len(rds.GetDynamicRouteConfigs()) == 1 && rds.GetDynamicRouteConfigs()[0].GetClientStatus() == adminpb.ClientResourceStatus_ACKED
	})
	d := dumps[0]
	if want := GroupID(GroupKey(envoyNode("envoy-1"), r.cfg.Upstream.GroupBy)); d.group != want || d.variant != "delta-ads" {
		t.Errorf("stream: group %q variant %q, want %q delta-ads", d.group, d.variant, want)
	}
	cds := d.typed["ClustersConfigDump"].(*adminpb.ClustersConfigDump)
	if c := cds.GetDynamicActiveClusters()[0]; !sameBody(t, c.GetCluster(), cluster) || c.GetVersionInfo() == "" || c.GetLastUpdated() == nil {
		t.Errorf("cluster: %v", c)
	}
	if e := d.typed["EndpointsConfigDump"].(*adminpb.EndpointsConfigDump).GetDynamicEndpointConfigs()[0]; !sameBody(t, e.GetEndpointConfig(), cla) {
		t.Errorf("endpoints: %v", e)
	}
	if l := d.typed["ListenersConfigDump"].(*adminpb.ListenersConfigDump).GetDynamicListeners()[0]; l.GetName() != "ingress" ||
		!sameBody(t, l.GetActiveState().GetListener(), listener) || l.GetActiveState().GetVersionInfo() == "" {
		t.Errorf("listener: %v", l)
	}
	if rc := d.typed["RoutesConfigDump"].(*adminpb.RoutesConfigDump).GetDynamicRouteConfigs()[0]; !sameBody(t, rc.GetRouteConfig(), route) {
		t.Errorf("route: %v", rc)
	}

	only := configDump(t, r, "envoy-1", "&type=cds")
	if len(only) != 1 || len(only[0].typed) != 1 || only[0].typed["ClustersConfigDump"] == nil {
		t.Errorf("?type=cds: %+v", only)
	}
	for query, want := range map[string]int{"": http.StatusBadRequest, "?node=nobody": http.StatusNotFound, "?node=envoy-1&type=nope": http.StatusBadRequest} {
		if code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/debug/config_dump"+query); code != want {
			t.Errorf("/debug/config_dump%s: %d %s, want %d", query, code, body, want)
		}
	}
}

// What has no body goes in the CSDS form: a name told it does not exist,
// and a NACKed one, with the client's error; the NACKed body is not shown
// (the client keeps an earlier version).
func TestConfigDumpNamesWithoutABody(t *testing.T) {
	r := csdsFixture(t)
	eventually(t, "the acker's and the nacker's dumps", func() bool {
		acker, nacker := configDump(t, r, "acker", ""), configDump(t, r, "nacker", "")
		if len(acker) != 1 || len(nacker) != 1 {
			return false
		}
		eds, _ := acker[0].typed["EndpointsConfigDump"].(*adminpb.EndpointsConfigDump)
		ackerOK := len(eds.GetDynamicEndpointConfigs()) == 1 && sameBody(t, eds.GetDynamicEndpointConfigs()[0].GetEndpointConfig(), testcp.Endpoints("e1", "10.0.0.1:80")) &&
			len(acker[0].generic) == 1 && acker[0].generic[0].GetName() == "missing" &&
			acker[0].generic[0].GetClientStatus() == adminpb.ClientResourceStatus_DOES_NOT_EXIST
		g := nacker[0].generic
		nackerOK := nacker[0].typed["EndpointsConfigDump"] == nil && len(g) == 1 && g[0].GetName() == "e1" &&
			g[0].GetClientStatus() == adminpb.ClientResourceStatus_NACKED && g[0].GetErrorState().GetDetails() == "bad endpoint e1" && g[0].GetXdsConfig() == nil
		return ackerOK && nackerOK
	})
}

// A config dump shows what each client was sent, not what the cache holds
// now: while a canary's NACK holds a change back, the canary's dump shows
// the change NACKED, and another client's the released version it holds.
func TestConfigDumpFollowsEachClient(t *testing.T) {
	cp, r, clients := heldRolloutFixture(t, 3)
	cp.Set(t, "c1", "2", appCluster(badTimeout), appEndpoints(1001))
	eventually(t, "the halt to be counted", func() bool {
		return strings.Contains(getMetrics(t, r), `xdsrelay_rollout_halts_total{type="Cluster"} 1`)
	})
	var canary, other string
	for _, c := range clients {
		if c.saw("cds:13s") {
			canary = c.id
		} else {
			other = c.id
		}
	}
	eventually(t, "the dumps of the canary and of another client", func() bool {
		c, o := configDump(t, r, canary, "&type=clusters"), configDump(t, r, other, "&type=clusters")
		if len(c) != 1 || len(o) != 1 {
			return false
		}
		nacked := slices.ContainsFunc(c[0].generic, func(g *statuspb.ClientConfig_GenericXdsConfig) bool {
			return g.GetName() == "app" && g.GetClientStatus() == adminpb.ClientResourceStatus_NACKED
		})
		cds, _ := o[0].typed["ClustersConfigDump"].(*adminpb.ClustersConfigDump)
		held := len(cds.GetDynamicActiveClusters()) == 1 && sameBody(t, cds.GetDynamicActiveClusters()[0].GetCluster(), appCluster(time.Second))
		return nacked && held
	})
}

// The config dump's JSON is Envoy's: a tool that reads Envoy's
// /config_dump (jq '.configs[] | select(."@type" | endswith("ClustersConfigDump"))')
// finds the clusters under the same keys.
func TestConfigDumpJSONIsEnvoys(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("app"), testcp.Endpoints("app", "10.0.0.1:80"))
	r := startRelay(t, cp.Addr)
	sim := startEnvoy(t, r.Addr(), false, false)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := sim.WaitFor(ctx, envoysim.Usable("app")); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Streams []struct {
			ConfigDump struct {
				Configs []map[string]json.RawMessage `json:"configs"`
			} `json:"config_dump"`
		} `json:"streams"`
	}
	// The dump says the version the client ACKed once the relay has read
	// the ACK, which may be after the Envoy has the cluster.
	eventually(t, "the Envoy's clusters in its dump, at the version it ACKed", func() bool {
		getJSON(t, r, "/debug/config_dump?node=envoy-1", &raw)
		if len(raw.Streams) != 1 {
			return false
		}
		for _, c := range raw.Streams[0].ConfigDump.Configs {
			if string(c["@type"]) == `"type.googleapis.com/envoy.admin.v3.ClustersConfigDump"` {
				return len(c["version_info"]) > 0 && string(c["version_info"]) != `""`
			}
		}
		return false
	})
	for _, c := range raw.Streams[0].ConfigDump.Configs {
		if string(c["@type"]) != `"type.googleapis.com/envoy.admin.v3.ClustersConfigDump"` {
			continue
		}
		var active []struct {
			Cluster map[string]json.RawMessage `json:"cluster"`
		}
		if err := json.Unmarshal(c["dynamic_active_clusters"], &active); err != nil || len(active) != 1 {
			t.Fatalf("dynamic_active_clusters: %v %s", err, c["dynamic_active_clusters"])
		}
		b, _ := json.Marshal(active[0].Cluster)
		var got clusterpb.Cluster
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &got); err != nil || got.GetName() != "app" {
			t.Fatalf("cluster %s: %v", b, err)
		}
		if _, ok := active[0].Cluster["connect_timeout"]; !ok {
			t.Fatalf("the cluster's fields are not the protos' names, as Envoy writes them: %s", b)
		}
		if string(c["version_info"]) == "" || string(c["version_info"]) == `""` {
			t.Errorf("ClustersConfigDump has no version_info (the version_info the SotW client last ACKed): %s", c["version_info"])
		}
		return
	}
	t.Fatalf("no ClustersConfigDump in %v", raw.Streams[0].ConfigDump.Configs)
}

// The admin endpoint never shows a private key: a Secret's body is left
// out of /debug/cache?bodies=true, as of the config dump.
func TestSecretsShownWithoutBodies(t *testing.T) {
	dir := t.TempDir()
	secret := "\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\nname: server-cert\ntls_certificate:\n  private_key: {inline_string: PRIVATE-KEY-BYTES}\n  certificate_chain: {inline_string: CERT-BYTES}\n"
	if err := os.WriteFile(filepath.Join(dir, "secret.yaml"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, FilePrefix+dir)
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("envoy-1", "c1"), TypeUrl: resourcev3.SecretType, ResourceNamesSubscribe: []string{"server-cert"}})
	resp := d.recv()
	d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, ResponseNonce: resp.GetNonce()})
	q := "/debug/cache?group=" + url.QueryEscape(keyOf("c1")) + "&type=secrets&bodies=true"
	var res []debugResource
	getJSON(t, r, q, &res)
	if len(res) != 1 || res[0].Name != "server-cert" || res[0].Resource != nil {
		t.Errorf("%s: %+v, want the Secret without its body", q, res)
	}
	eventually(t, "the Secret in envoy-1's config dump, without its body", func() bool {
		_, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+"/debug/config_dump?node=envoy-1")
		return strings.Contains(body, "SecretsConfigDump") && strings.Contains(body, "server-cert") && !strings.Contains(body, "PRIVATE-KEY")
	})
}

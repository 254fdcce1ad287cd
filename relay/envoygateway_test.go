package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/internal/envoysim"
	"github.com/xdsrelay/xdsrelay/internal/realcp"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Envoy Gateway v1.9.1, standalone (File provider, Host infrastructure),
// relayed in each dialect it serves: delta ADS, SotW ADS and the per-type
// services. Opt-in: set XDSRELAY_TEST_ENVOY_GATEWAY to its binary
// (realcp.EnvVar); run in a network namespace of its own where port 18000
// is taken (`unshare -n`). An Envoy (internal/envoysim, over delta ADS)
// behind the relay serves the quick start's Gateway, its route and its
// Backend's endpoints; a route added to Envoy Gateway's files reaches it,
// and once its file is removed, its Cluster leaves the Envoy.
func TestEnvoyGatewayInEachDialect(t *testing.T) {
	eg := realcp.StartEnvoyGateway(t, map[string]string{
		"gateway.yaml": realcp.Gateway,
		"backend.yaml": realcp.Route("backend", "www.example.com", 3002),
	})
	for _, d := range testcp.Dialects {
		t.Run(string(d), func(t *testing.T) {
			start := time.Now()
			r := startRelay(t, realcp.EnvoyGatewayAddr, func(c *Config) {
				c.Upstream.Protocol = string(d)
				c.Upstream.TLS = creds.TLS{CertFile: eg.CertFile, KeyFile: eg.KeyFile, CAFile: eg.CAFile, ServerName: eg.ServerName}
			})
			node := envoyNode("envoy-" + string(d))
			node.Cluster = realcp.EnvoyGatewayNodeCluster
			sim := startSim(t, r.Addr(), envoysim.Options{Node: node, Delta: true, Listeners: true})
			waitEnvoy(t, sim, "the Gateway's listener serving the route to backend", servesRoute("backend", "127.0.0.1", 3002))
			t.Logf("%s: the Envoy served the Gateway %v after the relay started", d, time.Since(start))
			if got := upstreamProtocol(t, r); got != string(d) {
				t.Errorf("/debug/groups says the upstream speaks %q, want %q", got, d)
			}

			extra := "extra-" + string(d)
			changed := time.Now()
			eg.Write(t, extra+".yaml", realcp.Route(extra, extra+".example.com", 3003))
			waitEnvoy(t, sim, "the added route", servesRoute(extra, "127.0.0.1", 3003))
			t.Logf("%s: a route added reached the Envoy in %v", d, time.Since(changed))
			changed = time.Now()
			eg.Remove(t, extra+".yaml")
			waitEnvoy(t, sim, "the removed route's Cluster to leave", func(s envoysim.State) bool {
				return clusterOf(s, extra) == "" && clusterOf(s, "backend") != ""
			})
			t.Logf("%s: a route removed left the Envoy in %v", d, time.Since(changed))
		})
	}
}

// clusterOf is the name of the Cluster the Envoy holds for Envoy Gateway's
// HTTPRoute route (httproute/NAMESPACE/NAME/rule/N); "" if none.
func clusterOf(s envoysim.State, route string) string {
	for name := range s.Clusters {
		if strings.HasPrefix(name, "httproute/") && strings.Contains(name, "/"+route+"/rule/") {
			return name
		}
	}
	return ""
}

// servesRoute reports that a serving Listener's route points at route's
// Cluster, usable, with an endpoint at host:port.
func servesRoute(route, host string, port uint32) func(envoysim.State) bool {
	return func(s envoysim.State) bool {
		c := clusterOf(s, route)
		if c == "" || !envoysim.Usable(c)(s.Clusters) {
			return false
		}
		routed := false
		for _, l := range s.Listeners {
			for _, rc := range l.Routes {
				routed = routed || l.Serving && strings.Contains(strings.Join(s.Routes[rc].Clusters, " "), c)
			}
		}
		for _, loc := range s.Clusters[c].Endpoints.GetEndpoints() {
			for _, e := range loc.GetLbEndpoints() {
				a := e.GetEndpoint().GetAddress().GetSocketAddress()
				if routed && a.GetAddress() == host && a.GetPortValue() == port {
					return true
				}
			}
		}
		return false
	}
}

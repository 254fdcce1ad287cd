package relay

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/xdsrelay/xdsrelay/internal/envoysim"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Make before break proven on an Envoy (docs/architecture.md, invariant 18
// "Make before break, whatever the order upstream"): envoysim with
// Listeners applies a RouteConfiguration as it arrives, as Envoy does
// (routes are not warmed: spec "Eventual consistency considerations"), and
// records every moment a serving Listener's route names a Cluster it does
// not serve. Through the relay, over delta and SotW ADS, whatever the
// control plane's dialect, it never records one, to a Cluster it lacks or
// to one still warming.

// envoyADS are the Envoy clients whose order the relay keeps: one ADS
// stream for every type (invariant 7 "Order is kept").
var envoyADS = []struct {
	name  string
	delta bool
}{{"sotw-ads", false}, {"delta-ads", true}}

// forEachEnvoy runs f for every control plane dialect and Envoy ADS
// variant.
func forEachEnvoy(t *testing.T, f func(t *testing.T, d testcp.Dialect, delta bool)) {
	forEachDialect(t, func(t *testing.T, d testcp.Dialect) {
		for _, e := range envoyADS {
			t.Run(e.name, func(t *testing.T) { f(t, d, e.delta) })
		}
	})
}

// startListeningEnvoy connects a simulated Envoy that subscribes Listeners
// and their Routes to the relay at addr.
func startListeningEnvoy(t *testing.T, addr string, delta bool) *envoysim.Client {
	t.Helper()
	return startSim(t, addr, envoysim.Options{Node: envoyNode("envoy-1"), Delta: delta, Listeners: true})
}

// waitEnvoy waits, bounded, until cond holds of sim's state.
func waitEnvoy(t *testing.T, sim *envoysim.Client, what string, cond func(envoysim.State) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := sim.WaitState(ctx, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// servingTo reports that listener l serves, warmed, on route r, held and
// pointing at cluster c, which is usable.
func servingTo(l, r, c string) func(envoysim.State) bool {
	return func(s envoysim.State) bool {
		li := s.Listeners[l]
		return li.Serving && !li.Warming && slices.Equal(li.Routes, []string{r}) &&
			slices.Equal(s.Routes[r].Clusters, []string{c}) && envoysim.Usable(c)(s.Clusters)
	}
}

// neverDangled fails the test if sim ever held a route to a Cluster it
// lacked or that still warmed: the relay keeps a Route out of the cache
// until the Cluster's endpoints are in it, and an ADS stream keeps the
// Route back behind a Cluster new to it until the client has answered the
// Clusters, having asked for and been sent their endpoints
// (downstream/warmorder.go).
func neverDangled(t *testing.T, sim *envoysim.Client) {
	t.Helper()
	if seen, n := sim.DanglingSeen(); n > 0 {
		t.Fatalf("the Envoy held %d dangling routes: %v", n, seen)
	}
}

// waitingAt waits until /debug/references shows, for the Envoy's group,
// every name in names waiting, of any type.
func waitingAt(t *testing.T, r *Relay, names ...string) {
	t.Helper()
	var refs debugReferences
	defer func() {
		if t.Failed() {
			t.Logf("/debug/references: %+v", refs)
		}
	}()
	eventually(t, fmt.Sprintf("the relay to hold %v waiting", names), func() bool {
		refs = envoyReferences(t, r)
		held := map[string]bool{}
		for _, w := range refs.Waiting {
			if !w.Removal && slices.Contains(names, w.Name) {
				held[w.Name] = true
			}
		}
		return len(held) == len(names)
	})
}

// envoyReferences is /debug/references for the Envoy's group.
func envoyReferences(t *testing.T, r *Relay) debugReferences {
	var refs debugReferences
	getJSON(t, r, "/debug/references?group="+url.QueryEscape(GroupKey(envoyNode("envoy-1"), Default().Upstream.GroupBy)), &refs)
	return refs
}

// removalHeld reports whether /debug/references shows, for the Envoy's
// group, the removal of name waiting.
func removalHeld(t *testing.T, r *Relay, name string) bool {
	refs := envoyReferences(t, r)
	return slices.ContainsFunc(refs.Waiting, func(w debugWaiting) bool { return w.Removal && w.Name == name })
}

// xOnly is the starting point: listener l loads route r, which points at
// cluster x; extra is added.
func xOnly(extra ...types.Resource) []types.Resource {
	return append([]types.Resource{testcp.Listener("l", "r"), testcp.Route("r", "x"), testcp.Cluster("x"), testcp.Endpoints("x", "127.0.0.1:1")}, extra...)
}

// The control plane points Route r, and a new Listener m's new Route s, at
// Cluster y before it publishes y: the Envoy never serves a route to y
// before it has y, and ends with both routes on a usable y.
func TestEnvoyRouteNeverPrecedesItsCluster(t *testing.T) {
	forEachEnvoy(t, func(t *testing.T, d testcp.Dialect, delta bool) {
		cp := testcp.StartDialect(t, d)
		cp.Set(t, "c1", "1", xOnly()...)
		r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = time.Minute })
		sim := startListeningEnvoy(t, r.Addr(), delta)
		waitEnvoy(t, sim, "l serving on r to x", servingTo("l", "r", "x"))

		cp.Set(t, "c1", "2", testcp.Listener("l", "r"), testcp.Route("r", "y"), testcp.Listener("m", "s"), testcp.Route("s", "y"),
			testcp.Cluster("x"), testcp.Endpoints("x", "127.0.0.1:1"))
		waitingAt(t, r, "r", "s")
		// m reaches the Envoy (a Listener waits for no Route) and warms.
		waitEnvoy(t, sim, "m warming", func(s envoysim.State) bool { return s.Listeners["m"].Warming })
		neverDangled(t, sim)

		cp.Set(t, "c1", "3", testcp.Listener("l", "r"), testcp.Route("r", "y"), testcp.Listener("m", "s"), testcp.Route("s", "y"),
			testcp.Cluster("x"), testcp.Endpoints("x", "127.0.0.1:1"), testcp.Cluster("y"), testcp.Endpoints("y", "127.0.0.1:2"))
		waitEnvoy(t, sim, "l and m serving to y", func(s envoysim.State) bool {
			return servingTo("l", "r", "y")(s) && servingTo("m", "s", "y")(s)
		})
		neverDangled(t, sim)
	})
}

// The control plane moves Route r off Cluster x to y and removes x, in one
// snapshot or x first: the Envoy never loses x while r points at it, and
// loses it once r has moved.
func TestEnvoyKeepsAClusterItsRouteNeeds(t *testing.T) {
	forEachEnvoy(t, func(t *testing.T, d testcp.Dialect, delta bool) {
		for _, xFirst := range []bool{false, true} {
			name := "together"
			if xFirst {
				name = "x-removed-first"
			}
			t.Run(name, func(t *testing.T) {
				cp := testcp.StartDialect(t, d)
				y := []types.Resource{testcp.Cluster("y"), testcp.Endpoints("y", "127.0.0.1:2")}
				cp.Set(t, "c1", "1", xOnly(y...)...)
				r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = time.Minute })
				sim := startListeningEnvoy(t, r.Addr(), delta)
				waitEnvoy(t, sim, "l serving on r to x, y usable", func(s envoysim.State) bool {
					return servingTo("l", "r", "x")(s) && envoysim.Usable("y")(s.Clusters)
				})

				if xFirst {
					cp.Set(t, "c1", "2", append([]types.Resource{testcp.Listener("l", "r"), testcp.Route("r", "x")}, y...)...)
					// The relay holds the removal, or the Envoy loses x.
					eventually(t, "the relay to hold x's removal, or the Envoy to lose x", func() bool {
						return removalHeld(t, r, "x") || !envoysim.Usable("x")(sim.Clusters())
					})
					if !envoysim.Usable("x")(sim.Clusters()) {
						seen, _ := sim.DanglingSeen()
						t.Fatalf("the Envoy lost x while r points at it: %v", seen)
					}
				}
				cp.Set(t, "c1", "3", append([]types.Resource{testcp.Listener("l", "r"), testcp.Route("r", "y")}, y...)...)
				waitEnvoy(t, sim, "l serving on r to y, x gone", func(s envoysim.State) bool {
					_, x := s.Clusters["x"]
					return servingTo("l", "r", "y")(s) && !x
				})
				neverDangled(t, sim)
			})
		}
	})
}

// With consistency.max_wait: 0 the relay passes the control plane's order
// on: the route to y reaches the Envoy before y, and dangles. (The tests
// above can fail.)
func TestEnvoyRouteDanglesWithConsistencyOff(t *testing.T) {
	for _, e := range envoyADS {
		t.Run(e.name, func(t *testing.T) {
			cp := testcp.Start(t)
			cp.Set(t, "c1", "1", xOnly()...)
			r := startRelay(t, cp.Addr, func(c *Config) { c.Consistency.MaxWait = 0 })
			sim := startListeningEnvoy(t, r.Addr(), e.delta)
			waitEnvoy(t, sim, "l serving on r to x", servingTo("l", "r", "x"))

			cp.Set(t, "c1", "2", testcp.Listener("l", "r"), testcp.Route("r", "y"), testcp.Cluster("x"), testcp.Endpoints("x", "127.0.0.1:1"))
			waitEnvoy(t, sim, "r to y", func(s envoysim.State) bool { return slices.Equal(s.Routes["r"].Clusters, []string{"y"}) })
			if d := sim.Dangling(); len(d) != 1 || d[0].Route != "r" || d[0].Cluster != "y" {
				t.Fatalf("dangling %v, want l/r->y", d)
			}

			cp.Set(t, "c1", "3", testcp.Listener("l", "r"), testcp.Route("r", "y"), testcp.Cluster("x"), testcp.Endpoints("x", "127.0.0.1:1"),
				testcp.Cluster("y"), testcp.Endpoints("y", "127.0.0.1:2"))
			waitEnvoy(t, sim, "l serving on r to y", servingTo("l", "r", "y"))
			if d := sim.Dangling(); len(d) != 0 {
				t.Fatalf("still dangling %v", d)
			}
		})
	}
}

package envoysim

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"time"

	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// Listener is what the client knows of one Listener.
type Listener struct {
	Name string
	// Routes are the RouteConfigurations the newest version loads by RDS,
	// sorted; Inline lists the Clusters its inline route_configs name.
	Routes, Inline []string
	// Updated is when the newest version arrived; Warming reports that a
	// RouteConfiguration it loads has not been held since.
	Updated time.Time
	Warming bool
	// Serving reports that a version serves: the newest, or, while it
	// warms, the one before it.
	Serving bool
}

// Route is what the client holds of one RouteConfiguration.
type Route struct {
	Name string
	// Clusters are the Clusters its routes name (cluster,
	// weighted_clusters), sorted.
	Clusters []string
	Updated  time.Time
}

// State is all the client knows.
type State struct {
	Clusters  map[string]Cluster
	Listeners map[string]Listener
	Routes    map[string]Route
}

// Dangling is a serving Listener's route to a Cluster the client does not
// serve: absent, or new and still warming.
type Dangling struct {
	Listener string
	Route    string // the RouteConfiguration; "" for an inline one
	Cluster  string
	// Warming reports that the Cluster was held, new and warming, when
	// the reference began; else it was absent.
	Warming bool
	At      time.Time // when it began
}

func (d Dangling) String() string {
	route := d.Route
	if route == "" {
		route = "(inline)"
	}
	state := "absent"
	if d.Warming {
		state = "warming"
	}
	return fmt.Sprintf("%s/%s->%s (%s) at %s", d.Listener, route, d.Cluster, state, d.At.Format("15:04:05.000000"))
}

// maxSeen bounds the dangling references DanglingSeen keeps.
const maxSeen = 1024

// listenerState is a Listener's serving version and the newer one that
// warms, if any (Envoy's active and warming listeners).
type listenerState struct {
	serving, warming *listenerVersion
}

type listenerVersion struct {
	raw     []byte
	routes  []string // loaded by RDS, sorted
	inline  []string // Clusters of inline route configs, sorted
	updated time.Time
}

// newest is the version that warms, else the one that serves.
func (ls *listenerState) newest() *listenerVersion {
	if ls.warming != nil {
		return ls.warming
	}
	return ls.serving
}

// State returns a copy of what the client knows.
func (c *Client) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stateLocked()
}

func (c *Client) stateLocked() State {
	st := State{Clusters: make(map[string]Cluster, len(c.clusters)), Listeners: make(map[string]Listener, len(c.listeners)),
		Routes: make(map[string]Route, len(c.routes))}
	for n, cs := range c.clusters {
		st.Clusters[n] = cs.Cluster
	}
	for n, ls := range c.listeners {
		v := ls.newest()
		st.Listeners[n] = Listener{Name: n, Routes: v.routes, Inline: v.inline, Updated: v.updated,
			Warming: ls.warming != nil, Serving: ls.serving != nil}
	}
	for n, r := range c.routes {
		st.Routes[n] = *r
	}
	return st
}

// Dangling returns the dangling references the client holds now.
func (c *Client) Dangling() []Dangling {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.dangling)
}

// DanglingSeen returns every dangling reference that began since the
// client started (the first maxSeen), and how many began.
func (c *Client) DanglingSeen() ([]Dangling, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.seen), c.seenTotal
}

// changedLocked records the dangling references after a change and wakes
// the waiters.
func (c *Client) changedLocked(now time.Time) {
	if len(c.listeners) == 0 && len(c.dangling) == 0 {
		c.notifyLocked() // nothing serves: nothing to walk (clusters alone)
		return
	}
	was := map[[3]string]Dangling{}
	for _, d := range c.dangling {
		was[[3]string{d.Listener, d.Route, d.Cluster}] = d
	}
	c.dangling = c.dangling[:0:0]
	for _, ln := range slices.Sorted(maps.Keys(c.listeners)) {
		v := c.listeners[ln].serving
		if v == nil {
			continue
		}
		add := func(route string, clusters []string) {
			for _, cl := range clusters {
				cs := c.clusters[cl]
				if cs != nil && cs.serving {
					continue
				}
				d, ok := was[[3]string{ln, route, cl}]
				if !ok {
					d = Dangling{Listener: ln, Route: route, Cluster: cl, Warming: cs != nil, At: now}
					c.seenTotal++
					if len(c.seen) < maxSeen {
						c.seen = append(c.seen, d)
					}
				}
				c.dangling = append(c.dangling, d)
			}
		}
		add("", v.inline)
		for _, rn := range v.routes {
			if r := c.routes[rn]; r != nil {
				add(rn, r.Clusters)
			}
		}
	}
	c.notifyLocked()
}

// listenersDue reports that the client subscribes Listeners and its
// cluster manager has initialized: the first CDS response arrived and no
// cluster warms.
func (c *Client) listenersDue() bool {
	if !c.opts.Listeners {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.cdsInit {
		return false
	}
	for _, cs := range c.clusters {
		if cs.Warming {
			return false
		}
	}
	return true
}

// onListeners applies an LDS response: resources the Listeners now are
// (SotW: all of them, delta: those that changed), removed the names gone.
// It returns the RouteConfigurations the Listeners load, sorted.
func (c *Client) onListeners(rs []*anypb.Any, removed []string, full bool) ([]string, error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	for _, a := range rs {
		var l listenerpb.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			return nil, fmt.Errorf("envoysim: listener: %w", err)
		}
		seen[l.GetName()] = true
		ls := c.listeners[l.GetName()]
		if ls == nil {
			ls = &listenerState{}
			c.listeners[l.GetName()] = ls
		}
		if v := ls.newest(); v != nil && bytes.Equal(v.raw, a.GetValue()) {
			continue // the same listener: Envoy keeps it as it is
		}
		v, err := readListener(&l)
		if err != nil {
			return nil, err
		}
		v.raw, v.updated = a.GetValue(), now
		ls.warming = v
	}
	// A removed Listener stops at once (it drains, taking no new
	// requests).
	for _, n := range removed {
		delete(c.listeners, n)
	}
	if full {
		maps.DeleteFunc(c.listeners, func(n string, _ *listenerState) bool { return !seen[n] })
	}
	return c.warmedLocked(now), nil
}

// onRoutes applies an RDS response: each RouteConfiguration subscribed
// applies as it arrives, routes are not warmed (spec "Eventual consistency
// considerations"); Listeners that waited for it finish warming. It
// returns the RouteConfigurations the Listeners now load, sorted.
func (c *Client) onRoutes(rs []*anypb.Any) ([]string, error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	want := c.routeNamesLocked()
	for _, a := range rs {
		var rc routepb.RouteConfiguration
		if err := a.UnmarshalTo(&rc); err != nil {
			return nil, fmt.Errorf("envoysim: route: %w", err)
		}
		if !slices.Contains(want, rc.GetName()) {
			continue // not watched: a SotW server may send more
		}
		c.routes[rc.GetName()] = &Route{Name: rc.GetName(), Clusters: routeClusters(&rc), Updated: now}
	}
	return c.warmedLocked(now), nil
}

// warmedLocked finishes the warming of every Listener whose routes are
// held (spec "Resource warming"; one held from before counts, as Envoy's
// notes there say), replacing the version that served; it drops the routes no
// Listener loads any more (Envoy drops a route subscription with its last
// Listener), records the change and returns the routes to subscribe.
func (c *Client) warmedLocked(now time.Time) []string {
	for _, ls := range c.listeners {
		if v := ls.warming; v != nil && !slices.ContainsFunc(v.routes, func(r string) bool { return c.routes[r] == nil }) {
			ls.serving, ls.warming = v, nil
		}
	}
	names := c.routeNamesLocked()
	maps.DeleteFunc(c.routes, func(n string, _ *Route) bool { return !slices.Contains(names, n) })
	c.changedLocked(now)
	return names
}

// routeNamesLocked are the RouteConfigurations the Listeners' versions
// load by RDS, serving or warming, sorted.
func (c *Client) routeNamesLocked() []string {
	set := map[string]bool{}
	for _, ls := range c.listeners {
		for _, v := range []*listenerVersion{ls.serving, ls.warming} {
			if v != nil {
				for _, r := range v.routes {
					set[r] = true
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// readListener reads the routes of a Listener's HttpConnectionManagers:
// its API listener's, and those of its filter chains.
func readListener(l *listenerpb.Listener) (*listenerVersion, error) {
	v := &listenerVersion{}
	routes, inline := map[string]bool{}, map[string]bool{}
	read := func(a *anypb.Any) error {
		if a == nil || !a.MessageIs(&hcmpb.HttpConnectionManager{}) {
			return nil
		}
		var hcm hcmpb.HttpConnectionManager
		if err := a.UnmarshalTo(&hcm); err != nil {
			return fmt.Errorf("envoysim: listener %s: %w", l.GetName(), err)
		}
		if n := hcm.GetRds().GetRouteConfigName(); n != "" {
			routes[n] = true
		}
		if rc := hcm.GetRouteConfig(); rc != nil {
			for _, cl := range routeClusters(rc) {
				inline[cl] = true
			}
		}
		return nil
	}
	if err := read(l.GetApiListener().GetApiListener()); err != nil {
		return nil, err
	}
	chains := slices.Clone(l.GetFilterChains())
	if d := l.GetDefaultFilterChain(); d != nil {
		chains = append(chains, d)
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			if err := read(f.GetTypedConfig()); err != nil {
				return nil, err
			}
		}
	}
	v.routes, v.inline = slices.Sorted(maps.Keys(routes)), slices.Sorted(maps.Keys(inline))
	return v, nil
}

// routeClusters are the Clusters a RouteConfiguration's routes name,
// sorted.
func routeClusters(rc *routepb.RouteConfiguration) []string {
	set := map[string]bool{}
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			a := r.GetRoute()
			if n := a.GetCluster(); n != "" {
				set[n] = true
			}
			for _, wc := range a.GetWeightedClusters().GetClusters() {
				set[wc.GetName()] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

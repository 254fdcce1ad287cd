package xds

import (
	"slices"
	"strings"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	// Registered so that resources of every relayed type can be decoded.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/service/runtime/v3"
)

// LbEndpointType is the LEDS type URL, which resource/v3 does not name.
const LbEndpointType = resourcev3.APITypePrefix + "envoy.config.endpoint.v3.LbEndpoint"

// Types are the resource types the relay carries, in the order in which a
// change to several of them is sent on an ADS stream when upstream sent them
// together: make before break ("Eventual consistency considerations").
var Types = []string{
	resourcev3.ClusterType,
	resourcev3.EndpointType,
	LbEndpointType,
	resourcev3.ListenerType,
	resourcev3.RouteType,
	resourcev3.ScopedRouteType,
	resourcev3.VirtualHostType,
	resourcev3.SecretType,
	resourcev3.RuntimeType,
	resourcev3.ExtensionConfigType,
}

var known = func() map[string]int {
	m := make(map[string]int, len(Types))
	for i, t := range Types {
		m[t] = i
	}
	return m
}()

// Known reports whether the relay carries resources of typeURL.
func Known(typeURL string) bool {
	_, ok := known[typeURL]
	return ok
}

// Canonical returns the relay's own copy of a known type URL, and typeURL
// itself otherwise. A type URL decoded from a request or a response is a
// string of its own; keys that share the one copy compare by pointer, so a
// lookup by type URL in a stream's maps does not read that stream's copy
// (a cache miss per lookup when a change reaches many streams).
func Canonical(typeURL string) string {
	if r, ok := known[typeURL]; ok {
		return Types[r]
	}
	return typeURL
}

// Rank orders type URLs make-before-break; unknown types rank last.
func Rank(typeURL string) int {
	if r, ok := known[typeURL]; ok {
		return r
	}
	return len(Types)
}

// FullState reports whether SotW responses of typeURL carry the complete
// state of the world, so that omission means deletion: Listener and Cluster
// ("Grouping Resources into Responses", "Deleting Resources").
func FullState(typeURL string) bool {
	return typeURL == resourcev3.ListenerType || typeURL == resourcev3.ClusterType
}

// ShortName is a type URL's message name without its package, for logs and
// metric labels ("Cluster", "ClusterLoadAssignment").
func ShortName(typeURL string) string {
	if i := strings.LastIndexByte(typeURL, '.'); i >= 0 {
		return typeURL[i+1:]
	}
	return typeURL
}

// shortNames are the REST short names of the types, as configuration names
// them (upstreams[].types): the last part of the REST-JSON path
// (/v3/discovery:clusters), and lb-endpoints for LEDS.
var shortNames = map[string]string{
	"listeners":         resourcev3.ListenerType,
	"routes":            resourcev3.RouteType,
	"scoped-routes":     resourcev3.ScopedRouteType,
	"virtual-hosts":     resourcev3.VirtualHostType,
	"clusters":          resourcev3.ClusterType,
	"endpoints":         resourcev3.EndpointType,
	"lb-endpoints":      LbEndpointType,
	"secrets":           resourcev3.SecretType,
	"runtime":           resourcev3.RuntimeType,
	"extension_configs": resourcev3.ExtensionConfigType,
}

// TypeNamed returns the type URL that s names: a REST short name
// (clusters, secrets, ...) or a type URL the relay carries.
func TypeNamed(s string) (string, bool) {
	if t, ok := shortNames[s]; ok {
		return t, true
	}
	return s, Known(s)
}

// TypeShortNames lists the REST short names TypeNamed takes, for errors.
func TypeShortNames() []string {
	out := make([]string, 0, len(shortNames))
	for n := range shortNames {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// XdstpPrefix starts a resource name in the xdstp scheme ("xDS Resource
// Names"): xdstp://AUTHORITY/TYPE/ID.
const XdstpPrefix = "xdstp://"

// Authority returns the authority of an xdstp name; ok is false for a name
// that is not one. The authority may be empty (xdstp:///TYPE/ID).
func Authority(name string) (authority string, ok bool) {
	rest, ok := strings.CutPrefix(name, XdstpPrefix)
	if !ok {
		return "", false
	}
	authority, _, _ = strings.Cut(rest, "/")
	return authority, true
}

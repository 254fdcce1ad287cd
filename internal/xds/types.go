package xds

import (
	"fmt"
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

// typeNames are the names besides its URL that each type goes by, in
// Types' order: its message name (ShortName: metrics, logs), its xDS
// abbreviation (the discovery service: CDS, as status prints it) and its
// REST short name (the last part of the REST-JSON path /v3/discovery:clusters,
// lb-endpoints for LEDS; upstreams[].types). ParseType takes any of them.
var typeNames = []struct{ typeURL, abbrev, rest string }{
	{resourcev3.ClusterType, "CDS", "clusters"},
	{resourcev3.EndpointType, "EDS", "endpoints"},
	{LbEndpointType, "LEDS", "lb-endpoints"},
	{resourcev3.ListenerType, "LDS", "listeners"},
	{resourcev3.RouteType, "RDS", "routes"},
	{resourcev3.ScopedRouteType, "SRDS", "scoped-routes"},
	{resourcev3.VirtualHostType, "VHDS", "virtual-hosts"},
	{resourcev3.SecretType, "SDS", "secrets"},
	{resourcev3.RuntimeType, "RTDS", "runtime"},
	{resourcev3.ExtensionConfigType, "ECDS", "extension_configs"},
}

// byName maps every name of a type, lower case, to its type URL.
var byName = func() map[string]string {
	m := make(map[string]string, 3*len(typeNames))
	for _, n := range typeNames {
		for _, name := range []string{ShortName(n.typeURL), n.abbrev, n.rest} {
			m[strings.ToLower(name)] = n.typeURL
		}
	}
	return m
}()

// ParseType returns the type URL that s names, in every command, admin
// path and configuration key that takes a type: a type URL the relay
// carries, or in any case its message name (Cluster), its xDS abbreviation
// (cds) or its REST short name (clusters). The error lists them all.
func ParseType(s string) (string, error) {
	if Known(s) {
		return Canonical(s), nil
	}
	if t, ok := byName[strings.ToLower(s)]; ok {
		return t, nil
	}
	return "", fmt.Errorf("%q is not a resource type: %s, in any case, or a type URL (%s)", Clip(s), TypeNameList(), resourcev3.ClusterType)
}

// TypeNamed is ParseType without its error.
func TypeNamed(s string) (string, bool) {
	t, err := ParseType(s)
	return t, err == nil
}

// TypeAbbrev is a type URL's xDS abbreviation (CDS), or the URL when it
// has none.
func TypeAbbrev(typeURL string) string {
	for _, n := range typeNames {
		if n.typeURL == typeURL {
			return n.abbrev
		}
	}
	return typeURL
}

// TypeNameList lists, per type, the names ParseType takes besides the URL:
// "Cluster|CDS|clusters, ClusterLoadAssignment|EDS|endpoints, ...".
func TypeNameList() string {
	out := make([]string, len(typeNames))
	for i, n := range typeNames {
		out[i] = ShortName(n.typeURL) + "|" + n.abbrev + "|" + n.rest
	}
	return strings.Join(out, ", ")
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

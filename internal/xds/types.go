package xds

import (
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

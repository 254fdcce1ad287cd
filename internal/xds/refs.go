package xds

import (
	"slices"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlspb "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Ref is a name a resource points at: another resource, of TypeURL, that a
// client reading the first needs (docs/architecture.md, invariant 18 "Make
// before break, whatever the order upstream").
type Ref struct {
	TypeURL, Name string
}

// The type URLs of the extensions whose references are read.
var (
	hcmType       = "type.googleapis.com/" + string((&hcmpb.HttpConnectionManager{}).ProtoReflect().Descriptor().FullName())
	downTLSType   = "type.googleapis.com/" + string((&tlspb.DownstreamTlsContext{}).ProtoReflect().Descriptor().FullName())
	upTLSType     = "type.googleapis.com/" + string((&tlspb.UpstreamTlsContext{}).ProtoReflect().Descriptor().FullName())
	unmarshalRefs = proto.UnmarshalOptions{DiscardUnknown: true}
)

// Refs returns the names a resource points at, each once, in the order
// found; nil if none. It decodes the resource (value is the Any's value,
// already validated) once, when it is encoded:
//
//   - a Listener points at the RouteConfiguration its HttpConnectionManager
//     (an API listener's, or a filter chain's) loads by RDS, at the
//     Clusters of an inline route_config, and at the Secrets its
//     DownstreamTlsContext loads by SDS;
//   - a RouteConfiguration points at the Clusters its routes name (cluster,
//     weighted_clusters); a cluster_header route names its cluster at
//     request time and cannot be known;
//   - a Cluster points at its ClusterLoadAssignment (Warm) and at the
//     Secrets its UpstreamTlsContext loads by SDS.
//
// Only names loaded from the control plane count: an RDS or SDS config
// source of ads or self (RDS's may be unset); a static secret, or one from
// a local SDS agent, is not the control plane's to send. An extension the
// relay does not know points at nothing.
func Refs(typeURL string, value []byte) []Ref {
	var r refs
	switch typeURL {
	case resourcev3.ListenerType:
		var l listenerpb.Listener
		if unmarshalRefs.Unmarshal(value, &l) != nil {
			return nil
		}
		r.hcm(l.GetApiListener().GetApiListener())
		chains := l.GetFilterChains()
		if d := l.GetDefaultFilterChain(); d != nil {
			chains = append(chains[:len(chains):len(chains)], d)
		}
		for _, fc := range chains {
			for _, f := range fc.GetFilters() {
				r.hcm(f.GetTypedConfig())
			}
			r.tls(fc.GetTransportSocket())
		}
	case resourcev3.RouteType:
		// Read field by field, as Warm reads a Cluster: a Route is the
		// largest resource that points at much, and decoding it whole
		// would cost more than encoding it.
		each(value, rcVirtualHosts, func(vh []byte) {
			each(vh, vhRoutes, func(rt []byte) {
				each(rt, routeRoute, func(action []byte) {
					each(action, actionCluster, func(name []byte) { r.add(resourcev3.ClusterType, string(name)) })
					each(action, actionWeighted, func(wc []byte) {
						each(wc, weightedClusters, func(cw []byte) {
							each(cw, clusterWeightName, func(name []byte) { r.add(resourcev3.ClusterType, string(name)) })
						})
					})
				})
			})
		})
	case resourcev3.ClusterType:
		if eds := Warm(typeURL, value); eds != "" {
			r.add(resourcev3.EndpointType, eds)
		}
		// Only the transport sockets are decoded, and only if there are
		// any: most Clusters have none.
		each(value, clusterSocket, func(b []byte) {
			var ts corepb.TransportSocket
			if unmarshalRefs.Unmarshal(b, &ts) == nil {
				r.tls(&ts)
			}
		})
		each(value, clusterSocketMatches, func(b []byte) {
			var m clusterpb.Cluster_TransportSocketMatch
			if unmarshalRefs.Unmarshal(b, &m) == nil {
				r.tls(m.GetTransportSocket())
			}
		})
	}
	return r.out
}

// Field numbers of what a RouteConfiguration points at, read from the
// descriptors.
var (
	rcVirtualHosts    = field(&routepb.RouteConfiguration{}, "virtual_hosts")
	vhRoutes          = field(&routepb.VirtualHost{}, "routes")
	routeRoute        = field(&routepb.Route{}, "route")
	actionCluster     = field(&routepb.RouteAction{}, "cluster")
	actionWeighted    = field(&routepb.RouteAction{}, "weighted_clusters")
	weightedClusters  = field(&routepb.WeightedCluster{}, "clusters")
	clusterWeightName = field(&routepb.WeightedCluster_ClusterWeight{}, "name")

	clusterSocket        = field(&clusterpb.Cluster{}, "transport_socket")
	clusterSocketMatches = field(&clusterpb.Cluster{}, "transport_socket_matches")
)

// each calls f with the bytes of every occurrence of length-delimited
// field num in a message's bytes (already validated). A message field set
// twice, which proto.Unmarshal would merge, is read as two.
func each(msg []byte, num protowire.Number, f func([]byte)) {
	for len(msg) > 0 {
		n, typ, k := protowire.ConsumeTag(msg)
		if k < 0 {
			return
		}
		msg = msg[k:]
		m := protowire.ConsumeFieldValue(n, typ, msg)
		if m < 0 {
			return
		}
		if n == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(msg[:m])
			f(v)
		}
		msg = msg[m:]
	}
}

// refs gathers references, each once.
type refs struct {
	out  []Ref
	seen map[Ref]struct{}
}

func (r *refs) add(typeURL, name string) {
	if name == "" {
		return
	}
	ref := Ref{TypeURL: typeURL, Name: name}
	if r.seen == nil {
		// Few references: looked for in out; many: in a set.
		if slices.Contains(r.out, ref) {
			return
		}
		r.out = append(r.out, ref)
		if len(r.out) > 16 {
			r.seen = make(map[Ref]struct{}, 2*len(r.out))
			for _, o := range r.out {
				r.seen[o] = struct{}{}
			}
		}
		return
	}
	if _, ok := r.seen[ref]; ok {
		return
	}
	r.seen[ref] = struct{}{}
	r.out = append(r.out, ref)
}

// hcm adds what an HttpConnectionManager points at; a is any filter's
// config: another filter points at nothing.
func (r *refs) hcm(a *anypb.Any) {
	if a.GetTypeUrl() != hcmType {
		return
	}
	var h hcmpb.HttpConnectionManager
	if unmarshalRefs.Unmarshal(a.GetValue(), &h) != nil {
		return
	}
	if fromXDS(h.GetRds().GetConfigSource(), true) {
		r.add(resourcev3.RouteType, h.GetRds().GetRouteConfigName())
	}
	if rc := h.GetRouteConfig(); rc != nil {
		r.routes(rc)
	}
}

// routes adds the Clusters a route configuration's routes name.
func (r *refs) routes(rc *routepb.RouteConfiguration) {
	for _, vh := range rc.GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			a := rt.GetRoute()
			r.add(resourcev3.ClusterType, a.GetCluster())
			for _, wc := range a.GetWeightedClusters().GetClusters() {
				r.add(resourcev3.ClusterType, wc.GetName())
			}
		}
	}
}

// tls adds the Secrets a transport socket's TLS context loads by SDS.
func (r *refs) tls(ts *corepb.TransportSocket) {
	a := ts.GetTypedConfig()
	var common *tlspb.CommonTlsContext
	switch a.GetTypeUrl() {
	case downTLSType:
		var d tlspb.DownstreamTlsContext
		if unmarshalRefs.Unmarshal(a.GetValue(), &d) != nil {
			return
		}
		common = d.GetCommonTlsContext()
	case upTLSType:
		var u tlspb.UpstreamTlsContext
		if unmarshalRefs.Unmarshal(a.GetValue(), &u) != nil {
			return
		}
		common = u.GetCommonTlsContext()
	default:
		return
	}
	for _, s := range common.GetTlsCertificateSdsSecretConfigs() {
		r.secret(s)
	}
	r.secret(common.GetValidationContextSdsSecretConfig())
	r.secret(common.GetCombinedValidationContext().GetValidationContextSdsSecretConfig())
}

// secret adds a Secret loaded by SDS from the control plane the resource
// came from: one without an sds_config is a static secret of the client's
// bootstrap, and one from another config source (a local SDS agent, a
// file) is not the control plane's to send.
func (r *refs) secret(s *tlspb.SdsSecretConfig) {
	if fromXDS(s.GetSdsConfig(), false) {
		r.add(resourcev3.SecretType, s.GetName())
	}
}

// fromXDS reports whether a config source is the stream the resource came
// on: ads or self (or, if unset may be, none given).
func fromXDS(cs *corepb.ConfigSource, unset bool) bool {
	switch cs.GetConfigSourceSpecifier().(type) {
	case *corepb.ConfigSource_Ads, *corepb.ConfigSource_Self:
		return true
	case nil:
		return unset
	}
	return false
}

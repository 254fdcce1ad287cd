package loadtest

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// kind is one resource type the tool loads: how its resources are named
// and built, which numeric field, the mark, carries the update sequence
// number (see seqCoding), and which field the name.
type kind struct {
	typeURL  string
	prefix   string // resource i is named prefix+i
	build    func(name string, i int, mark uint32, endpoints int) types.Resource
	markPath []protowire.Number
	markMin  uint32 // the range of marks that the field can hold
	markMax  uint32
	namePath []protowire.Number
	// full: a SotW response carries every subscribed resource of the
	// kind ("Grouping Resources into Responses": Listener and Cluster).
	full bool
}

var kinds = map[string]kind{
	"eds": {resourcev3.EndpointType, "cla-", buildEndpoints, fieldPath(&endpointpb.ClusterLoadAssignment{},
		"endpoints", "lb_endpoints", "endpoint", "address", "socket_address", "port_value"), 10000, 65535,
		fieldPath(&endpointpb.ClusterLoadAssignment{}, "cluster_name"), false},
	"cds": {resourcev3.ClusterType, "cluster-", buildCluster, fieldPath(&clusterpb.Cluster{},
		"per_connection_buffer_limit_bytes", "value"), 1 << 20, 1 << 30, fieldPath(&clusterpb.Cluster{}, "name"), true},
	"lds": {resourcev3.ListenerType, "listener-", buildListener, fieldPath(&listenerpb.Listener{},
		"per_connection_buffer_limit_bytes", "value"), 1 << 20, 1 << 30, fieldPath(&listenerpb.Listener{}, "name"), true},
	"rds": {resourcev3.RouteType, "route-", buildRoute, fieldPath(&routepb.RouteConfiguration{},
		"max_direct_response_body_size_bytes", "value"), 1 << 20, 1 << 30, fieldPath(&routepb.RouteConfiguration{}, "name"), false},
}

// seqCoding carries update sequence numbers in resources of one kind: the
// mark is base+seq, base drawn for each run, so that resources left from an
// earlier run (in a relay's cache, say) are not taken for this run's.
type seqCoding struct {
	kind    kind
	base    uint32
	updates int
	// wrap, for a soak, marks update seq with ((seq-1) mod updates)+1:
	// seqOf then returns that, which soakTracker.unwrap turns back.
	wrap bool
}

func newSeqCoding(kd kind, updates int) seqCoding {
	span := kd.markMax - kd.markMin - uint32(updates)
	return seqCoding{kind: kd, base: kd.markMin + rand.Uint32N(span), updates: updates}
}

// resource builds resource i, named name, as of update seq.
func (c seqCoding) resource(name string, i, seq, endpoints int) types.Resource {
	if c.wrap && seq > 0 {
		seq = (seq-1)%c.updates + 1
	}
	return c.kind.build(name, i, c.base+uint32(seq), endpoints)
}

// seqOf returns the update sequence number that a resource carries, or -1.
func (c seqCoding) seqOf(a *anypb.Any) int {
	if a.GetTypeUrl() != c.kind.typeURL {
		return -1
	}
	return c.markOf(a.GetValue())
}

// markOf returns the update sequence number that the encoded resource b of
// the coding's kind carries, or -1.
func (c seqCoding) markOf(b []byte) int {
	v, ok := varintAt(b, c.kind.markPath)
	if !ok || v < uint64(c.base) || v > uint64(c.base)+uint64(c.updates) {
		return -1
	}
	return int(v - uint64(c.base))
}

// catalog is the resources the tool serves and the updates it publishes:
// update seq replaces one resource, in turn over the subscribed names (every
// resource when the clients subscribe to all), with a version that carries
// seq. The control plane and the gRPC floor publish the same updates.
type catalog struct {
	// Read-only after newCatalog.
	coding    seqCoding
	endpoints int
	names     []string       // resource i is names[i]
	rotation  []string       // the resources updated, in turn
	index     map[string]int // name → i
}

func newCatalog(cfg *Config, coding seqCoding) *catalog {
	c := &catalog{coding: coding, endpoints: cfg.Endpoints, index: map[string]int{}}
	c.names = append(resourceNames(coding.kind, cfg.Resources), lateNames(coding.kind, cfg.Soak.lateNames())...)
	c.rotation = c.names[:cfg.Resources]
	if len(cfg.Names) > 0 {
		c.rotation = cfg.Names
	}
	for i, n := range c.names {
		c.index[n] = i
	}
	return c
}

func (c *catalog) typeURL() string { return c.coding.kind.typeURL }

// resource builds resource i as of update seq (0: before any update).
func (c *catalog) resource(i, seq int) types.Resource {
	return c.coding.resource(c.names[i], i, seq, c.endpoints)
}

// update builds the resource that update seq replaces, as the update
// carries it: rotation[turn], which is resource i.
func (c *catalog) update(seq int) (turn, i int, res types.Resource) {
	turn = (seq - 1) % len(c.rotation)
	i = c.index[c.rotation[turn]]
	return turn, i, c.resource(i, seq)
}

// lateNames names the k resources of a kind that a soak with faults
// serves from the start and asks for only during a silence (lateAsker).
func lateNames(kd kind, k int) []string {
	names := make([]string, k)
	for i := range names {
		names[i] = kd.prefix + "late-" + strconv.Itoa(i)
	}
	return names
}

// resourceNames names the k resources of a kind.
func resourceNames(kd kind, k int) []string {
	names := make([]string, k)
	for i := range names {
		names[i] = kd.prefix + strconv.Itoa(i)
	}
	return names
}

// fieldPath turns field names, each one of the previous field's message,
// into field numbers.
func fieldPath(m proto.Message, names ...protoreflect.Name) []protowire.Number {
	md := m.ProtoReflect().Descriptor()
	var path []protowire.Number
	for _, n := range names {
		fd := md.Fields().ByName(n)
		if fd == nil {
			panic(fmt.Sprintf("loadtest: %s has no field %s", md.FullName(), n))
		}
		path = append(path, fd.Number())
		md = fd.Message()
	}
	return path
}

// nameOf returns the name an encoded resource of kind kd carries, read
// without decoding the rest; empty if it has none.
func (kd kind) nameOf(a *anypb.Any) string {
	if a.GetTypeUrl() != kd.typeURL {
		return ""
	}
	b, _ := bytesAt(a.GetValue(), kd.namePath)
	return string(b)
}

// bytesAt reads the length-delimited field at path in an encoded message,
// following the first occurrence of each field.
func bytesAt(b []byte, path []protowire.Number) ([]byte, bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		if num == path[0] && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false
			}
			if len(path) == 1 {
				return v, true
			}
			return bytesAt(v, path[1:])
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil, false
		}
		b = b[m:]
	}
	return nil, false
}

// varintAt reads the varint at path in an encoded message, following the
// first occurrence of each field, without decoding anything else.
func varintAt(b []byte, path []protowire.Number) (uint64, bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == path[0] && len(path) == 1 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			return v, m >= 0
		}
		if num == path[0] && len(path) > 1 && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return 0, false
			}
			return varintAt(v, path[1:])
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return 0, false
		}
		b = b[m:]
	}
	return 0, false
}

// buildEndpoints is a ClusterLoadAssignment of loopback endpoints; the
// first one's port is the mark.
func buildEndpoints(name string, i int, mark uint32, endpoints int) types.Resource {
	lbs := make([]*endpointpb.LbEndpoint, endpoints)
	for j := range lbs {
		port := 20000 + j%40000
		if j == 0 {
			port = int(mark)
		}
		lbs[j] = lbEndpoint(fmt.Sprintf("127.%d.%d.%d", i%256, j/256%256, j%256), port)
	}
	return &endpointpb.ClusterLoadAssignment{
		ClusterName: name,
		Endpoints: []*endpointpb.LocalityLbEndpoints{{
			Locality:            &corepb.Locality{Region: "load", Zone: "load-a"},
			LbEndpoints:         lbs,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}},
	}
}

func lbEndpoint(host string, port int) *endpointpb.LbEndpoint {
	addr := &corepb.SocketAddress{Address: host, PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: uint32(port)}}
	return &endpointpb.LbEndpoint{
		HostIdentifier: &endpointpb.LbEndpoint_Endpoint{Endpoint: &endpointpb.Endpoint{
			Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: addr}},
		}},
		LoadBalancingWeight: wrapperspb.UInt32(1),
	}
}

func adsSource() *corepb.ConfigSource {
	return &corepb.ConfigSource{
		ResourceApiVersion:    corepb.ApiVersion_V3,
		ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}},
	}
}

// buildCluster is an EDS cluster whose endpoints come over ADS.
func buildCluster(name string, i int, mark uint32, _ int) types.Resource {
	return &clusterpb.Cluster{
		Name:                          name,
		ClusterDiscoveryType:          &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
		EdsClusterConfig:              &clusterpb.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: "cla-" + strconv.Itoa(i)},
		ConnectTimeout:                durationpb.New(1e9),
		LbPolicy:                      clusterpb.Cluster_ROUND_ROBIN,
		PerConnectionBufferLimitBytes: wrapperspb.UInt32(mark),
	}
}

// buildListener is an API listener whose routes come from RDS.
func buildListener(name string, i int, mark uint32, _ int) types.Resource {
	router, _ := anypb.New(&routerpb.Router{})
	hcm, _ := anypb.New(&hcmpb.HttpConnectionManager{
		StatPrefix: name,
		RouteSpecifier: &hcmpb.HttpConnectionManager_Rds{Rds: &hcmpb.Rds{
			RouteConfigName: "route-" + strconv.Itoa(i), ConfigSource: adsSource(),
		}},
		HttpFilters: []*hcmpb.HttpFilter{{Name: "router", ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	return &listenerpb.Listener{
		Name:                          name,
		ApiListener:                   &listenerpb.ApiListener{ApiListener: hcm},
		PerConnectionBufferLimitBytes: wrapperspb.UInt32(mark),
	}
}

// buildRoute sends everything to one cluster.
func buildRoute(name string, i int, mark uint32, _ int) types.Resource {
	action := &routepb.Route_Route{Route: &routepb.RouteAction{
		ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: "cluster-" + strconv.Itoa(i)},
	}}
	return &routepb.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routepb.VirtualHost{{
			Name: name, Domains: []string{"*"},
			Routes: []*routepb.Route{{
				Match:  &routepb.RouteMatch{PathSpecifier: &routepb.RouteMatch_Prefix{Prefix: "/"}},
				Action: action,
			}},
		}},
		MaxDirectResponseBodySizeBytes: wrapperspb.UInt32(mark),
	}
}

package relay

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// DefaultNodeID is the default template of the node id the relay presents
// upstream for a group.
const DefaultNodeID = "xdsrelay~{hostname}~{group}"

// NodeConfig is upstream.node: what the relay presents to the control plane
// as each group's node, besides the group's fields.
type NodeConfig struct {
	// ID is upstream.node.id: a template of the node id, where {hostname}
	// is the relay's host name, {group} the group key, and {FIELD} the
	// value of a group_by field (e.g. {cluster}, {metadata.team}).
	ID string
	// Metadata is upstream.node.metadata: added to the node's metadata.
	Metadata map[string]string
	// UserAgentName is upstream.node.user_agent_name.
	UserAgentName string
	// UserAgentVersion is set by the binary to its version.
	UserAgentVersion string
}

var placeholder = regexp.MustCompile(`\{[^{}]*\}`)

// checkNodeID checks the template: each placeholder is {hostname}, {group}
// or a group_by field, so that every client of a group yields one node.
func checkNodeID(tmpl string, groupBy []string) error {
	if tmpl == "" {
		return fmt.Errorf("must not be empty (default %q)", DefaultNodeID)
	}
	for _, p := range placeholder.FindAllString(tmpl, -1) {
		name := p[1 : len(p)-1]
		if name != "hostname" && name != "group" && !slices.Contains(groupBy, name) {
			return fmt.Errorf("%s is neither {hostname}, {group} nor a field of upstream.group_by %v", p, groupBy)
		}
	}
	if strings.Count(tmpl, "{") != strings.Count(tmpl, "}") {
		return fmt.Errorf("%q has unbalanced braces", tmpl)
	}
	return nil
}

// hostname is the relay's host name, for node ids.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}

// relayFeatures are the client features the relay supports itself,
// whatever its clients do: it passes TTLs and heartbeats through ("TTL").
var relayFeatures = []string{"xds.config.supports-resource-ttl"}

// groupNode is the node the relay presents to the default upstream for a
// group (see upstreamNode).
func groupNode(cfg *Config, host, key string, client *corepb.Node) *corepb.Node {
	return upstreamNode(cfg, cfg.Upstream.Node, host, key, client)
}

// groupNodes are the nodes the relay presents for a group, one per
// upstream in the order of the routes (the default first, then
// upstreams[]): each from that upstream's node.* keys
// (docs/control-planes.md, "What each control plane sees").
func groupNodes(cfg *Config, host, key string, client *corepb.Node) []*corepb.Node {
	nodes := []*corepb.Node{groupNode(cfg, host, key, client)}
	for _, u := range cfg.Upstreams {
		nodes = append(nodes, upstreamNode(cfg, u.Node, host, key, client))
	}
	return nodes
}

// upstreamNode is the node the relay presents upstream for a group, as nc
// (an upstream's node.* keys) says: the group's fields as its clients sent
// them (client is any of them: they all agree on those), an id from the
// template, the configured metadata and the relay's user agent and
// features. With user_agent among the fields, the user agent is the
// clients'; with client_features, the features are theirs with the
// relay's own: a control plane that tailors its config by either gives
// each kind its own (docs/architecture.md, invariant 14 "Kinds apart").
// Nothing else of any client reaches the control plane (invariant 8
// "Identity decides the tenant"). The version is the binary's, which it
// sets on upstream.node alone.
func upstreamNode(cfg *Config, nc NodeConfig, host, key string, client *corepb.Node) *corepb.Node {
	n := &corepb.Node{
		UserAgentName:        nc.UserAgentName,
		UserAgentVersionType: &corepb.Node_UserAgentVersion{UserAgentVersion: cfg.Upstream.Node.UserAgentVersion},
		ClientFeatures:       slices.Clone(relayFeatures),
	}
	for k, v := range nc.Metadata {
		setMetadata(n, k, structpb.NewStringValue(v))
	}
	advertise(cfg, n)
	for _, f := range cfg.Upstream.GroupBy {
		copyField(n, client, f)
	}
	n.Id = placeholder.ReplaceAllStringFunc(nc.ID, func(p string) string {
		switch name := p[1 : len(p)-1]; name {
		case "hostname":
			return host
		case "group":
			return key
		default:
			return xds.NodeField(client, name)
		}
	})
	return n
}

// copyField copies one group_by field from src to dst.
func copyField(dst, src *corepb.Node, f string) {
	loc := func() *corepb.Locality {
		if dst.Locality == nil {
			dst.Locality = &corepb.Locality{}
		}
		return dst.Locality
	}
	switch f {
	case "id":
		// The id comes from the template ({id} puts it there).
	case "cluster":
		dst.Cluster = src.GetCluster()
	case "locality.region":
		loc().Region = src.GetLocality().GetRegion()
	case "locality.zone":
		loc().Zone = src.GetLocality().GetZone()
	case "locality.sub_zone":
		loc().SubZone = src.GetLocality().GetSubZone()
	case xds.FieldUserAgent, xds.FieldUserAgentPatch:
		copyUserAgent(dst, src, f == xds.FieldUserAgentPatch)
	case xds.FieldClientFeatures:
		fs := append(slices.Clone(dst.GetClientFeatures()), xds.ClientFeatures(src)...)
		slices.Sort(fs)
		dst.ClientFeatures = slices.Compact(fs)
	default:
		key := strings.TrimPrefix(f, "metadata.")
		if v := src.GetMetadata().GetFields()[key]; v != nil {
			setMetadata(dst, key, proto.Clone(v).(*structpb.Value))
		}
	}
}

// copyUserAgent copies the user agent: the name, and the version string or
// Envoy's semantic build version without its build metadata, which clients
// of one kind need not share. With whole, the version is the client's own
// (user_agent_patch, and the key node that a warm-restart file saves, from
// which the group's key is made again). Without it, the version is the one
// presented for the kind (xds.PresentedVersion): a dotted numeric string as
// MAJOR.MINOR.0 and Envoy's with patch 0, which control planes that read
// versions as X.Y.Z (Consul) read; any other string cut to MAJOR.MINOR.
// Every client of a group presents the same (xds.KindVersion).
func copyUserAgent(dst, src *corepb.Node, whole bool) {
	dst.UserAgentName = src.GetUserAgentName()
	switch {
	case src.GetUserAgentVersion() != "":
		v := src.GetUserAgentVersion()
		if !whole {
			v = xds.PresentedVersion(v)
		}
		dst.UserAgentVersionType = &corepb.Node_UserAgentVersion{UserAgentVersion: v}
	case src.GetUserAgentBuildVersion().GetVersion() != nil:
		v := proto.Clone(src.GetUserAgentBuildVersion().GetVersion()).(*typev3.SemanticVersion)
		if !whole {
			v.Patch = 0
		}
		dst.UserAgentVersionType = &corepb.Node_UserAgentBuildVersion{UserAgentBuildVersion: &corepb.BuildVersion{Version: v}}
	default:
		dst.UserAgentVersionType = nil
	}
}

func setMetadata(n *corepb.Node, key string, v *structpb.Value) {
	if n.Metadata == nil {
		n.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	n.Metadata.Fields[key] = v
}

// keyNode is what of a client's node makes its group: the group_by fields
// as the client sent them, id included, the user agent with its whole
// version. A warm-restart file saves it, so that the group is restored
// under the same key and presents the same node.
func keyNode(groupBy []string, client *corepb.Node) *corepb.Node {
	n := &corepb.Node{}
	for _, f := range groupBy {
		switch f {
		case "id":
			n.Id = client.GetId()
		case xds.FieldUserAgent:
			copyUserAgent(n, client, true)
		default:
			copyField(n, client, f)
		}
	}
	return n
}

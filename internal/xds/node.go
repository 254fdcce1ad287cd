package xds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// The node fields that name the client's kind: what control planes tailor
// their config by (docs/architecture.md, invariant 14 "Kinds apart").
const (
	// FieldUserAgent is user_agent_name with its version (see UserAgent).
	FieldUserAgent = "user_agent"
	// FieldClientFeatures is the set of client_features (see
	// ClientFeatures).
	FieldClientFeatures = "client_features"
)

// CheckNodeField reports whether f names a node field that NodeField reads:
// id, cluster, locality.region, locality.zone, locality.sub_zone,
// user_agent, client_features or metadata.<key>. upstream.group_by and the
// authorization rules name fields this way.
func CheckNodeField(f string) error {
	switch f {
	case "id", "cluster", "locality.region", "locality.zone", "locality.sub_zone", FieldUserAgent, FieldClientFeatures:
		return nil
	}
	if key, ok := strings.CutPrefix(f, "metadata."); ok && key != "" {
		return nil
	}
	return fmt.Errorf("unknown node field %q (want id, cluster, locality.region, locality.zone, locality.sub_zone, user_agent, client_features or metadata.<key>)", f)
}

// NodeField returns the value of the field f (see CheckNodeField) of node: a
// metadata string as it is, another metadata value in its JSON form, "" for
// a field the node does not set.
func NodeField(node *corepb.Node, f string) string {
	switch f {
	case "id":
		return node.GetId()
	case "cluster":
		return node.GetCluster()
	case "locality.region":
		return node.GetLocality().GetRegion()
	case "locality.zone":
		return node.GetLocality().GetZone()
	case "locality.sub_zone":
		return node.GetLocality().GetSubZone()
	case FieldUserAgent:
		return UserAgent(node)
	case FieldClientFeatures:
		return strings.Join(ClientFeatures(node), ",")
	}
	key := strings.TrimPrefix(f, "metadata.")
	v := node.GetMetadata().GetFields()[key]
	if v == nil {
		return ""
	}
	if s, ok := v.GetKind().(*structpb.Value_StringValue); ok {
		return s.StringValue
	}
	js, _ := protojson.Marshal(v)
	return string(js)
}

// UserAgent is the node's user_agent_name with its version, as
// "NAME/VERSION": user_agent_version as it is (gRPC sends one), or
// user_agent_build_version as MAJOR.MINOR.PATCH (Envoy's, whose build
// metadata is left out). "NAME" alone without a version; "" without either.
func UserAgent(node *corepb.Node) string {
	name, version := node.GetUserAgentName(), UserAgentVersion(node)
	if version == "" {
		return name
	}
	return name + "/" + version
}

// UserAgentVersion is the version part of UserAgent.
func UserAgentVersion(node *corepb.Node) string {
	if v := node.GetUserAgentVersion(); v != "" {
		return v
	}
	sv := node.GetUserAgentBuildVersion().GetVersion()
	if sv == nil {
		return ""
	}
	return strconv.FormatUint(uint64(sv.GetMajorNumber()), 10) + "." + strconv.FormatUint(uint64(sv.GetMinorNumber()), 10) +
		"." + strconv.FormatUint(uint64(sv.GetPatch()), 10)
}

// ClientFeatures is the node's client_features as a set: sorted, each once.
func ClientFeatures(node *corepb.Node) []string {
	fs := slices.Clone(node.GetClientFeatures())
	slices.Sort(fs)
	return slices.Compact(fs)
}

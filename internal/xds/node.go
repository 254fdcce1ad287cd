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
	// FieldUserAgent is user_agent_name with the version its kind is known
	// by: MAJOR.MINOR for a dotted numeric one (see UserAgent).
	FieldUserAgent = "user_agent"
	// FieldUserAgentPatch is user_agent_name with its whole version (see
	// UserAgentPatch).
	FieldUserAgentPatch = "user_agent_patch"
	// FieldClientFeatures is the set of client_features (see
	// ClientFeatures).
	FieldClientFeatures = "client_features"
)

// CheckNodeField reports whether f names a node field that NodeField reads:
// id, cluster, locality.region, locality.zone, locality.sub_zone,
// user_agent, user_agent_patch, client_features or metadata.<key>.
// upstream.group_by and the authorization rules name fields this way.
func CheckNodeField(f string) error {
	switch f {
	case "id", "cluster", "locality.region", "locality.zone", "locality.sub_zone", FieldUserAgent, FieldUserAgentPatch, FieldClientFeatures:
		return nil
	}
	if key, ok := strings.CutPrefix(f, "metadata."); ok && key != "" {
		return nil
	}
	return fmt.Errorf("unknown node field %q (want id, cluster, locality.region, locality.zone, locality.sub_zone, user_agent, user_agent_patch, client_features or metadata.<key>)", f)
}

// IsUserAgent reports whether f is a user agent field (user_agent or
// user_agent_patch): the client's software, not its tenant.
func IsUserAgent(f string) bool { return f == FieldUserAgent || f == FieldUserAgentPatch }

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
	case FieldUserAgentPatch:
		return UserAgentPatch(node)
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

// UserAgent is the node's user_agent_name with the version its kind is
// known by, as "NAME/VERSION" (see KindVersion): patch releases of one
// minor version are one kind (control planes gate features on minor
// versions), so that a patch rollout through a fleet does not split its
// groups. "NAME" alone without a version; "" without either.
func UserAgent(node *corepb.Node) string {
	return nameVersion(node.GetUserAgentName(), KindVersion(UserAgentVersion(node)))
}

// UserAgentPatch is UserAgent with the whole version: user_agent_version
// as it is (gRPC sends one), or user_agent_build_version as
// MAJOR.MINOR.PATCH (Envoy's, whose build metadata is left out).
func UserAgentPatch(node *corepb.Node) string {
	return nameVersion(node.GetUserAgentName(), UserAgentVersion(node))
}

func nameVersion(name, version string) string {
	if version == "" {
		return name
	}
	return name + "/" + version
}

// UserAgentVersion is the node's whole version: user_agent_version as it
// is, or user_agent_build_version as MAJOR.MINOR.PATCH.
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

// KindVersion is the version a client's kind is known by: a dotted
// numeric version ("1.85.1", "1.85", Envoy's build version) by its
// MAJOR.MINOR ("1.85"), and any other string whole ("1.86.0-dev", "v2"): a
// pre-release or a build is not the release it leads to, and is presented
// otherwise (PresentedVersion). So that clients of one kind present one
// version, PresentedVersion of any version of a kind is one string.
func KindVersion(v string) string {
	if major, minor, ok := dottedNumeric(v); ok {
		return major + "." + minor
	}
	return v
}

// PresentedVersion is the version presented upstream for a kind of clients
// whose version is v (docs/architecture.md, invariant 14 "Kinds apart"): a
// dotted numeric version as MAJOR.MINOR.0 ("1.78.3" and "1.78" are
// "1.78.0"), as Envoy's build version is presented with patch 0, so that a
// control plane that reads versions as X.Y.Z (Consul, a NodeHash keyed by
// them) reads what its clients would have sent; any other string cut as
// MinorVersion cuts it ("1.86.0-dev" is "1.86"), or whole.
func PresentedVersion(v string) string {
	if major, minor, ok := dottedNumeric(v); ok {
		return major + "." + minor + ".0"
	}
	return MinorVersion(v)
}

// dottedNumeric reports whether v is two numbers or more joined by dots,
// and its first two.
func dottedNumeric(v string) (major, minor string, ok bool) {
	major, rest, ok := strings.Cut(v, ".")
	if !ok || !digits(major) {
		return "", "", false
	}
	minor, rest, more := strings.Cut(rest, ".")
	if !digits(minor) {
		return "", "", false
	}
	for more {
		var part string
		part, rest, more = strings.Cut(rest, ".")
		if !digits(part) {
			return "", "", false
		}
	}
	return major, minor, true
}

// MinorVersion is v cut to MAJOR.MINOR when it starts with two numbers and
// goes on after a dot ("1.85.1" and "1.86.0-dev" are "1.85" and "1.86");
// any other version is kept whole, since it says nothing of its parts.
func MinorVersion(v string) string {
	major, rest, ok := strings.Cut(v, ".")
	if !ok || !digits(major) {
		return v
	}
	minor, _, ok := strings.Cut(rest, ".")
	if !ok || !digits(minor) {
		return v
	}
	return major + "." + minor
}

func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// ClientFeatures is the node's client_features as a set: sorted, each once.
func ClientFeatures(node *corepb.Node) []string {
	fs := slices.Clone(node.GetClientFeatures())
	slices.Sort(fs)
	return slices.Compact(fs)
}

package xds

import (
	"fmt"
	"strings"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// CheckNodeField reports whether f names a node field that NodeField reads:
// id, cluster, locality.region, locality.zone, locality.sub_zone or
// metadata.<key>. upstream.group_by and the authorization rules name fields
// this way.
func CheckNodeField(f string) error {
	switch f {
	case "id", "cluster", "locality.region", "locality.zone", "locality.sub_zone":
		return nil
	}
	if key, ok := strings.CutPrefix(f, "metadata."); ok && key != "" {
		return nil
	}
	return fmt.Errorf("unknown node field %q (want id, cluster, locality.region, locality.zone, locality.sub_zone or metadata.<key>)", f)
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

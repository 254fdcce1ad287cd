package relay

import (
	"fmt"
	"strings"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

func checkGroupField(f string) error {
	switch f {
	case "id", "cluster", "locality.region", "locality.zone", "locality.sub_zone":
		return nil
	}
	if key, ok := strings.CutPrefix(f, "metadata."); ok && key != "" {
		return nil
	}
	return fmt.Errorf("unknown node field %q (want id, cluster, locality.region, locality.zone, locality.sub_zone or metadata.<key>)", f)
}

// GroupKey is the key of the group a node belongs to: the values of the
// fields, in order. Nodes with the same key share an upstream stream and a
// cache.
func GroupKey(node *corepb.Node, fields []string) string {
	var b strings.Builder
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(f)
		b.WriteByte('=')
		b.WriteString(nodeField(node, f))
	}
	return b.String()
}

func nodeField(node *corepb.Node, f string) string {
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

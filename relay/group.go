package relay

import (
	"strings"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

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
		b.WriteString(xds.NodeField(node, f))
	}
	return b.String()
}

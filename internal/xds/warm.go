package xds

import (
	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of the Cluster fields that say where its endpoints come
// from, read from the descriptors.
var (
	clusterName       = field(&clusterpb.Cluster{}, "name")
	clusterType       = field(&clusterpb.Cluster{}, "type")
	clusterCustomType = field(&clusterpb.Cluster{}, "cluster_type")
	clusterEDS        = field(&clusterpb.Cluster{}, "eds_cluster_config")
	edsServiceName    = field(&clusterpb.Cluster_EdsClusterConfig{}, "service_name")
)

// Warm returns, for a Cluster whose endpoints come from EDS, the name of
// the ClusterLoadAssignment it is warmed with: its
// eds_cluster_config.service_name, or its own name when that is empty.
// Envoy finishes warming a new or changed Cluster only when that
// ClusterLoadAssignment is sent again, changed or not ("Resource warming").
// It is "" for any other resource, and for a Cluster of another discovery
// type. value is the Any's value, already validated (see validate); it is
// read field by field as proto.Unmarshal would (the last scalar wins, a
// message repeated is merged), without decoding the Cluster.
func Warm(typeURL string, value []byte) string {
	if typeURL != resourcev3.ClusterType {
		return ""
	}
	var name, service string
	eds := false
	for b := value; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return ""
		}
		v := b[:m]
		b = b[m:]
		switch {
		case num == clusterName && typ == protowire.BytesType:
			s, _ := protowire.ConsumeBytes(v)
			name = string(s)
		case num == clusterType && typ == protowire.VarintType:
			t, _ := protowire.ConsumeVarint(v)
			eds = t == uint64(clusterpb.Cluster_EDS)
		case num == clusterCustomType:
			eds = false // the other member of the oneof
		case num == clusterEDS && typ == protowire.BytesType:
			msg, _ := protowire.ConsumeBytes(v)
			if s, ok := lastString(msg, edsServiceName); ok {
				service = s
			}
		}
	}
	switch {
	case !eds:
		return ""
	case service != "":
		return service
	}
	return name
}

// lastString is the last value of string field num in a message's bytes.
func lastString(msg []byte, num protowire.Number) (string, bool) {
	var out string
	found := false
	for len(msg) > 0 {
		n, typ, k := protowire.ConsumeTag(msg)
		if k < 0 {
			return out, found
		}
		msg = msg[k:]
		m := protowire.ConsumeFieldValue(n, typ, msg)
		if m < 0 {
			return out, found
		}
		if n == num && typ == protowire.BytesType {
			s, _ := protowire.ConsumeBytes(msg[:m])
			out, found = string(s), true
		}
		msg = msg[m:]
	}
	return out, found
}

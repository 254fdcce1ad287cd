package downstream

import (
	"net"
	"slices"
	"strconv"
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// On per-type streams of one connection, the Clusters a CDS stream sends
// warm the EDS stream once the client ACKs the response that carried them
// (warming.go): each endpoint name once, however many responses changed
// its Cluster before the ACK; not on the ACK of an older response; not at
// all on a NACK.
func TestPerTypeClustersWarmOnTheirAck(t *testing.T) {
	c := cache.New(cache.Options{})
	conn := &sendConn{addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}}
	cds := &streamBase{fixed: resourcev3.ClusterType, cache: c}
	eds := &streamBase{fixed: resourcev3.EndpointType, cache: c, watch: cache.NewWatch()}
	defer cds.linkConn(conn)()
	defer eds.linkConn(conn)()
	respond := func(clusters ...*cache.Resource) string {
		for _, r := range clusters {
			cds.warmed(r)
		}
		nonce := cds.nonces.next()
		if err := cds.flushWarm(nil); err != nil {
			t.Fatal(err)
		}
		return nonce
	}
	a := &cache.Resource{Name: "a", Version: "1", Warm: "a-endpoints"}
	b := &cache.Resource{Name: "b", Version: "1", Warm: "shared-endpoints"}
	var last string
	for i := range 100 { // a client that reads, and answers late
		a.Version, b.Version = strconv.Itoa(i), strconv.Itoa(i)
		last = respond(a, b)
	}
	older := strconv.Itoa(100 - 1)
	cds.ackedClusters(older, false)
	if got := eds.inbox.take(); got != nil {
		t.Fatalf("the ACK of an older response warmed %q", got)
	}
	cds.ackedClusters(last, false)
	got := eds.inbox.take()
	slices.Sort(got)
	if !slices.Equal(got, []string{"a-endpoints", "shared-endpoints"}) {
		t.Fatalf("the ACK of the last response warmed %d names (%q...), want each endpoint name once", len(got), got[:min(len(got), 3)])
	}
	cds.ackedClusters(respond(a), true)
	if got := eds.inbox.take(); got != nil {
		t.Fatalf("a NACK warmed %q", got)
	}
}

package downstream

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// Benchmarks of one ACK: a stream holding k names of EDS, every one sent
// and acknowledged, is sent a change of one of them; what is timed is the
// handling of its client's ACK of that response. An ACK that accepts what
// was sent costs the same whatever the stream holds, and allocates
// nothing (delta: the request names nothing; SotW: it names every name
// again, which the stream compares with what it holds). Run them with
//
//	go test -run '^$' -bench Ack -benchmem ./downstream

// ackNames are the stream sizes of the ACK benchmarks.
var ackNames = []int{1, 100, 10000}

// ackCache is an EDS cache of k small ClusterLoadAssignments, cla-0 to
// cla-k-1, and two new versions of cla-0 to alternate.
func ackCache(b *testing.B, k int) (*cache.Cache, []string, [2]*cache.Resource) {
	b.Helper()
	const typeURL = resourcev3.EndpointType
	c := cache.New(cache.Options{})
	fill(b, c, typeURL, "cla-", k, 64)
	names := make([]string, k)
	for i := range names {
		names[i] = "cla-" + strconv.Itoa(i)
	}
	return c, names, [2]*cache.Resource{encoded(b, typeURL, "cla-0", "v1", 64), encoded(b, typeURL, "cla-0", "v2", 64)}
}

func BenchmarkDeltaAck(b *testing.B) {
	const typeURL = resourcev3.EndpointType
	for _, k := range ackNames {
		b.Run(fmt.Sprintf("names=%d", k), func(b *testing.B) {
			c, names, versions := ackCache(b, k)
			node := &corepb.Node{Id: "bench", Cluster: "bench"}
			ds := &deltaStream{streamBase: benchServer(b).newStreamBase(codecSend, "", "delta-ads", c, node)}
			if err := ds.handle(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNamesSubscribe: names}); err != nil {
				b.Fatal(err)
			}
			ack := &discoverypb.DeltaDiscoveryRequest{TypeUrl: strings.Clone(typeURL)}
			answer := func() {
				if err := ds.flush(); err != nil {
					b.Fatal(err)
				}
				ack.ResponseNonce = strconv.FormatUint(uint64(ds.nonces), 10)
				if err := ds.handle(ack); err != nil {
					b.Fatal(err)
				}
			}
			answer()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{versions[i%2]}})
				if err := ds.flush(); err != nil {
					b.Fatal(err)
				}
				ack.ResponseNonce = strconv.FormatUint(uint64(ds.nonces), 10)
				b.StartTimer()
				if err := ds.handle(ack); err != nil {
					b.Fatal(err)
				}
			}
			if n := acceptedOf(c, typeURL, "cla-0"); n != 1 {
				b.Fatalf("cla-0 accepted by %d clients, want 1", n)
			}
		})
	}
}

func BenchmarkSotWAck(b *testing.B) {
	const typeURL = resourcev3.EndpointType
	for _, k := range ackNames {
		b.Run(fmt.Sprintf("names=%d", k), func(b *testing.B) {
			c, names, versions := ackCache(b, k)
			node := &corepb.Node{Id: "bench", Cluster: "bench"}
			ss := &sotwStream{streamBase: benchServer(b).newStreamBase(codecSend, "", "sotw-ads", c, node)}
			if err := ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNames: names}); err != nil {
				b.Fatal(err)
			}
			ack := &discoverypb.DiscoveryRequest{TypeUrl: strings.Clone(typeURL), ResourceNames: names}
			send := func() {
				if err := ss.flush(); err != nil {
					b.Fatal(err)
				}
				ack.ResponseNonce = ss.types.get(typeURL).nonce
				ack.VersionInfo = ack.ResponseNonce
			}
			send()
			if err := ss.handle(ack); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{versions[i%2]}})
				send()
				b.StartTimer()
				if err := ss.handle(ack); err != nil {
					b.Fatal(err)
				}
			}
			if n := acceptedOf(c, typeURL, "cla-0"); n != 1 {
				b.Fatalf("cla-0 accepted by %d clients, want 1", n)
			}
		})
	}
}

// acceptedOf is how many clients accepted the current version of name.
func acceptedOf(c *cache.Cache, typeURL, name string) int {
	for _, r := range c.Convergence([]string{typeURL}, []string{name}) {
		return r.At().Accepted
	}
	return 0
}

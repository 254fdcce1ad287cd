package downstream

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// BenchmarkDeltaSubscribeOne is the cost of one incremental request that
// subscribes one name (and of the flush that answers it, and of its
// unsubscribe), on a stream already holding `held` names still waiting for
// upstream: it must not grow with what the stream holds.
//
//	go test -run '^$' -bench DeltaSubscribeOne -benchmem ./downstream
func BenchmarkDeltaSubscribeOne(b *testing.B) {
	for _, held := range []int{0, 20000, 200000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			const typeURL = resourcev3.EndpointType
			c := cache.New(cache.Options{Retention: time.Minute})
			const present = 1000
			// Present by name, not through a synced wildcard: the held names
			// are then still waiting, neither present nor known absent.
			w := cache.NewWatch()
			var rs []*cache.Resource
			for i := range present {
				n := "r-" + strconv.Itoa(i)
				c.Watch(w, typeURL, n)
				rs = append(rs, encoded(b, typeURL, n, "v0", 200))
			}
			c.Apply(typeURL, cache.Change{Upserts: rs})
			c.Release(w)
			ds := &deltaStream{
				streamBase: benchServer(b).newStreamBase(codecSend, "", "delta-ads", c, &corepb.Node{Id: "n"}),
			}
			pending := make([]string, held)
			for i := range pending {
				pending[i] = "pending-" + strconv.Itoa(i)
			}
			first := &discoverypb.DeltaDiscoveryRequest{Node: &corepb.Node{Id: "n"}, TypeUrl: typeURL, ResourceNamesSubscribe: append(pending, "r-0")}
			if err := ds.handle(first); err != nil {
				b.Fatal(err)
			}
			if err := ds.flush(); err != nil {
				b.Fatal(err)
			}
			if got := ds.types.get(typeURL).answer.len(); got != held {
				b.Fatalf("%d names waiting, want %d", got, held)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				name := "r-" + strconv.Itoa(1+i%(present-1))
				for _, req := range []*discoverypb.DeltaDiscoveryRequest{
					{TypeUrl: typeURL, ResourceNamesSubscribe: []string{name}},
					{TypeUrl: typeURL, ResourceNamesUnsubscribe: []string{name}},
				} {
					if err := ds.handle(req); err != nil {
						b.Fatal(err)
					}
					if err := ds.flush(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

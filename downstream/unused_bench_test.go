package downstream

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// BenchmarkNewCluster is what a stream that asks for Clusters and nothing
// that points at them (no Listener, no Route) pays for a new EDS Cluster:
// n ADS streams of the CDS wildcard are each sent the new Cluster, and
// their clients ACK it. There is nothing to hold back behind its warming
// (warmorder.go), so there is no hold to start and end. Run it with
//
//	go test -run '^$' -bench NewCluster -benchmem ./downstream
func BenchmarkNewCluster(b *testing.B) {
	for _, variant := range []string{"sotw", "delta"} {
		for _, n := range []int{1000} {
			b.Run(fmt.Sprintf("%s/streams=%d", variant, n), func(b *testing.B) {
				benchNewCluster(b, variant, n)
			})
		}
	}
}

func benchNewCluster(b *testing.B, variant string, n int) {
	const typeURL = resourcev3.ClusterType
	srv := benchServer(b)
	c := cache.New(cache.Options{})
	w := cache.NewWatch()
	c.WatchWildcard(w, typeURL)
	c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{edsCluster(b, "cluster-0", "v0")}, Synced: true})
	c.Release(w)
	type stream struct {
		flush func() error
		ack   func() error
	}
	streams := make([]stream, n)
	for i := range streams {
		node := &corepb.Node{Id: "bench-" + strconv.Itoa(i), Cluster: "bench"}
		base := srv.newStreamBase(codecSend, "", variant+"-ads", c, node)
		var s stream
		var first error
		if variant == "sotw" {
			ss := &sotwStream{streamBase: base}
			first = ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL)})
			s.flush = ss.flush
			s.ack = func() error {
				return ss.handle(&discoverypb.DiscoveryRequest{TypeUrl: typeURL, ResponseNonce: ss.types.get(typeURL).nonce})
			}
		} else {
			ds := &deltaStream{streamBase: base}
			first = ds.handle(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL)})
			s.flush = ds.flush
			ack := &discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL}
			s.ack = func() error {
				ack.ResponseNonce = strconv.FormatUint(uint64(ds.nonces), 10)
				return ds.handle(ack)
			}
		}
		if first != nil {
			b.Fatal(first)
		}
		if err := s.flush(); err != nil {
			b.Fatal(err)
		}
		if err := s.ack(); err != nil {
			b.Fatal(err)
		}
		streams[i] = s
	}
	b.ReportAllocs()
	b.ResetTimer()
	var cpu time.Duration
	for i := range b.N {
		b.StopTimer()
		c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{edsCluster(b, "new-"+strconv.Itoa(i), "v0")}})
		b.StartTimer()
		start := cpuTime()
		for _, s := range streams {
			if err := s.flush(); err != nil {
				b.Fatal(err)
			}
			if err := s.ack(); err != nil {
				b.Fatal(err)
			}
		}
		cpu += cpuTime() - start
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/stream")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/stream")
}

package downstream

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Benchmarks of a stream's work when a change reaches it, without gRPC:
// take the dirty set, look the names up, assemble the response and hand it
// to the codec. The change is applied to the cache outside the timing; what
// is timed is divided by the number of streams. Run them with
//
//	go test -run '^$' -bench . -benchmem ./downstream

type noGroups struct{}

func (noGroups) Join(*corepb.Node, Caller) (*cache.Cache, func(), error) { return nil, nil, nil }

func benchServer(b testing.TB) *Server {
	b.Helper()
	s, err := New(Options{Groups: noGroups{}, Metrics: &metrics.Registry{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// encoded is resource name of typeURL as the relay caches it, about payload
// bytes long; the padding says version, so that versions differ.
func encoded(b testing.TB, typeURL, name, version string, payload int) *cache.Resource {
	b.Helper()
	pad := version + strings.Repeat("x", max(payload-len(version), 0))
	var m proto.Message = &clusterpb.Cluster{Name: name, AltStatName: pad}
	if typeURL == resourcev3.EndpointType {
		m = &endpointpb.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointpb.LocalityLbEndpoints{{
			Locality: &corepb.Locality{SubZone: pad},
		}}}
	}
	a, err := anypb.New(m)
	if err != nil {
		b.Fatal(err)
	}
	r, err := xds.Encode(name, version, a, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// encodeSink is where send puts the codec's output, so that assembly and
// codec are part of what is timed, as they are of a real send.
var encodeSink int

func codecSend(m any) error {
	bs, err := xds.Codec{}.Marshal(m)
	encodeSink += bs.Len()
	bs.Free()
	return err
}

// fill puts k resources of typeURL, named prefix0..prefixK-1, in c.
func fill(b *testing.B, c *cache.Cache, typeURL, prefix string, k, payload int) {
	b.Helper()
	w := cache.NewWatch()
	c.WatchWildcard(w, typeURL)
	var rs []*cache.Resource
	for i := range k {
		rs = append(rs, encoded(b, typeURL, prefix+strconv.Itoa(i), "v0", payload))
	}
	c.Apply(typeURL, cache.Change{Upserts: rs, Synced: true})
	c.Release(w)
}

// deltaStreams is n delta streams subscribed by name to cla-0 of an EDS
// cache of 10 ClusterLoadAssignments (about 8 KiB each), each sent its first
// response, and two new versions of cla-0 to alternate.
func deltaStreams(b *testing.B, n int) (*cache.Cache, []*deltaStream, [2]*cache.Resource) {
	b.Helper()
	const typeURL = resourcev3.EndpointType
	srv := benchServer(b)
	c := cache.New(cache.Options{})
	fill(b, c, typeURL, "cla-", 10, 8<<10)
	streams := make([]*deltaStream, n)
	for i := range streams {
		node := &corepb.Node{Id: "bench-" + strconv.Itoa(i), Cluster: "bench"}
		ds := &deltaStream{streamBase: srv.newStreamBase(codecSend, "", "delta-ads", c, node)}
		if err := ds.handle(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNamesSubscribe: []string{"cla-0"}}); err != nil {
			b.Fatal(err)
		}
		if err := ds.flush(); err != nil {
			b.Fatal(err)
		}
		streams[i] = ds
	}
	return c, streams, [2]*cache.Resource{encoded(b, typeURL, "cla-0", "v1", 8<<10), encoded(b, typeURL, "cla-0", "v2", 8<<10)}
}

// BenchmarkDeltaFlush is one changed 200-endpoint ClusterLoadAssignment
// (about 8 KiB) reaching n delta streams that subscribe to it by name,
// among 10 resources.
func BenchmarkDeltaFlush(b *testing.B) {
	const typeURL = resourcev3.EndpointType
	for _, n := range []int{1, 1000, 10000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			c, streams, versions := deltaStreams(b, n)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{versions[i%2]}})
				b.StartTimer()
				for _, ds := range streams {
					<-ds.watch.Ready()
					if err := ds.flush(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
		})
	}
}

// BenchmarkDeltaChange is the relay's whole own work when one changed
// ClusterLoadAssignment reaches n delta streams, as BenchmarkDeltaFlush's:
// the cache marks every stream's watch, each stream flushes and handles its
// client's ACK. Only gRPC is left out. At 100,000 streams none of a
// stream's state is in the CPU's caches when the change reaches it, as in
// a relay serving that many.
func BenchmarkDeltaChange(b *testing.B) {
	const typeURL = resourcev3.EndpointType
	for _, n := range []int{10000, 100000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			c, streams, versions := deltaStreams(b, n)
			acks := make([]*discoverypb.DeltaDiscoveryRequest, n)
			for i := range acks {
				acks[i] = &discoverypb.DeltaDiscoveryRequest{TypeUrl: strings.Clone(typeURL)}
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{versions[i%2]}})
				for j, ds := range streams {
					<-ds.watch.Ready()
					if err := ds.flush(); err != nil {
						b.Fatal(err)
					}
					acks[j].ResponseNonce = strconv.FormatUint(uint64(ds.nonces), 10)
					if err := ds.handle(acks[j]); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
		})
	}
}

// BenchmarkSotWFlush is the same change reaching n SotW streams that
// subscribe to it by name (EDS: only the changed resource is sent), and a
// changed Cluster among 100 reaching n wildcard CDS streams (the complete
// state, built once and shared).
func BenchmarkSotWFlush(b *testing.B) {
	for _, tc := range []struct {
		name, typeURL, prefix string
		k, payload            int
		names                 []string
	}{
		{"eds-named", resourcev3.EndpointType, "cla-", 10, 8 << 10, []string{"cla-0"}},
		{"cds-wildcard-100", resourcev3.ClusterType, "cluster-", 100, 300, nil},
	} {
		for _, n := range []int{1, 1000, 10000} {
			b.Run(fmt.Sprintf("%s/streams=%d", tc.name, n), func(b *testing.B) {
				srv := benchServer(b)
				c := cache.New(cache.Options{})
				fill(b, c, tc.typeURL, tc.prefix, tc.k, tc.payload)
				streams := make([]*sotwStream, n)
				for i := range streams {
					node := &corepb.Node{Id: "bench-" + strconv.Itoa(i), Cluster: "bench"}
					ss := &sotwStream{streamBase: srv.newStreamBase(codecSend, "", "sotw-ads", c, node)}
					if err := ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: strings.Clone(tc.typeURL), ResourceNames: tc.names}); err != nil {
						b.Fatal(err)
					}
					if err := ss.flush(); err != nil {
						b.Fatal(err)
					}
					if ss.types.get(tc.typeURL).nonce == "" {
						b.Fatal("no first response")
					}
					streams[i] = ss
				}
				changed := tc.prefix + "0"
				versions := [2]*cache.Resource{encoded(b, tc.typeURL, changed, "v1", tc.payload), encoded(b, tc.typeURL, changed, "v2", tc.payload)}
				b.ReportAllocs()
				var cpu time.Duration
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					c.Apply(tc.typeURL, cache.Change{Upserts: []*cache.Resource{versions[i%2]}})
					b.StartTimer()
					start := cpuTime()
					for _, ss := range streams {
						<-ss.watch.Ready()
						if err := ss.flush(); err != nil {
							b.Fatal(err)
						}
					}
					cpu += cpuTime() - start
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/stream")
			})
		}
	}
}

// BenchmarkSotWChange is the relay's whole own work when a changed
// Cluster among 100 reaches n wildcard CDS SotW streams, as
// BenchmarkDeltaChange's for delta: each stream is sent the shared
// complete state and handles its client's ACK of it.
func BenchmarkSotWChange(b *testing.B) {
	const typeURL, k, payload = resourcev3.ClusterType, 100, 300
	for _, n := range []int{10000} {
		b.Run(fmt.Sprintf("cds-wildcard-%d/streams=%d", k, n), func(b *testing.B) {
			srv := benchServer(b)
			c := cache.New(cache.Options{})
			fill(b, c, typeURL, "cluster-", k, payload)
			streams := make([]*sotwStream, n)
			for i := range streams {
				node := &corepb.Node{Id: "bench-" + strconv.Itoa(i), Cluster: "bench"}
				ss := &sotwStream{streamBase: srv.newStreamBase(codecSend, "", "sotw-ads", c, node)}
				if err := ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL)}); err != nil {
					b.Fatal(err)
				}
				if err := ss.flush(); err != nil {
					b.Fatal(err)
				}
				streams[i] = ss
			}
			ack := func(ss *sotwStream) {
				b.Helper()
				if err := ss.handle(&discoverypb.DiscoveryRequest{TypeUrl: strings.Clone(typeURL), VersionInfo: "v",
					ResponseNonce: ss.types.get(typeURL).nonce}); err != nil {
					b.Fatal(err)
				}
			}
			for _, ss := range streams {
				ack(ss)
			}
			versions := [2]*cache.Resource{encoded(b, typeURL, "cluster-0", "v1", payload), encoded(b, typeURL, "cluster-0", "v2", payload)}
			b.ReportAllocs()
			start := cpuTime()
			for i := 0; b.Loop(); i++ {
				c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{versions[i%2]}})
				for _, ss := range streams {
					<-ss.watch.Ready()
					if err := ss.flush(); err != nil {
						b.Fatal(err)
					}
					ack(ss)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
			b.ReportMetric(float64((cpuTime()-start).Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/stream")
		})
	}
}

// edsCluster is cluster name as the relay caches it: EDS, so that a
// stream holding its endpoints is sent them again after it (warming.go);
// version tells one version from another.
func edsCluster(b testing.TB, name, version string) *cache.Resource {
	b.Helper()
	a, err := anypb.New(&clusterpb.Cluster{Name: name, AltStatName: version,
		ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS}})
	if err != nil {
		b.Fatal(err)
	}
	r, err := xds.Encode(name, version, a, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// BenchmarkClusterChange is one changed EDS Cluster among 10 reaching n
// ADS streams that take clusters with the wildcard, as Envoy does, and
// that hold the endpoints of every cluster (held) or none: the difference
// is what warming costs a stream, its ClusterLoadAssignment sent again
// behind the Cluster.
func BenchmarkClusterChange(b *testing.B) {
	for _, variant := range []string{"sotw", "delta"} {
		for _, held := range []bool{false, true} {
			for _, n := range []int{1000, 10000} {
				b.Run(fmt.Sprintf("%s/held=%v/streams=%d", variant, held, n), func(b *testing.B) {
					benchClusterChange(b, variant, held, n)
				})
			}
		}
	}
}

func benchClusterChange(b *testing.B, variant string, held bool, n int) {
	srv := benchServer(b)
	c := cache.New(cache.Options{})
	w := cache.NewWatch()
	c.WatchWildcard(w, resourcev3.ClusterType)
	var clusters, names []string
	var rs []*cache.Resource
	for i := range 10 {
		name := "cluster-" + strconv.Itoa(i)
		clusters = append(clusters, name)
		rs = append(rs, edsCluster(b, name, "v0"))
	}
	c.Apply(resourcev3.ClusterType, cache.Change{Upserts: rs, Synced: true})
	c.Release(w)
	if held {
		names = clusters
		fill(b, c, resourcev3.EndpointType, "cluster-", 10, 1<<10)
	}
	flushers := make([]func() error, n)
	for i := range flushers {
		node := &corepb.Node{Id: "bench-" + strconv.Itoa(i), Cluster: "bench"}
		base := srv.newStreamBase(codecSend, "", variant+"-ads", c, node)
		var handle func(typeURL string, names []string) error
		if variant == "sotw" {
			ss := &sotwStream{streamBase: base}
			handle = func(typeURL string, names []string) error {
				return ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNames: names})
			}
			flushers[i] = ss.flush
		} else {
			ds := &deltaStream{streamBase: base}
			handle = func(typeURL string, names []string) error {
				return ds.handle(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNamesSubscribe: names})
			}
			flushers[i] = ds.flush
		}
		if err := handle(resourcev3.ClusterType, nil); err != nil {
			b.Fatal(err)
		}
		if len(names) > 0 {
			if err := handle(resourcev3.EndpointType, names); err != nil {
				b.Fatal(err)
			}
		}
		if err := flushers[i](); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		c.Apply(resourcev3.ClusterType, cache.Change{Upserts: []*cache.Resource{edsCluster(b, "cluster-0", "v"+strconv.Itoa(i+1))}})
		b.StartTimer()
		for _, f := range flushers {
			if err := f(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/stream")
}

// BenchmarkHeartbeatFlush is a heartbeat of one resource reaching n
// streams of clients that take TTLs and hold it: a ClusterLoadAssignment
// subscribed by name on delta, and a Cluster subscribed by name on SotW,
// whose heartbeat goes out as the type's complete state. The client's
// records do not move (flushcore.go): the flush sends the heartbeat and
// does no bookkeeping.
func BenchmarkHeartbeatFlush(b *testing.B) {
	ttl := durationpb.New(time.Hour)
	for _, variant := range []string{"delta-eds", "sotw-cds"} {
		for _, n := range []int{1000, 10000} {
			b.Run(fmt.Sprintf("%s/streams=%d", variant, n), func(b *testing.B) {
				typeURL := resourcev3.EndpointType
				if variant == "sotw-cds" {
					typeURL = resourcev3.ClusterType
				}
				srv := benchServer(b)
				c := cache.New(cache.Options{})
				a, err := anypb.New(&clusterpb.Cluster{Name: "r"})
				if typeURL == resourcev3.EndpointType {
					a, err = anypb.New(&endpointpb.ClusterLoadAssignment{ClusterName: "r"})
				}
				if err != nil {
					b.Fatal(err)
				}
				r, err := xds.Encode("r", "1", a, ttl, nil)
				if err != nil {
					b.Fatal(err)
				}
				hb, err := xds.EncodeHeartbeat("r", "1", ttl)
				if err != nil {
					b.Fatal(err)
				}
				flushers := make([]func() error, n)
				watches := make([]*cache.Watch, n)
				for i := range flushers {
					node := &corepb.Node{Id: "bench-" + strconv.Itoa(i), Cluster: "bench"}
					if variant == "sotw-cds" {
						ss := &sotwStream{streamBase: srv.newStreamBase(codecSend, "", "sotw-ads", c, node), ttl: true}
						if err := ss.handle(&discoverypb.DiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNames: []string{"r"}}); err != nil {
							b.Fatal(err)
						}
						flushers[i], watches[i] = ss.flush, ss.watch
					} else {
						ds := &deltaStream{streamBase: srv.newStreamBase(codecSend, "", "delta-ads", c, node), ttl: true}
						if err := ds.handle(&discoverypb.DeltaDiscoveryRequest{Node: node, TypeUrl: strings.Clone(typeURL), ResourceNamesSubscribe: []string{"r"}}); err != nil {
							b.Fatal(err)
						}
						flushers[i], watches[i] = ds.flush, ds.watch
					}
				}
				c.Apply(typeURL, cache.Change{Upserts: []*cache.Resource{r}, Synced: true})
				for _, f := range flushers {
					if err := f(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					c.Apply(typeURL, cache.Change{Heartbeats: []*cache.Heartbeat{hb}})
					b.StartTimer()
					for i, f := range flushers {
						<-watches[i].Ready()
						if err := f(); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
			})
		}
	}
}

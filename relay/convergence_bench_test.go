package relay

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// Sizes of the group BenchmarkDebugConvergence reads.
const (
	convResources = 1000  // Clusters in the group's cache
	convChanged   = 100   // of them changed, the change half accepted
	convWildcard  = 40000 // SotW clients of every Cluster with the wildcard, sharing the complete state
	convNamed     = 60000 // delta clients of 10 Clusters each, by name
	convNamedEach = 10    // names each of those subscribes to
	convNackEvery = 100   // one delta client in this many rejects what it is sent
	convClients   = convWildcard + convNamed
)

// convergenceGroup is a group's cache holding convResources Clusters, of
// which convChanged changed, and the standings of convClients clients,
// moved there through the calls the streams make (cache.Move,
// cache.MoveShared) and watching what they hold: every wildcard client
// sent the first complete state and ACKed it, half of them sent the
// changed one and ACKed it, the other half not answered yet; every delta
// client sent its names, most ACKed, some NACKed.
func convergenceGroup(b *testing.B) *group {
	b.Helper()
	const typeURL = resourcev3.ClusterType
	c := cache.New(cache.Options{})
	cluster := func(i int, version string) *cache.Resource {
		name := "cluster-" + strconv.Itoa(i)
		return encodeForTest(b, name, version, &clusterpb.Cluster{Name: name, AltStatName: version})
	}
	first := make([]*cache.Resource, convResources)
	for i := range first {
		first[i] = cluster(i, "v1")
	}
	fill := cache.NewWatch()
	c.WatchWildcard(fill, typeURL)
	c.Apply(typeURL, cache.Change{Upserts: first, Synced: true})
	c.Release(fill)
	t0 := time.Unix(1_000_000, 0)
	for range convWildcard {
		c.WatchWildcard(cache.NewWatch(), typeURL)
	}
	st1 := c.State(typeURL)
	var changed []*cache.Resource
	for i := range convChanged {
		changed = append(changed, cluster(i, "v2"))
	}
	for i := range convWildcard {
		m := cache.Mover{Node: "sotw-" + strconv.Itoa(i), Since: st1.Received} // came after it: nothing timed
		c.MoveShared(typeURL, nil, cache.Unsent, st1, cache.Pending, st1.Received, t0, m, nil)
		c.MoveShared(typeURL, st1, cache.Pending, st1, cache.Accepted, time.Time{}, t0.Add(time.Second), m, nil)
	}
	for i := range convNamed {
		names := make([]string, convNamedEach)
		for j := range names {
			names[j] = "cluster-" + strconv.Itoa((i*convNamedEach+j)%convResources)
		}
		if err := c.Watch(cache.NewWatch(), typeURL, names...); err != nil {
			b.Fatal(err)
		}
		m := cache.Mover{Node: "delta-" + strconv.Itoa(i), Error: "bad", Since: t0}
		answer := cache.Accepted
		if i%convNackEvery == convNackEvery/2 { // of Clusters that did not change
			answer = cache.Rejected
		}
		for _, n := range names {
			sent := cache.Standing{Version: "v1", Answer: cache.Pending}
			c.Move(typeURL, n, cache.Standing{}, sent, st1.Received, t0, m)
			c.Move(typeURL, n, sent, cache.Standing{Version: "v1", Answer: answer}, time.Time{}, t0.Add(time.Duration(i%1000)*time.Millisecond), m)
		}
	}
	c.Apply(typeURL, cache.Change{Upserts: changed})
	st2 := c.State(typeURL)
	for i := range convWildcard / 2 {
		m := cache.Mover{Node: "sotw-" + strconv.Itoa(i), Since: st1.Received}
		t1 := st2.Received.Add(time.Second)
		c.MoveShared(typeURL, st1, cache.Accepted, st2, cache.Pending, st2.Received, t1, m, nil)
		if i%2 == 0 {
			c.MoveShared(typeURL, st2, cache.Pending, st2, cache.Accepted, time.Time{}, t1.Add(time.Duration(i%1000)*time.Millisecond), m, nil)
		}
	}
	return &group{key: "bench", id: "bench", cache: c}
}

// BenchmarkDebugConvergence is GET /debug/convergence of a group of
// 100,000 clients (convergenceGroup), answered with the default limit of
// resources (all 1,000 listed, each with its versions), JSON included;
// and of one resource by name.
//
//	go test -run '^$' -bench DebugConvergence -benchtime 20x ./relay
func BenchmarkDebugConvergence(b *testing.B) {
	r := &Relay{groups: map[string]*group{}}
	g := convergenceGroup(b)
	r.groups[g.key] = g
	for _, q := range []string{"", "?type=clusters&name=cluster-1"} {
		b.Run("query="+q, func(b *testing.B) {
			var out DebugConvergence
			get := func() *httptest.ResponseRecorder {
				rec := httptest.NewRecorder()
				r.debugConvergence(rec, httptest.NewRequest(http.MethodGet, "/debug/convergence"+q, nil))
				if rec.Code != http.StatusOK {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
				return rec
			}
			if err := json.Unmarshal(get().Body.Bytes(), &out); err != nil {
				b.Fatal(err)
			}
			if q == "" {
				s := out.Summary[0]
				if len(out.Resources) != convResources || s.Subscribed != convWildcard*convResources+convNamed*convNamedEach || s.Rejected == 0 {
					b.Fatalf("%d resources listed, summary %+v", len(out.Resources), s)
				}
			}
			var size int
			b.ReportAllocs()
			for b.Loop() {
				size = get().Body.Len()
			}
			b.ReportMetric(float64(size), "bytes")
		})
	}
}

package cache

import (
	"strconv"
	"testing"
	"time"
)

// BenchmarkRouteChange is what make before break adds to a change that
// needs no wait: a Route pointing at 50 Clusters, all cached, replaced by
// a version that moves one of them (so that the references move; "same"
// keeps them, the common change), with consistency off and on; and the
// change of a resource that points at nothing (a ClusterLoadAssignment)
// with it on.
func BenchmarkRouteChange(b *testing.B) {
	for _, tc := range []struct {
		name     string
		on, same bool
	}{{"off", false, false}, {"on", true, false}, {"on-same", true, true}} {
		on := tc.on
		b.Run("route-50-clusters/"+tc.name, func(b *testing.B) {
			opts := Options{}
			if on {
				opts.Consistency = Consistency{MaxWait: 5 * time.Second}
			}
			c := New(opts)
			w := NewWatch()
			var clusters []string
			var rs []*Resource
			for i := range 51 {
				n := "c-" + strconv.Itoa(i)
				clusters = append(clusters, n)
				rs = append(rs, benchResource(n, "v0", 512))
			}
			c.Watch(w, cds, clusters...)
			c.Apply(cds, Change{Upserts: rs})
			c.Watch(w, rds, "r")
			versions := [2][]*Resource{{route("r", "v1", clusters[:50]...)}, {route("r", "v2", clusters[1:]...)}}
			if tc.same {
				versions[1] = []*Resource{route("r", "v2", clusters[:50]...)}
			}
			c.Apply(rds, Change{Upserts: versions[1]})
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				c.Apply(rds, Change{Upserts: versions[i%2]})
				if i%1024 == 0 {
					w.Take()
				}
			}
		})
	}
	for _, on := range []bool{false, true} {
		name := "cla/off"
		opts := Options{}
		if on {
			name, opts.Consistency = "cla/on", Consistency{MaxWait: 5 * time.Second}
		}
		b.Run(name, func(b *testing.B) {
			benchCLAChange(b, New(opts))
		})
	}
}

func benchCLAChange(b *testing.B, c *Cache) {
	{
		w := NewWatch()
		c.Watch(w, benchType, "r-0")
		versions := alternate("r-0", 512)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			c.Apply(benchType, Change{Upserts: versions[i%2]})
			if i%1024 == 0 {
				w.Take()
			}
		}
	}
}

// BenchmarkChangeWhileRoutesWait is the change of a resource nothing waits
// for (a ClusterLoadAssignment) while many Routes wait, each for a Cluster
// of its own that has not come: what the change costs must not grow with
// the waiters (settleLocked looks only at those waiting on what changed).
func BenchmarkChangeWhileRoutesWait(b *testing.B) {
	for _, waiters := range []int{0, 10, 100, 1000} {
		b.Run("waiters-"+strconv.Itoa(waiters), func(b *testing.B) {
			c := New(Options{Consistency: Consistency{MaxWait: time.Hour}})
			w := NewWatch()
			routes := make([]*Resource, 0, waiters)
			var names []string
			for i := range waiters {
				n := "r-" + strconv.Itoa(i)
				names = append(names, n)
				routes = append(routes, route(n, "v1", "missing-"+strconv.Itoa(i)))
			}
			c.Watch(w, rds, names...)
			c.Apply(rds, Change{Upserts: routes})
			if got := len(c.References().Waiting); got != waiters {
				b.Fatalf("%d waiting, want %d", got, waiters)
			}
			benchCLAChange(b, c)
		})
	}
}

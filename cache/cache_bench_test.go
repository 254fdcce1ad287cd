package cache

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// Benchmarks of the cache's hot paths: an upstream change applied among many
// cached resources, the marking of the watchers it reaches, and a stream's
// dirty queue. Run them with
//
//	go test -run '^$' -bench . -benchmem ./cache

const benchType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"

// benchResource is a resource of size bytes (8 KiB is about a 200-endpoint
// ClusterLoadAssignment, 512 B a Cluster); the cache only compares, stores
// and, for State, concatenates its bytes.
func benchResource(name, version string, size int) *Resource {
	body := make([]byte, size)
	copy(body, version)
	return &Resource{Name: name, Version: version, Any: body, Wire: append([]byte(name), body...)}
}

// filledCache holds n resources of benchType of size bytes, named
// r-0..r-n-1, each explicitly wanted (as if a client had subscribed and
// left).
func filledCache(b *testing.B, n, size int) *Cache {
	b.Helper()
	c := New(Options{})
	w := NewWatch()
	names := make([]string, n)
	rs := make([]*Resource, n)
	for i := range n {
		names[i] = "r-" + strconv.Itoa(i)
		rs[i] = benchResource(names[i], "v0", size)
	}
	c.Watch(w, benchType, names...)
	c.Apply(benchType, Change{Upserts: rs})
	c.Release(w)
	if c.Len() != n {
		b.Fatalf("cache holds %d resources, want %d", c.Len(), n)
	}
	return c
}

// alternate returns two versions of resource name, to be applied in turn
// so that every Update is a change.
func alternate(name string, size int) [2][]*Resource {
	return [2][]*Resource{{benchResource(name, "v1", size)}, {benchResource(name, "v2", size)}}
}

// BenchmarkUpdateAmong100k is the CPU an upstream change costs the cache
// before fan-out: one resource replaced among 100,000 cached, with nobody,
// one stream, or every resource's wildcard stream watching it (Mark
// included: it is the cache's last step).
func BenchmarkUpdateAmong100k(b *testing.B) {
	const n = 100_000
	for _, tc := range []struct {
		name  string
		watch func(c *Cache, w *Watch)
	}{
		{"unwatched", func(*Cache, *Watch) {}},
		{"one-watcher", func(c *Cache, w *Watch) { c.Watch(w, benchType, "r-5000") }},
		{"one-wildcard-watcher", func(c *Cache, w *Watch) { c.WatchWildcard(w, benchType) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := filledCache(b, n, 512)
			w := NewWatch()
			tc.watch(c, w)
			versions := alternate("r-5000", 512)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				c.Apply(benchType, Change{Upserts: versions[i%2]})
				if i%1024 == 0 {
					w.Take() // keep the watch's dirty set as a stream would
				}
			}
		})
	}
}

// BenchmarkStateAfterUpdateAmong100k is what the first wildcard stream
// pays after a change among 100,000 Cluster-sized resources: Update, then
// State rebuilding the shared complete state (sorted resources and their
// concatenated bytes). Delta and SotW wildcard streams reach State through
// Cache.All on every flush.
func BenchmarkStateAfterUpdateAmong100k(b *testing.B) {
	c := filledCache(b, 100_000, 512)
	w := NewWatch()
	c.WatchWildcard(w, benchType)
	versions := alternate("r-5000", 512)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c.Apply(benchType, Change{Upserts: versions[i%2]})
		if st := c.State(benchType); len(st.Resources) != 100_000 {
			b.Fatalf("state holds %d resources", len(st.Resources))
		}
		w.Take()
	}
}

// BenchmarkUpdateNotify is one change reaching N streams that watch it:
// Update marks each stream's watch dirty and wakes it. The streams drain
// their watches between changes, outside the timing, as they would.
func BenchmarkUpdateNotify(b *testing.B) {
	for _, n := range []int{1, 100, 1_000, 10_000} {
		for _, wildcard := range []bool{false, true} {
			mode := "named"
			if wildcard {
				mode = "wildcard"
			}
			b.Run(fmt.Sprintf("watchers=%d/%s", n, mode), func(b *testing.B) {
				c := New(Options{})
				ws := make([]*Watch, n)
				for i := range ws {
					ws[i] = NewWatch()
					if wildcard {
						c.WatchWildcard(ws[i], benchType)
					} else {
						c.Watch(ws[i], benchType, "cla-0")
					}
				}
				versions := alternate("cla-0", 8<<10)
				c.Apply(benchType, Change{Upserts: []*Resource{benchResource("cla-0", "v0", 8<<10)}})
				drain(ws)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					c.Apply(benchType, Change{Upserts: versions[i%2]})
					b.StopTimer()
					drain(ws)
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/watcher")
			})
		}
	}
}

func drain(ws []*Watch) {
	for _, w := range ws {
		if d := w.Take(); len(d) != 1 && d != nil {
			panic("unexpected dirty types")
		}
		select {
		case <-w.Ready():
		default:
		}
	}
}

// BenchmarkWatchQueue is a stream's queue: the cache marks, the stream
// takes. "mark-take" is one change per wake-up; the coalescing cases are
// ten marks taken at once, the same name ten times (latest state wins) or
// ten names.
func BenchmarkWatchQueue(b *testing.B) {
	names := make([]string, 10)
	for i := range names {
		names[i] = "cla-" + strconv.Itoa(i)
	}
	b.Run("mark-take", func(b *testing.B) {
		w := NewWatch()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			w.Mark(benchType, uint64(i), "cla-0")
			<-w.Ready()
			if d := w.Take(); d.Of(benchType).Names.Len() != 1 {
				b.Fatal("lost the mark")
			}
		}
	})
	b.Run("coalesce-same-name-x10", func(b *testing.B) {
		w := NewWatch()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			for j := range 10 {
				w.Mark(benchType, uint64(i*10+j), "cla-0")
			}
			<-w.Ready()
			if d := w.Take(); d.Of(benchType).Names.Len() != 1 {
				b.Fatal("marks not coalesced")
			}
		}
	})
	b.Run("coalesce-10-names", func(b *testing.B) {
		w := NewWatch()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			for j, n := range names {
				w.Mark(benchType, uint64(i*10+j), n)
			}
			<-w.Ready()
			if d := w.Take(); d.Of(benchType).Names.Len() != 10 {
				b.Fatal("lost marks")
			}
		}
	})
	b.Run("parallel-mark-one-taker", func(b *testing.B) {
		// Several cache groups marking one stream while it takes.
		w := NewWatch()
		done := make(chan struct{})
		taken := make(chan struct{})
		go func() {
			defer close(taken)
			for {
				select {
				case <-w.Ready():
					w.Take()
				case <-done:
					return
				}
			}
		}()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				w.Mark(benchType, 1, "cla-0")
			}
		})
		close(done)
		<-taken
	})
}

// BenchmarkSweepAmong100k is the relay's periodic sweep (once a second by
// default) of a group holding 100,000 resources, when nothing is due: every
// resource watched, or every one retained by a client that left and still
// within cache.retention. The sweep holds the cache's lock.
func BenchmarkSweepAmong100k(b *testing.B) {
	for _, watched := range []bool{true, false} {
		b.Run(fmt.Sprintf("watched=%v", watched), func(b *testing.B) {
			c := New(Options{Retention: time.Hour})
			w := NewWatch()
			names := make([]string, 100_000)
			rs := make([]*Resource, len(names))
			for i := range names {
				names[i] = "r-" + strconv.Itoa(i)
				rs[i] = benchResource(names[i], "v0", 64)
			}
			c.Watch(w, benchType, names...)
			c.Apply(benchType, Change{Upserts: rs})
			if !watched {
				c.Release(w)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				c.Sweep()
			}
			if c.Len() != len(names) {
				b.Fatalf("the sweep left %d resources of %d", c.Len(), len(names))
			}
		})
	}
}

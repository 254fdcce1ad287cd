package upstream

import (
	"fmt"
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// readCounter is an Interest that counts the reads of the whole interest.
type readCounter struct {
	*cache.Cache
	reads int
}

func (r *readCounter) Interest() map[string]cache.Interest {
	r.reads++
	return r.Cache.Interest()
}

// missingGroup is a client of a group that wants n Clusters, all cached
// but the last (none missing if all).
func missingGroup(tb testing.TB, n int, all bool) (*Client, *cache.Cache, *readCounter, *cache.Watch) {
	tb.Helper()
	c := cache.New(cache.Options{})
	w := cache.NewWatch()
	names := make([]string, n)
	ups := make([]*cache.Resource, 0, n)
	for i := range names {
		names[i] = fmt.Sprintf("c-%06d", i)
		if all || i < n-1 {
			ups = append(ups, &cache.Resource{Name: names[i], Version: "1", Any: []byte(names[i]), Wire: []byte(names[i])})
		}
	}
	if err := c.Watch(w, resourcev3.ClusterType, names...); err != nil {
		tb.Fatal(err)
	}
	c.Apply(resourcev3.ClusterType, cache.Change{Upserts: ups})
	in := &readCounter{Cache: c}
	return &Client{opts: Options{Cache: c, Interest: in}}, c, in, w
}

// missing reads the group's interest again only once the cache or the
// interest changed: a stream that fails again and again while nothing
// changes costs no walk of the group per failure, and a change is seen at
// the next failure.
func TestMissingReadsTheInterestOncePerChange(t *testing.T) {
	cl, c, in, w := missingGroup(t, 100, true)
	for range 5 {
		if cl.missing() {
			t.Fatal("missing with every name cached")
		}
	}
	if in.reads != 1 {
		t.Fatalf("5 failures with nothing changed read the interest %d times, want once", in.reads)
	}
	if err := c.Watch(w, resourcev3.ClusterType, "new"); err != nil { // wanted, not cached
		t.Fatal(err)
	}
	if !cl.missing() {
		t.Fatal("a name wanted since, not cached, is not missing")
	}
	c.Apply(resourcev3.ClusterType, cache.Change{Removed: []string{"new"}}) // known not to exist
	if cl.missing() {
		t.Fatal("a name the control plane said does not exist is missing")
	}
	if in.reads != 3 {
		t.Fatalf("the interest was read %d times over two changes, want 3", in.reads)
	}
}

// BenchmarkMissing is Client.missing for a group of 100,000 Clusters, all
// cached: asked again with nothing changed (each failure of a stream while
// the control plane is down), and after one name more is wanted.
func BenchmarkMissing(b *testing.B) {
	const n = 100_000
	b.Run("unchanged", func(b *testing.B) {
		cl, _, _, _ := missingGroup(b, n, true)
		b.ReportAllocs()
		for b.Loop() {
			if cl.missing() {
				b.Fatal("missing")
			}
		}
	})
	b.Run("changed", func(b *testing.B) {
		cl, c, _, w := missingGroup(b, n, true)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			c.Watch(w, resourcev3.ClusterType, fmt.Sprint("x-", i))
			c.Apply(resourcev3.ClusterType, cache.Change{Removed: []string{fmt.Sprint("x-", i)}})
			if cl.missing() {
				b.Fatal("missing")
			}
		}
	})
}

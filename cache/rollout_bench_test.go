package cache

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkRolloutChange applies one upstream change of one watched
// resource, among 1,000 watches of it, with the rollout off and on (the
// change then held: its canaries never answer). B/op is the memory a
// change costs; with the rollout on, what a held change keeps.
func BenchmarkRolloutChange(b *testing.B) {
	for _, tc := range []struct {
		name    string
		rollout Rollout
	}{{"off", Rollout{}}, {"held", Rollout{Canary: 2, Bake: time.Hour}}} {
		b.Run(tc.name, func(b *testing.B) {
			c := New(Options{Retention: time.Minute, Rollout: tc.rollout})
			for i := range 1000 {
				w := NewWatch()
				w.SetRank(uint64(i))
				w.OnReady(func() {})
				if err := c.Watch(w, eds, "x"); err != nil {
					b.Fatal(err)
				}
			}
			rs := make([]*Resource, b.N+1)
			for i := range rs {
				rs[i] = res("x", fmt.Sprint(i))
			}
			c.Apply(eds, Change{Upserts: rs[:1]})
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				c.Apply(eds, Change{Upserts: rs[i+1 : i+2]})
			}
		})
	}
}

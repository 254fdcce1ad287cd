package downstream

import (
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// With tracing off the cache keeps no trace, and a push does no span work:
// it allocates nothing.
func TestTracePushOffAllocatesNothing(t *testing.T) {
	b := &streamBase{variant: "delta-ads"}
	if n := testing.AllocsPerRun(100, func() { b.tracePush(cache.Trace{}, resourcev3.ClusterType, 7, 3) }); n != 0 {
		t.Errorf("%v allocations per push with tracing off, want 0", n)
	}
}

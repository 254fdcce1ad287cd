package downstream

import (
	"testing"
	"unsafe"

	"github.com/xdsrelay/xdsrelay/cache"
)

// An idle stream of one name of one type holds, besides gRPC's, these
// records (BENCHMARKS.md, "Paying nothing for what a change does not
// use"): each within the allocator's size class it was brought down to,
// so that a field added to one is a decision, not an accident.
func TestIdleStreamRecordsStaySmall(t *testing.T) {
	for _, r := range []struct {
		name      string
		size, max uintptr
	}{
		{"cache.Watch", unsafe.Sizeof(cache.Watch{}), 480},
		{"deltaStream", unsafe.Sizeof(deltaStream{}), 384},
		{"sotwStream", unsafe.Sizeof(sotwStream{}), 384},
		{"deltaType", unsafe.Sizeof(deltaType{}), 128},
		{"sotwType", unsafe.Sizeof(sotwType{}), 144},
		{"streamStatus", unsafe.Sizeof(streamStatus{}), 128},
		{"typeStatus", unsafe.Sizeof(typeStatus{}), 160},
	} {
		if r.size > r.max {
			t.Errorf("%s is %d bytes, want at most %d", r.name, r.size, r.max)
		}
	}
}

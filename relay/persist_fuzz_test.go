package relay

import (
	"crypto/sha256"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
)

// FuzzDecodeGroup feeds cache files to the decoder: it returns an error or
// a group, never panics nor allocates from an unchecked length, and what it
// returns encodes again into a file it reads back. Each input is tried as
// it is and re-sealed with a valid checksum, so that mutations reach the
// records. Seeds: testdata/fuzz/FuzzDecodeGroup (valid files, truncated
// ones, a 2^62-byte record with a valid checksum).
func FuzzDecodeGroup(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		roundTrip(t, data)
		if len(data) >= len(persistMagic)+sha256.Size {
			roundTrip(t, sealed(data[len(persistMagic):len(data)-sha256.Size]))
		}
	})
}

func roundTrip(t *testing.T, data []byte) {
	node, states, err := decodeGroup(data)
	if err != nil {
		return
	}
	c := cache.New(cache.Options{Retention: time.Minute, MaxResources: 100})
	c.Import(states)
	again, err := encodeGroup(node, states, nil)
	if err != nil {
		t.Fatalf("a decoded group does not encode: %v", err)
	}
	_, back, err := decodeGroup(again)
	if err != nil {
		t.Fatalf("a re-encoded group does not decode: %v", err)
	}
	if len(back) != len(states) {
		t.Fatalf("%d types decoded, %d after a round trip", len(states), len(back))
	}
}

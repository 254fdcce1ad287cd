package xds

import "testing"

// FuzzReceived decodes fuzzed bytes as a received DeltaDiscoveryResponse,
// spread over buffers of a fuzzed size, and compares the result with
// proto.Unmarshal's and Encode's (sameAsProto): the same responses are
// accepted, with the same fields, and each resource is stored as the same
// bytes or rejected with the same error. Seeds: receivedCases. To fuzz
// longer:
//
//	go test -run '^$' -fuzz=FuzzReceived -fuzztime=5m ./internal/xds
func FuzzReceived(f *testing.F) {
	for _, b := range receivedCases(f) {
		f.Add(b, uint8(0))
		f.Add(b, uint8(6))
	}
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		n := int(chunk) + 1
		if chunk == 0 {
			n = max(len(b), 1)
		}
		if err := sameAsProto(b, chunked(b, n)); err != nil {
			t.Fatal(err)
		}
	})
}

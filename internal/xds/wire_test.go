package xds

import (
	"strings"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The responses assembled from encoded fields decode to what the protos
// say, whether the header and parts fit in the Message's own storage or
// not (many fields, long removed names, a long nonce), and the bytes the
// Codec hands gRPC are those parts in order.
func TestAssembledResponsesDecode(t *testing.T) {
	resource := func(i int) (*discoverypb.Resource, *anypb.Any) {
		a, err := anypb.New(wrapperspb.String(strings.Repeat("x", i*7)))
		if err != nil {
			t.Fatal(err)
		}
		return &discoverypb.Resource{Name: "r" + string(rune('a'+i)), Version: "v1", Resource: a}, a
	}
	long := strings.Repeat("n", 300)
	for _, tc := range []struct {
		name    string
		fields  int
		removed []string
		nonce   string
	}{
		{"none", 0, nil, "1"},
		{"one", 1, nil, "2"},
		{"two", 2, []string{"gone"}, "3"},
		{"many", 7, []string{"a", "b"}, "4"},
		{"long header", 1, []string{long, long}, strings.Repeat("9", 40)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var delta, sotw [][]byte
			wantDelta := &discoverypb.DeltaDiscoveryResponse{SystemVersionInfo: "1234", TypeUrl: resourcev3.ClusterType,
				Nonce: tc.nonce, RemovedResources: tc.removed}
			wantSotW := &discoverypb.DiscoveryResponse{VersionInfo: "1234", TypeUrl: resourcev3.ClusterType, Nonce: tc.nonce}
			for i := range tc.fields {
				r, a := resource(i)
				r2, err := Encode(r.Name, r.Version, a, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				delta, sotw = append(delta, r2.Wire), append(sotw, r2.Any)
				wantDelta.Resources = append(wantDelta.Resources, r)
				wantSotW.Resources = append(wantSotW.Resources, a)
			}
			for _, c := range []struct {
				msg  *Message
				got  proto.Message
				want proto.Message
			}{
				{DeltaFields(1234, resourcev3.ClusterType, tc.nonce, delta, tc.removed), &discoverypb.DeltaDiscoveryResponse{}, wantDelta},
				{SotWFields(1234, resourcev3.ClusterType, tc.nonce, sotw), &discoverypb.DiscoveryResponse{}, wantSotW},
			} {
				bs, err := Codec{}.Marshal(c.msg)
				if err != nil {
					t.Fatal(err)
				}
				if len(bs) != len(c.msg.Parts) {
					t.Fatalf("%d buffers for %d parts", len(bs), len(c.msg.Parts))
				}
				b := bs.Materialize()
				if len(b) != c.msg.Size() {
					t.Errorf("%d bytes written, Size says %d", len(b), c.msg.Size())
				}
				if err := proto.Unmarshal(b, c.got); err != nil {
					t.Fatalf("decoding %T: %v", c.got, err)
				}
				if !proto.Equal(c.want, c.got) {
					t.Errorf("%T decodes to\n%v\nwant\n%v", c.got, c.got, c.want)
				}
			}
		})
	}
}

func TestCodeName(t *testing.T) {
	for code, want := range map[int32]string{0: "OK", 1: "CANCELLED", 5: "NOT_FOUND", 7: "PERMISSION_DENIED", 14: "UNAVAILABLE", 4: "DEADLINE_EXCEEDED", 99: "UNKNOWN", -1: "UNKNOWN"} {
		if got := CodeName(code); got != want {
			t.Errorf("CodeName(%d) = %q, want %q", code, got, want)
		}
	}
	e := NewError("x", 5, "gone")
	if e.Name != "x" || e.Code != 5 || e.Message != "gone" || len(e.Delta) == 0 || len(e.SotW) == 0 {
		t.Errorf("NewError: %+v", e)
	}
}

func TestDataError(t *testing.T) {
	for code, want := range map[codes.Code]bool{codes.NotFound: true, codes.PermissionDenied: true, codes.InvalidArgument: true,
		codes.ResourceExhausted: true, codes.Unavailable: false, codes.Internal: false, codes.Unknown: false,
		codes.DeadlineExceeded: false, codes.Unimplemented: false, codes.OK: false} {
		if got := DataError(int32(code)); got != want {
			t.Errorf("DataError(%v) = %v, want %v", code, got, want)
		}
	}
}

// A Message the Codec wrote goes back to the pool only once gRPC has let
// go of every reference to its buffers (the transport's, then the
// writer's), and only if gRPC counts them: a last part of more than 1 KiB.
func TestMessageUsedAgainOnceWritten(t *testing.T) {
	big := make([]byte, 4<<10)
	m := DeltaFields(1, resourcev3.EndpointType, "1", [][]byte{big}, nil)
	bs, err := Codec{}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, counted := bs[len(bs)-1].(mem.SliceBuffer); counted {
		t.Fatal("the last part is not counted")
	}
	bs.Ref()  // the transport's, until it has written the message
	bs.Free() // SendMsg's, once it has queued it
	if len(m.Parts) != 2 {
		t.Fatalf("the Message was used again while gRPC holds it: %d parts", len(m.Parts))
	}
	bs.Free()
	if m.Parts != nil {
		t.Fatal("the Message was not returned once written")
	}

	small := DeltaFields(1, resourcev3.EndpointType, "1", [][]byte{make([]byte, 100)}, nil)
	bs, err = Codec{}.Marshal(small)
	if err != nil {
		t.Fatal(err)
	}
	bs.Free()
	if len(small.Parts) != 2 {
		t.Fatal("a Message with a small last part was returned: gRPC does not count it")
	}
}

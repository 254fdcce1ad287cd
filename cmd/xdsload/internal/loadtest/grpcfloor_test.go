package loadtest

import (
	"errors"
	"io"
	"slices"
	"strconv"
	"testing"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// startTestGRPCFloor starts a gRPC floor for cfg and a connection to it,
// both stopped when the test ends.
func startTestGRPCFloor(t *testing.T, cfg Config) (*grpcFloor, seqCoding, *grpc.ClientConn) {
	t.Helper()
	cfg = cfg.Defaults()
	coding := newSeqCoding(kinds[cfg.Type], cfg.Updates)
	f, err := startGRPCFloor(&cfg, coding)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stop)
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return f, coding, conn
}

// A delta stream gets the subscribed resources, then each update's changed
// resource alone, each response with the type, a new version and the
// stream's next nonce: what the relay sends.
func TestGRPCFloorDeltaResponses(t *testing.T) {
	f, coding, conn := startTestGRPCFloor(t, Config{GRPCFloor: true, Resources: 3, Endpoints: 5, Updates: 2,
		Names: []string{"cla-2", "cla-0"}})
	s, err := openDelta(t.Context(), conn, "eds", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: coding.kind.typeURL, ResourceNamesSubscribe: []string{"cla-2", "cla-0"}}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		names []string
		seq   int
	}{{[]string{"cla-2", "cla-0"}, 0}, {[]string{"cla-2"}, 1}, {[]string{"cla-0"}, 2}}
	for i, w := range want {
		if i > 0 {
			if _, err := f.publish(i); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range resp.GetResources() {
			names = append(names, r.GetName())
			if got := coding.seqOf(r.GetResource()); got != w.seq || r.GetVersion() == "" {
				t.Errorf("response %d: %s carries seq %d, version %q; want %d", i, r.GetName(), got, r.GetVersion(), w.seq)
			}
		}
		nonce := strconv.Itoa(i + 1) // and the version, the first being 1
		if !slices.Equal(names, w.names) || resp.GetTypeUrl() != coding.kind.typeURL || resp.GetNonce() != nonce || resp.GetSystemVersionInfo() != nonce {
			t.Errorf("response %d: %v of %s, nonce %q, version %q; want %v, nonce and version %s", i, names,
				resp.GetTypeUrl(), resp.GetNonce(), resp.GetSystemVersionInfo(), w.names, nonce)
		}
		if err := s.Send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: coding.kind.typeURL, ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
}

// SotW CDS carries the full state: an update sends every subscribed
// cluster, the changed one among them.
func TestGRPCFloorSotWFullState(t *testing.T) {
	f, coding, conn := startTestGRPCFloor(t, Config{GRPCFloor: true, Variant: VariantSotW, Type: "cds", Resources: 4, Updates: 1})
	s, err := openSotW(t.Context(), conn, "cds", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discoverypb.DiscoveryRequest{TypeUrl: coding.kind.typeURL}); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.publish(1); err != nil {
		t.Fatal(err)
	}
	update, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, resp := range []*discoverypb.DiscoveryResponse{first, update} {
		if len(resp.GetResources()) != 4 {
			t.Fatalf("response %s: %d clusters, want 4", resp.GetNonce(), len(resp.GetResources()))
		}
	}
	var c clusterpb.Cluster
	if err := update.GetResources()[0].UnmarshalTo(&c); err != nil || c.GetName() != "cluster-0" || coding.seqOf(update.GetResources()[0]) != 1 {
		t.Errorf("update's first cluster: %v, %v; want cluster-0 at seq 1", &c, err)
	}
	if proto.Equal(first.GetResources()[0], update.GetResources()[0]) || !proto.Equal(first.GetResources()[1], update.GetResources()[1]) {
		t.Error("want cluster-0 changed and cluster-1 the same")
	}
	if update.GetVersionInfo() != "2" || update.GetNonce() != "2" {
		t.Errorf("update: version %q, nonce %q; want 2 and 2", update.GetVersionInfo(), update.GetNonce())
	}
}

// A stream of the variant the floor does not serve is refused as
// unimplemented, and says why.
func TestGRPCFloorRefusesTheOtherVariant(t *testing.T) {
	_, coding, conn := startTestGRPCFloor(t, Config{GRPCFloor: true})
	s, err := openSotW(t.Context(), conn, "eds", true)
	if err != nil {
		t.Fatal(err)
	}
	// The floor may end the stream before the request is sent: Send then
	// says io.EOF, and Recv has the status (gRPC's stream contract).
	if err := s.Send(&discoverypb.DiscoveryRequest{TypeUrl: coding.kind.typeURL}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = s.Recv()
	if st := status.Convert(err); st.Code() != codes.Unimplemented || st.Message() == "" {
		t.Errorf("SotW stream on a delta floor: %v, want unimplemented", err)
	}
}

package relay

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// The downstream fuzz targets send fuzzed requests to a relay serving the
// example resource files. An input is a sequence of messages, each a
// uvarint length and that many bytes of a request in the protobuf wire
// format (bytes that do not decode are skipped); its first byte picks the
// service. Seeds: testdata/fuzz/<target>. To fuzz longer:
//
//	go test -run '^$' -fuzz=FuzzSotWRequests -fuzztime=5m ./relay

// maxFuzzMessages bounds the requests one input sends.
const maxFuzzMessages = 64

// fuzzRelay starts a relay for a fuzz target: the example resources, groups
// that end soon after their last client, short polls.
func fuzzRelay(f *testing.F) *Relay {
	return startRelay(f, FilePrefix+"../examples/resources", func(c *Config) {
		c.Cache.Retention = 10 * time.Millisecond
		c.Downstream.PollTimeout = 50 * time.Millisecond
	})
}

// splitMessages decodes data as length-prefixed messages of type T.
func splitMessages[T any, P interface {
	*T
	proto.Message
}](data []byte) []*T {
	var out []*T
	for len(data) > 0 && len(out) < maxFuzzMessages {
		n, k := binary.Uvarint(data)
		if k <= 0 || n > uint64(len(data)-k) {
			break
		}
		m := P(new(T))
		if proto.Unmarshal(data[k:k+int(n)], m) == nil {
			out = append(out, (*T)(m))
		}
		data = data[k+int(n):]
	}
	return out
}

// exchange sends msgs on a new stream, then closes its side: the stream
// must end, with io.EOF or a status the relay chose (not UNKNOWN, which is
// an error without a status), within the bound. Responses are read
// meanwhile so that no send waits on them.
func exchange[Req, Resp any](t *testing.T, open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error), msgs []*Req) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := open(ctx)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	for _, m := range msgs {
		if st.Send(m) != nil {
			break // ended by the relay: the status comes from Recv
		}
	}
	st.CloseSend()
	err = <-ended // bounded by ctx
	if errors.Is(err, io.EOF) {
		return
	}
	switch s, _ := status.FromError(err); s.Code() {
	case codes.Unknown, codes.Internal:
		t.Fatalf("the stream ended without a status of the relay's: %v", err)
	case codes.DeadlineExceeded:
		t.Fatalf("the stream did not end after the client closed its side: %v", err)
	}
}

// stillServes checks that a well-behaved client is served by r.
func stillServes(t *testing.T, cc *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoverypb.DiscoveryRequest{Node: node("good", "demo"), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || len(resp.GetResources()) == 0 {
		t.Fatalf("a well-behaved client is not served: %v %v", resp, err)
	}
}

// FuzzSotWRequests: state-of-the-world requests on ADS (first byte even) or
// on the cluster service (odd).
func FuzzSotWRequests(f *testing.F) {
	cc := dial(f, fuzzRelay(f).Addr())
	fuzzStreams[discoverypb.DiscoveryRequest](f, cc,
		discoverypb.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources,
		clusterservice.NewClusterDiscoveryServiceClient(cc).StreamClusters)
}

// FuzzDeltaRequests: incremental requests on ADS (first byte even) or on
// the cluster service (odd).
func FuzzDeltaRequests(f *testing.F) {
	cc := dial(f, fuzzRelay(f).Addr())
	fuzzStreams[discoverypb.DeltaDiscoveryRequest](f, cc,
		discoverypb.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources,
		clusterservice.NewClusterDiscoveryServiceClient(cc).DeltaClusters)
}

// fuzzStreams sends an input's messages on a stream that ads (first byte
// even) or cds (odd) opens, then checks that cc is still served.
func fuzzStreams[Req any, P interface {
	*Req
	proto.Message
}, Resp any](f *testing.F, cc *grpc.ClientConn, ads, cds func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error)) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		msgs := splitMessages[Req, P](data[1:])
		if data[0]%2 == 0 {
			exchange(t, ads, msgs)
		} else {
			exchange(t, cds, msgs)
		}
		stillServes(t, cc)
	})
}

// restTypes are the REST-JSON paths a fuzzed request picks from (the last
// one serves nothing), with the type each answers.
var restTypes = []struct{ path, typeURL string }{
	{resourcev3.FetchClusters, resourcev3.ClusterType},
	{resourcev3.FetchListeners, resourcev3.ListenerType},
	{resourcev3.FetchRoutes, resourcev3.RouteType},
	{resourcev3.FetchEndpoints, resourcev3.EndpointType},
	{resourcev3.FetchSecrets, resourcev3.SecretType},
	{resourcev3.FetchScopedRoutes, resourcev3.ScopedRouteType},
	{resourcev3.FetchRuntimes, resourcev3.RuntimeType},
	{resourcev3.FetchExtensionConfigs, resourcev3.ExtensionConfigType},
	{"/v3/discovery:nothing", ""},
}

// FuzzRESTRequest posts a fuzzed body to a REST-JSON path: the answer is a
// response of the path's type, 304, or a client error; never a server
// error, never a panic.
func FuzzRESTRequest(f *testing.F) {
	r := fuzzRelay(f)
	h := r.down.RESTHandler()
	f.Fuzz(func(t *testing.T, pick uint8, body []byte) {
		rt := restTypes[int(pick)%len(restTypes)]
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, rt.path, bytes.NewReader(body)))
		switch {
		case w.Code >= 500:
			t.Fatalf("%s: %d %s", rt.path, w.Code, w.Body)
		case w.Code == http.StatusOK:
			resp := &discoverypb.DiscoveryResponse{}
			if err := protojson.Unmarshal(w.Body.Bytes(), resp); err != nil || resp.GetTypeUrl() != rt.typeURL {
				t.Fatalf("%s: 200 with %q (%v)", rt.path, w.Body, err)
			}
		}
	})
}

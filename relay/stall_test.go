package relay

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// stallHop is a control plane behind an HTTP/2 hop, as a load balancer
// is: written on x/net's HTTP/2 server (h2c), it answers pings (the
// server itself does) and gRPC health checks whatever happens to the ADS
// streams behind it. Each ADS stream it is opened is told, by the stream
// number, what to do with the first request: half-send a response and
// hang, send it whole, or stay silent.
type stallHop struct {
	addr string
	srv  *http.Server
	// delta and sotw are the response every stream answers with (or half
	// of), as gRPC messages, on delta and on state-of-the-world ADS.
	delta, sotw []byte

	mu      sync.Mutex
	streams []time.Time // when each ADS stream arrived
	opened  chan struct{}
}

// the plan of a stream, by its number from 0
type hopPlan func(n int) string

const (
	hopHalf   = "half"   // the prefix and half of the response, then nothing
	hopWhole  = "whole"  // the response, then silence
	hopSilent = "silent" // nothing
	hopTwice  = "twice"  // the response, and again a second later
)

func startStallHop(t *testing.T, delta *discoverypb.DeltaDiscoveryResponse, sotw *discoverypb.DiscoveryResponse, plan hopPlan) *stallHop {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &stallHop{addr: ln.Addr().String(), delta: marshalFrame(t, delta), sotw: marshalFrame(t, sotw), opened: make(chan struct{}, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("/grpc.health.v1.Health/Check", h.health)
	mux.HandleFunc("/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources", func(w http.ResponseWriter, r *http.Request) {
		h.ads(w, r, plan, h.delta)
	})
	mux.HandleFunc("/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources", func(w http.ResponseWriter, r *http.Request) {
		h.ads(w, r, plan, h.sotw)
	})
	h.srv = &http.Server{Handler: h2c.NewHandler(mux, &http2.Server{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		h.srv.Close()
		<-done
	})
	return h
}

// marshalFrame is m as a gRPC message.
func marshalFrame(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return grpcFrame(b)
}

// grpcFrame is b as a gRPC length-prefixed message.
func grpcFrame(b []byte) []byte {
	out := make([]byte, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	copy(out[5:], b)
	return out
}

// readFrame reads one gRPC message of r.
func readFrame(r io.Reader) ([]byte, error) {
	var prefix [5]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(prefix[1:]))
	_, err := io.ReadFull(r, b)
	return b, err
}

// grpcHeaders starts a gRPC response, its status in the trailers.
func grpcHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Trailer", "Grpc-Status")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
}

func (h *stallHop) health(w http.ResponseWriter, r *http.Request) {
	if _, err := readFrame(r.Body); err != nil {
		return
	}
	b, _ := proto.Marshal(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
	grpcHeaders(w)
	w.Write(grpcFrame(b))
	w.Header().Set("Grpc-Status", "0")
}

func (h *stallHop) ads(w http.ResponseWriter, r *http.Request, plan hopPlan, respond []byte) {
	h.mu.Lock()
	n := len(h.streams)
	h.streams = append(h.streams, time.Now())
	h.mu.Unlock()
	h.opened <- struct{}{}
	grpcHeaders(w)
	if _, err := readFrame(r.Body); err != nil {
		return
	}
	// The relay's later requests (its ACKs) are read and dropped.
	go io.Copy(io.Discard, r.Body)
	switch plan(n) {
	case hopHalf:
		w.Write(respond[:len(respond)/2])
		w.(http.Flusher).Flush()
	case hopWhole, hopTwice:
		w.Write(respond)
		w.(http.Flusher).Flush()
	}
	if plan(n) == hopTwice {
		select {
		case <-time.After(time.Second):
			w.Write(respond)
			w.(http.Flusher).Flush()
		case <-r.Context().Done():
		}
	}
	<-r.Context().Done() // until the relay ends the stream
}

// streamCount is how many ADS streams the relay has opened.
func (h *stallHop) streamCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.streams)
}

// hopClusters is a response of n clusters of about 700 bytes each, in
// delta and in state of the world.
func hopClusters(t *testing.T, n int) (*discoverypb.DeltaDiscoveryResponse, *discoverypb.DiscoveryResponse, []string) {
	t.Helper()
	delta := &discoverypb.DeltaDiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "1", SystemVersionInfo: "1"}
	sotw := &discoverypb.DiscoveryResponse{TypeUrl: resourcev3.ClusterType, Nonce: "1", VersionInfo: "1"}
	var names []string
	for i := range n {
		c := testcp.Cluster(fmt.Sprintf("big-%03d", i))
		c.AltStatName = strings.Repeat("x", 640)
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		delta.Resources = append(delta.Resources, &discoverypb.Resource{Name: c.Name, Version: "1", Resource: a})
		sotw.Resources = append(sotw.Resources, a)
		names = append(names, c.Name)
	}
	return delta, sotw, names
}

// stallSetup is a relay with short timers in front of a stallHop, speaking
// protocol to it.
func stallSetup(t *testing.T, protocol string, plan hopPlan) (*Relay, *stallHop, []string) {
	t.Helper()
	delta, sotw, names := hopClusters(t, 200)
	hop := startStallHop(t, delta, sotw, plan)
	r := startRelay(t, hop.addr, fastReconnect, func(c *Config) {
		c.Upstream.Protocol = protocol
		c.Upstream.StallTimeout = 2 * time.Second
		c.Cache.NotFoundTimeout = 1 * time.Second
	})
	return r, hop, names
}

// waitStream waits for the hop's next ADS stream, up to bound.
func (h *stallHop) waitStream(t *testing.T, bound time.Duration) {
	t.Helper()
	select {
	case <-h.opened:
	case <-time.After(bound):
		t.Fatalf("no new ADS stream within %s (%d so far)", bound, h.streamCount())
	}
}

// A control plane behind an HTTP/2 hop that answers pings and health
// checks, whose stream stops half-way through a 140 KB response: the
// names of that response are never reported not to exist (clients get
// UNAVAILABLE for them meanwhile), and the stream is ended within
// upstream.stall_timeout (and a check's quarter) and opened again; the
// response then arrives whole. Issue 36, item 1. In delta and in state
// of the world.
func TestStalledStreamBehindAHopIsReopened(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"delta", "sotw"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			stalledBehindAHop(t, protocol)
		})
	}
}

func stalledBehindAHop(t *testing.T, protocol string) {
	r, hop, names := stallSetup(t, protocol, func(n int) string {
		if n == 0 {
			return hopHalf
		}
		return hopWhole
	})
	if len(hop.delta) < 140<<10 || len(hop.sotw) < 140<<10 {
		t.Fatalf("the responses are %d and %d bytes, want 140 KB at least", len(hop.delta), len(hop.sotw))
	}
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names})
	hop.waitStream(t, wait)
	halfSent := time.Now()

	var got []string
	errs := map[string]codes.Code{}
	deadline := time.Now().Add(wait)
	for len(got) < len(names) {
		resp := d.recvWithin(time.Until(deadline))
		got = append(got, deltaNames(resp)...)
		if len(resp.GetRemovedResources()) > 0 {
			t.Fatalf("names of a half-sent response were reported removed: %v", resp.GetRemovedResources()[:1])
		}
		for _, e := range resp.GetResourceErrors() {
			code := codes.Code(e.GetErrorDetail().GetCode())
			if code == codes.NotFound {
				t.Fatalf("%s of a half-sent response was reported NOT_FOUND", e.GetResourceName().GetName())
			}
			errs[e.GetResourceName().GetName()] = code
		}
		d.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	}
	if n := hop.streamCount(); n != 2 {
		t.Fatalf("%d ADS streams, want 2: the stalled one and the one that answered", n)
	}
	hop.mu.Lock()
	reopened := hop.streams[1].Sub(halfSent)
	hop.mu.Unlock()
	t.Logf("the stalled stream was opened again %v after the response stopped half-way", reopened)
	// Not before the stall bound: the bound ended it, nothing sooner. (How
	// soon after it is the scheduler's; the wait above bounds it.)
	if reopened < 2*time.Second-100*time.Millisecond {
		t.Errorf("the stream was opened again after %v, before upstream.stall_timeout (2s)", reopened)
	}
	if errs[names[0]] != codes.Unavailable {
		t.Errorf("while the response was half-sent, %s had error %v, want UNAVAILABLE", names[0], errs[names[0]])
	}
	m := getMetrics(t, r)
	if !strings.Contains(m, `xdsrelay_upstream_stalls_total{upstream="default"} 1`) {
		t.Errorf("/metrics does not count the stall:\n%s", grepLines(m, "xdsrelay_upstream_stalls"))
	}
}

// A stream that has merely not answered is not stalled: the control plane
// behind the hop stays silent about a name it lacks, and the stream is
// not torn down, well past upstream.stall_timeout. The name is reported
// not to exist once the connection answers the relay's probe (the relay
// cannot tell this silence from a hung handler's: docs/control-planes.md).
// Issue 36, item 10.
func TestSilentStreamBehindAHopIsNotStalled(t *testing.T) {
	t.Parallel()
	r, hop, _ := stallSetup(t, "delta", func(int) string { return hopSilent })
	d := openDelta(t, r.Addr())
	d.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{"lacked"}})
	hop.waitStream(t, wait)
	deltaUntil(t, d, "", wait, func(_, removed []string, errs map[string]codes.Code) bool {
		return slices.Contains(removed, "lacked") && errs["lacked"] == codes.NotFound
	})
	select {
	case <-hop.opened:
		t.Fatalf("a silent stream was ended and opened again (%d streams)", hop.streamCount())
	case <-time.After(3 * 2 * time.Second):
	}
	if m := getMetrics(t, r); !strings.Contains(m, `xdsrelay_upstream_stalls_total{upstream="default"} 0`) {
		t.Errorf("/metrics counts a stall:\n%s", grepLines(m, "xdsrelay_upstream_stalls"))
	}
}

// A stall ends the streams that have received nothing since the stalled
// response began, not one that has: another group's stream on the same
// connection, answered since, keeps running while the stalled one is
// opened again.
func TestStallSparesAStreamAnsweredSince(t *testing.T) {
	t.Parallel()
	r, hop, names := stallSetup(t, "delta", func(n int) string {
		switch n {
		case 0:
			return hopTwice
		case 1:
			return hopHalf
		}
		return hopWhole
	})
	answered := openDelta(t, r.Addr())
	answered.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n1", "answered"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names})
	hop.waitStream(t, wait)
	deltaUntil(t, answered, "", wait, func(got, _ []string, _ map[string]codes.Code) bool { return len(got) == len(names) })

	stalled := openDelta(t, r.Addr())
	stalled.send(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "stalled"), TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: names})
	hop.waitStream(t, wait)
	hop.waitStream(t, wait) // the stalled stream, opened again
	deltaUntil(t, stalled, names[0], wait, func(got, _ []string, errs map[string]codes.Code) bool {
		if errs[names[0]] == codes.NotFound {
			t.Fatalf("%s of a half-sent response was reported NOT_FOUND", names[0])
		}
		return len(got) == len(names)
	})
	select {
	case <-hop.opened:
		t.Fatalf("a stream answered since the stall began was ended too (%d streams)", hop.streamCount())
	case <-time.After(2 * time.Second):
	}
}

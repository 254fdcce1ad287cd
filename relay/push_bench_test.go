package relay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// BenchmarkPush is the push path, measured against the gRPC floor: n
// delta ADS clients, each on its own connection over loopback, subscribe
// to one 200-endpoint ClusterLoadAssignment (about 10 KiB encoded); an
// operation is one change of it, and ends when every client has received
// the response and sent its ACK.
//
//   - server=relay: a relay started as the package's tests start one, in
//     front of a go-control-plane server (internal/testcp) that serves the
//     first version. Each change is applied to the group's cache, as the
//     upstream session applies what it decoded (cache.Apply): what is
//     measured is the fan-out (the cache's marks, the send workers, each
//     stream's flush, gRPC, each ACK's handling), not the upstream's one
//     receive and decode per change.
//   - server=floor: a bare grpc-go server on the same ADS service with the
//     relay's server options (serverOptions), that writes every stream the
//     same bytes, a delta response encoded once per change around the
//     resource's encoded bytes, and reads its ACKs: what any xDS server on
//     grpc-go pays at least.
//
// The clients run in a child process (this test binary again, running
// TestPushClients), so that the server process's CPU time, read with
// getrusage, is the server's alone. Reported per operation: ns/stream
// (wall time ÷ n), cpu-ns/stream (the server process's user and system
// CPU ÷ n), B/op and allocs/op (the server process's). The two cores of a
// small machine are shared by both processes, so ns/stream includes
// waiting for the clients; cpu-ns/stream does not.
//
//	go test -run '^$' -bench BenchmarkPush -benchtime 2s -count 10 ./relay
//
// .ci/push-bench runs both, interleaved, and computes relay ÷ floor.
func BenchmarkPush(b *testing.B) {
	sizes := []int{10, 100, 1000, 10000}
	if s := os.Getenv("PUSHBENCH_STREAMS"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("PUSHBENCH_STREAMS=%q: %v", s, err)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		for _, server := range []string{"relay", "floor"} {
			b.Run(fmt.Sprintf("server=%s/streams=%d", server, n), func(b *testing.B) {
				versions := pushVersions(b)
				var push func(i int)
				var addr string
				if server == "relay" {
					addr, push = pushRelay(b, versions)
				} else {
					addr, push = pushFloor(b, versions)
				}
				benchPush(b, addr, n, push)
			})
		}
	}
}

// pushCluster is the node.cluster of the benchmark's clients: one group.
const pushCluster = "push"

// pushVersions are two versions of cla-0, each 200 endpoints, encoded as
// the relay encodes what it receives; the benchmark alternates them.
func pushVersions(b *testing.B) [2]*cache.Resource {
	b.Helper()
	var out [2]*cache.Resource
	for v := range out {
		addrs := make([]string, 200)
		for i := range addrs {
			addrs[i] = fmt.Sprintf("10.%d.%d.%d:8080", v, i/250, i%250)
		}
		a, err := anypb.New(testcp.Endpoints("cla-0", addrs...))
		if err != nil {
			b.Fatal(err)
		}
		r, err := xds.Encode("cla-0", "v"+strconv.Itoa(v+1), a, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		out[v] = r
	}
	return out
}

// pushRelay starts a relay with no admission limits in front of a control
// plane that serves cla-0, and returns its address and a push that applies
// version i%2 to the clients' group's cache.
func pushRelay(b *testing.B, versions [2]*cache.Resource) (string, func(int)) {
	cp := testcp.Start(b)
	cp.Set(b, pushCluster, "0", testcp.Endpoints("cla-0", "10.255.0.1:8080"))
	r := startRelay(b, cp.Addr, func(c *Config) {
		c.Limits.StreamRate, c.Limits.MaxStreams, c.Limits.MaxGroups = 0, 0, 0
	})
	var c *cache.Cache
	return r.Addr(), func(i int) {
		if c == nil {
			if c = r.groupCache(keyOf(pushCluster)); c == nil {
				b.Fatal("no group for the clients")
			}
		}
		c.Apply(resourcev3.EndpointType, cache.Change{Upserts: []*cache.Resource{versions[i%2]}})
	}
}

// pushFloor starts the gRPC floor and returns its address and a push that
// encodes one response carrying version i%2 and writes it to every stream
// from as many goroutines as there are CPUs.
func pushFloor(b *testing.B, versions [2]*cache.Resource) (string, func(int)) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	f := &floor{first: floorResponse(0, versions[1])}
	cfg := Default()
	g := grpc.NewServer(append(serverOptions(cfg), grpc.ForceServerCodecV2(floorCodec{}))...)
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: discoverypb.AggregatedDiscoveryService_ServiceDesc.ServiceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "DeltaAggregatedResources", Handler: f.serve,
			ServerStreams: true, ClientStreams: true}},
		Metadata: discoverypb.AggregatedDiscoveryService_ServiceDesc.Metadata,
	}, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(ln)
	}()
	b.Cleanup(func() {
		g.Stop()
		<-done
	})
	return ln.Addr().String(), func(i int) {
		msg := floorResponse(i+1, versions[i%2])
		streams := f.all()
		var wg sync.WaitGroup
		workers := runtime.GOMAXPROCS(0)
		errs := make([]error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := w; j < len(streams); j += workers {
					if err := streams[j].SendMsg(msg); err != nil && errs[w] == nil {
						errs[w] = err
					}
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatalf("floor: send: %v", err)
			}
		}
	}
}

// floor is the gRPC floor's state: its streams, once each has been sent
// its first response.
type floor struct {
	first *floorMsg // read-only

	mu      sync.Mutex
	streams []grpc.ServerStream // guarded by mu
}

func (f *floor) all() []grpc.ServerStream {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.streams
}

// serve is a stream's handler: it reads the subscription, sends the first
// response, then reads ACKs until the stream ends.
func (f *floor) serve(_ any, ss grpc.ServerStream) error {
	req := &discoverypb.DeltaDiscoveryRequest{}
	if err := ss.RecvMsg(req); err != nil {
		return nil
	}
	if err := ss.SendMsg(f.first); err != nil {
		return nil
	}
	f.mu.Lock()
	f.streams = append(f.streams, ss)
	f.mu.Unlock()
	for {
		if err := ss.RecvMsg(req); err != nil {
			return nil
		}
	}
}

// floorMsg is a response encoded once, written as it is to every stream.
type floorMsg struct{ b []byte }

// floorResponse is a DeltaDiscoveryResponse of version seq and nonce seq
// carrying r: a header, then r's encoded resources field, as the relay
// assembles its own (xds.DeltaFields).
func floorResponse(seq int, r *cache.Resource) *floorMsg {
	s := strconv.Itoa(seq)
	h := protowire.AppendTag(nil, 1, protowire.BytesType) // system_version_info
	h = protowire.AppendString(h, s)
	h = protowire.AppendTag(h, 4, protowire.BytesType) // type_url
	h = protowire.AppendString(h, resourcev3.EndpointType)
	h = protowire.AppendTag(h, 5, protowire.BytesType) // nonce
	h = protowire.AppendString(h, s)
	return &floorMsg{b: append(h, r.Wire...)}
}

// floorCodec writes a floorMsg's bytes as they are, and reads requests
// with protobuf.
type floorCodec struct{}

var protoCodecV2 = encoding.GetCodecV2("proto")

func (floorCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*floorMsg); ok {
		return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
	}
	return protoCodecV2.Marshal(v)
}

func (floorCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return protoCodecV2.Unmarshal(data, v)
}

func (floorCodec) Name() string { return "proto" }

// pushWait bounds each wait for the clients: a setup of 10,000 streams, or
// one operation.
const pushWait = 3 * time.Minute

// benchPush starts n clients of addr in a child process, waits until
// each has its first response and has ACKed it, then times push, one
// operation each, until the clients report every ACK of it sent.
func benchPush(b *testing.B, addr string, n int, push func(int)) {
	lines := pushClients(b, addr, n)
	next := func(want string) {
		b.Helper()
		select {
		case got, ok := <-lines:
			if !ok {
				b.Fatalf("the clients ended before %q", want)
			}
			if got != want {
				b.Fatalf("the clients said %q, want %q", got, want)
			}
		case <-time.After(pushWait):
			b.Fatalf("the clients did not say %q within %v", want, pushWait)
		}
	}
	next("ready")
	// One change before timing: each stream's first push after its first
	// response is not the steady state.
	push(0)
	next("acked 1")
	runtime.GC()
	b.ReportAllocs()
	i := 1
	start := cpuTime()
	for b.Loop() {
		push(i)
		i++
		next("acked " + strconv.Itoa(i))
	}
	cpu := cpuTime() - start
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/stream")
}

// pushClients starts the clients' process and returns the lines it
// reports: "ready", then "acked K" once every client has ACKed its K-th
// push. The process ends when the benchmark does.
func pushClients(b *testing.B, addr string, n int) <-chan string {
	cmd := exec.Command(os.Args[0], "-test.run=^TestPushClients$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PUSHBENCH_CLIENTS_ADDR="+addr, "PUSHBENCH_CLIENTS_N="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lines := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "pushbench: "); ok {
				lines <- s
			}
		}
	}()
	b.Cleanup(func() {
		stdin.Close() // the clients' process ends when its input does
		go func() {
			for range lines {
			}
		}()
		<-read
		_ = cmd.Wait()
	})
	return lines
}

// TestPushClients is BenchmarkPush's clients, run in a process of their
// own; it is skipped unless the benchmark started it. Each client opens
// a connection and a delta ADS stream to PUSHBENCH_CLIENTS_ADDR,
// subscribes to cla-0, and ACKs every response; it reads of a response
// only its nonce, as a client's decoding is not what is measured.
func TestPushClients(t *testing.T) {
	addr, n := os.Getenv("PUSHBENCH_CLIENTS_ADDR"), os.Getenv("PUSHBENCH_CLIENTS_N")
	if addr == "" {
		t.Skip("BenchmarkPush's clients: run by the benchmark")
	}
	clients, err := strconv.Atoi(n)
	if err != nil {
		t.Fatal(err)
	}
	out := bufio.NewWriter(os.Stdout)
	report := make(chan int, 1)
	var acked atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	sem := make(chan struct{}, 64) // connections opening at once
	for i := range clients {
		sem <- struct{}{}
		go func() {
			err := pushClient(ctx, addr, i, func() {
				if k := acked.Add(1); k%int64(clients) == 0 {
					report <- int(k / int64(clients))
				}
			}, func() { <-sem })
			if err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "pushbench client %d: %v\n", i, err)
				os.Exit(1)
			}
		}()
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
		os.Exit(0)
	}()
	for k := range report {
		what := "acked " + strconv.Itoa(k-1)
		if k == 1 {
			what = "ready"
		}
		fmt.Fprintf(out, "pushbench: %s\n", what)
		out.Flush()
	}
}

// pushClient is one client: opened() is called once its first request is
// sent, acked() after each ACK.
func pushClient(ctx context.Context, addr string, i int, acked, opened func()) error {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(nonceCodec{})))
	if err != nil {
		opened()
		return err
	}
	defer cc.Close()
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
		"/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources")
	if err != nil {
		opened()
		return err
	}
	err = st.SendMsg(&discoverypb.DeltaDiscoveryRequest{
		Node:                   &corepb.Node{Id: "push-" + strconv.Itoa(i), Cluster: pushCluster},
		TypeUrl:                resourcev3.EndpointType,
		ResourceNamesSubscribe: []string{"cla-0"},
	})
	opened()
	if err != nil {
		return err
	}
	var resp nonceOnly
	ack := &discoverypb.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType}
	for {
		if err := st.RecvMsg(&resp); err != nil {
			return err
		}
		ack.ResponseNonce = resp.nonce
		if err := st.SendMsg(ack); err != nil {
			return err
		}
		acked()
	}
}

// nonceOnly is what a client reads of a DeltaDiscoveryResponse.
type nonceOnly struct{ nonce string }

// nonceCodec writes requests with protobuf and reads of a response only
// its nonce (field 5).
type nonceCodec struct{}

func (nonceCodec) Marshal(v any) (mem.BufferSlice, error) {
	bs, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(bs)}, err
}

func (nonceCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r := v.(*nonceOnly)
	r.nonce = ""
	b := data.Materialize()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num == 5 && typ == protowire.BytesType {
			s, m := protowire.ConsumeString(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			r.nonce = s
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		b = b[m:]
	}
	return nil
}

func (nonceCodec) Name() string { return "proto" }

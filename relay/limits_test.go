package relay

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Every bound is explicit: each limit refuses with RESOURCE_EXHAUSTED (429
// over REST-JSON) naming its key, counts the refusal, and leaves everything
// else as it was.

// endOf reads what is left of a stream and returns the error that ended it,
// failing the test if it does not end in time.
func endOf[Resp any](t *testing.T, recv func() (*Resp, error)) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- drain(recv) }()
	select {
	case err := <-errc:
		return err
	case <-time.After(wait):
		t.Fatal("the stream did not end")
	}
	return nil
}

// drain reads a stream until it ends, returning the error that ended it.
func drain[Resp any](recv func() (*Resp, error)) error {
	for {
		if _, err := recv(); err != nil {
			return err
		}
	}
}

// wantRefused fails the test unless err is RESOURCE_EXHAUSTED naming key.
func wantRefused(t *testing.T, err error, key string) {
	t.Helper()
	if grpcstatus.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), key) {
		t.Fatalf("ended with %v, want RESOURCE_EXHAUSTED naming %s", err, key)
	}
}

// rawDelta opens a delta ADS stream on a connection of its own, which the
// test reads itself.
func rawDelta(t *testing.T, addr string) grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse] {
	t.Helper()
	st, err := discoverypb.NewAggregatedDiscoveryServiceClient(dial(t, addr)).DeltaAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// refusedDelta opens a delta stream, sends reqs and returns how it ended.
func refusedDelta(t *testing.T, addr string, reqs ...*discoverypb.DeltaDiscoveryRequest) error {
	t.Helper()
	st := rawDelta(t, addr)
	for _, req := range reqs {
		// io.EOF: the relay ended the stream already; Recv says how.
		if err := st.Send(req); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	return endOf(t, st.Recv)
}

func cdsDelta(n *discoverypb.DeltaDiscoveryRequest, names ...string) *discoverypb.DeltaDiscoveryRequest {
	n.TypeUrl, n.ResourceNamesSubscribe = resourcev3.ClusterType, names
	return n
}

func waitMetric(t *testing.T, r *Relay, line string) {
	t.Helper()
	eventually(t, line+" on /metrics", func() bool { return strings.Contains(getMetrics(t, r), line+"\n") })
}

// limits.max_groups: the third cluster is refused, over gRPC and REST-JSON;
// the first two keep being served, and the control plane sees only their
// two streams.
func TestMaxGroups(t *testing.T) {
	cp := testcp.Start(t)
	for _, c := range []string{"c1", "c2", "c3"} {
		cp.Set(t, c, "1", testcp.Cluster("x-"+c))
	}
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Limits.MaxGroups = 2
		c.Downstream.RESTAddress = "127.0.0.1:0"
	})
	var served []*deltaStream
	for _, c := range []string{"c1", "c2"} {
		s := openDelta(t, r.Addr())
		s.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n-"+c, c)}))
		if got := deltaNames(s.recv()); !slices.Equal(got, []string{"x-" + c}) {
			t.Fatalf("%s: %v", c, got)
		}
		served = append(served, s)
	}
	err := refusedDelta(t, r.Addr(), cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n-c3", "c3")}))
	wantRefused(t, err, "limits.max_groups")
	if want := "xdsrelay: limits.max_groups (2) reached: no new group for this node"; grpcstatus.Convert(err).Message() != want {
		t.Errorf("message %q, want %q", grpcstatus.Convert(err).Message(), want)
	}
	body, _ := protojson.Marshal(&discoverypb.DiscoveryRequest{Node: node("rest", "c4")})
	resp, err := http.Post("http://"+r.RESTAddr()+"/v3/discovery:clusters", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), "limits.max_groups") {
		t.Fatalf("REST-JSON for a third group: %d %q, want 429 naming limits.max_groups", resp.StatusCode, b)
	}
	waitMetric(t, r, `xdsrelay_limit_refusals_total{limit="max_groups"} 2`)

	// A client of an existing group still joins; the groups are served.
	s := openDelta(t, r.Addr())
	s.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n-c1-2", "c1")}))
	s.recv()
	changed := testcp.Cluster("x-c1")
	changed.ConnectTimeout.Seconds = 5
	cp.Set(t, "c1", "2", changed)
	if got := deltaNames(served[0].recv()); !slices.Equal(got, []string{"x-c1"}) {
		t.Fatalf("c1 after the refusal: %v", got)
	}
	if n := cp.DeltaStreams.Load(); n != 2 {
		t.Fatalf("the control plane saw %d streams, want 2", n)
	}
}

// limits.max_names_per_stream: the request that passes it ends its stream;
// the group's other stream keeps being served, and its upstream stream
// stays up.
func TestMaxNamesPerStream(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("c"), testcp.Cluster("d"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Limits.MaxNamesPerStream = 3 })
	other := openDelta(t, r.Addr())
	other.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("other", "c1")}, "a"))
	other.recv()

	err := refusedDelta(t, r.Addr(),
		cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("greedy", "c1")}, "a", "b"),
		cdsDelta(&discoverypb.DeltaDiscoveryRequest{}, "c", "d"))
	wantRefused(t, err, "limits.max_names_per_stream")
	// A SotW stream asking for too many at once is refused the same way.
	sotw, serr := discoverypb.NewAggregatedDiscoveryServiceClient(dial(t, r.Addr())).StreamAggregatedResources(t.Context())
	if serr != nil {
		t.Fatal(serr)
	}
	if err := sotw.Send(&discoverypb.DiscoveryRequest{Node: node("greedy-sotw", "c1"), TypeUrl: resourcev3.ClusterType,
		ResourceNames: []string{"a", "b", "c", "d"}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	wantRefused(t, endOf(t, sotw.Recv), "limits.max_names_per_stream")
	waitMetric(t, r, `xdsrelay_limit_refusals_total{limit="max_names_per_stream"} 2`)

	changed := testcp.Cluster("a")
	changed.ConnectTimeout.Seconds = 5
	cp.Set(t, "c1", "2", changed, testcp.Cluster("b"), testcp.Cluster("c"), testcp.Cluster("d"))
	if got := deltaNames(other.recv()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("the other stream after the refusal: %v", got)
	}
	waitMetric(t, r, `xdsrelay_upstream_connected{group="`+keyOf("c1")+`"} 1`)
	if n := cp.DeltaStreams.Load(); n != 1 {
		t.Fatalf("the control plane saw %d streams, want the group's one", n)
	}
}

// limits.max_names_per_group: checked where the cache decides membership.
// The refused request ends its stream and reaches neither the cache nor the
// control plane; the group's other stream and its upstream are untouched.
func TestMaxNamesPerGroup(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("a"), testcp.Cluster("b"), testcp.Cluster("c"), testcp.Cluster("d"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Limits.MaxNamesPerGroup = 3 })
	first := openSotW(t, r.Addr())
	first.send(&discoverypb.DiscoveryRequest{Node: node("first", "c1"), TypeUrl: resourcev3.ClusterType, ResourceNames: []string{"a", "b"}})
	first.recv()

	err := refusedDelta(t, r.Addr(),
		cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("second", "c1")}, "a", "c"),
		cdsDelta(&discoverypb.DeltaDiscoveryRequest{}, "d"))
	wantRefused(t, err, "limits.max_names_per_group")
	waitMetric(t, r, `xdsrelay_limit_refusals_total{limit="max_names_per_group"} 1`)
	if n := upstreamCount(cp, "d", false); n != 0 {
		t.Fatalf("the refused name was subscribed upstream %d times", n)
	}

	changed := testcp.Cluster("a")
	changed.ConnectTimeout.Seconds = 5
	cp.Set(t, "c1", "2", changed, testcp.Cluster("b"), testcp.Cluster("c"), testcp.Cluster("d"))
	if got := sotwNames(first.recv()); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("the other stream after the refusal: %v", got)
	}
	waitMetric(t, r, `xdsrelay_upstream_connected{group="`+keyOf("c1")+`"} 1`)
	if n := cp.DeltaStreams.Load(); n != 1 {
		t.Fatalf("the control plane saw %d streams, want the group's one", n)
	}
}

// sotwNames are the names of the resources in a SotW response.
func sotwNames(resp *discoverypb.DiscoveryResponse) []string {
	var out []string
	for _, a := range resp.GetResources() {
		c := testcp.Cluster("")
		if a.UnmarshalTo(c) == nil {
			out = append(out, c.GetName())
		}
	}
	slices.Sort(out)
	return out
}

// openStreams is the relay's open streams, from /metrics: those serving
// and those waiting for their first request.
func openStreams(t *testing.T, r *Relay) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(getMetrics(t, r), "\n") {
		if strings.HasPrefix(line, "xdsrelay_downstream_streams{") || strings.HasPrefix(line, "xdsrelay_downstream_pending_streams ") {
			var v int
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			n += v
		}
	}
	return n
}

// limits.max_streams_per_connection: a connection opening more streams
// than allowed gets no more handlers than that; the extra stream waits, as
// HTTP/2 has it, and is served once another ends.
func TestMaxStreamsPerConnection(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Limits.MaxStreamsPerConnection = 2 })
	client := discoverypb.NewAggregatedDiscoveryServiceClient(dial(t, r.Addr()))
	var open []*deltaStream
	for i := range 2 {
		s := newStream(t, client.DeltaAggregatedResources)
		s.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node(fmt.Sprint("n", i), "c1")}))
		s.recv()
		open = append(open, s)
	}
	// The client waits for a free slot (in NewStream, or with its request
	// held, as gRPC's timing has it), and is served once there is one.
	answered := make(chan error, 1)
	go func() {
		st, err := client.DeltaAggregatedResources(t.Context())
		if err == nil {
			err = st.Send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1")}))
		}
		if err == nil {
			_, err = st.Recv()
		}
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a third stream was served (error: %v) while two were open", err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := openStreams(t, r); n != 2 {
		t.Fatalf("%d streams open on the relay, want 2", n)
	}
	open[0].close()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the third stream: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("the third stream was not served once a slot was free")
	}
}

// limits.max_streams: past it, new streams are refused; once one ends, a
// new one is admitted.
func TestMaxStreams(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) { c.Limits.MaxStreams = 2 })
	var open []*deltaStream
	for i := range 2 {
		s := openDelta(t, r.Addr())
		s.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node(fmt.Sprint("n", i), "c1")}))
		s.recv()
		open = append(open, s)
	}
	err := refusedDelta(t, r.Addr(), cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1")}))
	wantRefused(t, err, "limits.max_streams")
	waitMetric(t, r, `xdsrelay_limit_refusals_total{limit="max_streams"} 1`)
	open[0].close()
	eventually(t, "a stream ended", func() bool { return openStreams(t, r) == 1 })
	s := openDelta(t, r.Addr())
	s.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n3", "c1")}))
	s.recv()
}

// limits.stream_rate: with a burst of 2 and a rate of one new stream in
// 1000 seconds, the third stream is refused.
func TestStreamRate(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Limits.StreamRate = 0.001
		c.Limits.StreamBurst = 2
	})
	for i := range 2 {
		s := openDelta(t, r.Addr())
		s.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node(fmt.Sprint("n", i), "c1")}))
		s.recv()
	}
	err := refusedDelta(t, r.Addr(), cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n2", "c1")}))
	wantRefused(t, err, "limits.stream_rate")
	waitMetric(t, r, `xdsrelay_limit_refusals_total{limit="stream_rate"} 1`)
}

// limits.first_request_timeout: a stream that sends nothing is counted as
// pending while open, then ended.
func TestFirstRequestTimeout(t *testing.T) {
	cp := testcp.Start(t)
	r := startRelay(t, cp.Addr, func(c *Config) { c.Limits.FirstRequestTimeout = 200 * time.Millisecond })
	// The gauge is watched while the stream is open; should the stream end
	// before a scrape saw it, another one is tried.
	var err error
	seen := false
	deadline := time.After(wait)
	for attempt := 0; attempt < 20 && !seen; attempt++ {
		st := rawDelta(t, r.Addr())
		done := make(chan error, 1)
		go func() { done <- drain(st.Recv) }()
		for err = nil; err == nil; {
			select {
			case err = <-done:
			case <-deadline:
				t.Fatal("the silent stream did not end")
			case <-time.After(5 * time.Millisecond):
				seen = seen || strings.Contains(getMetrics(t, r), "xdsrelay_downstream_pending_streams 1\n")
			}
		}
	}
	if !seen {
		t.Fatal("xdsrelay_downstream_pending_streams never showed the silent stream")
	}
	wantRefused(t, err, "limits.first_request_timeout")
	waitMetric(t, r, "xdsrelay_downstream_pending_streams 0")
	if !strings.Contains(getMetrics(t, r), `xdsrelay_limit_refusals_total{limit="first_request_timeout"}`) {
		t.Fatal("the refusal is not counted")
	}
	// A stream that sends its request at once is served as usual.
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	s := openDelta(t, r.Addr())
	s.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1")}))
	s.recv()
}

// REST-JSON: a body that is not JSON is 415; a trickled body, or trickled
// headers, are cut by limits.rest_read_timeout; a body with broken framing
// is 400; a held poll outlives the timeout.
func TestRESTLimits(t *testing.T) {
	const readTimeout = 300 * time.Millisecond
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Downstream.RESTAddress = "127.0.0.1:0"
		c.Limits.RESTReadTimeout = readTimeout
	})
	url := "http://" + r.RESTAddr() + "/v3/discovery:clusters"
	body, _ := protojson.Marshal(&discoverypb.DiscoveryRequest{Node: node("rest", "c1")})
	resp, err := http.Post(url, "text/plain", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain: %d, want 415", resp.StatusCode)
	}

	t.Run("trickled body", func(t *testing.T) {
		conn := dialRaw(t, r.RESTAddr())
		fmt.Fprintf(conn, "POST /v3/discovery:clusters HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
		stop := trickle(conn, body)
		defer stop()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer to a trickled body: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "limits.rest_read_timeout") {
			t.Fatalf("trickled body: %d %q, want 408 naming limits.rest_read_timeout", resp.StatusCode, b)
		}
		waitMetric(t, r, `xdsrelay_limit_refusals_total{limit="rest_read_timeout"} 1`)
	})
	t.Run("broken chunked framing", func(t *testing.T) {
		conn := dialRaw(t, r.RESTAddr())
		fmt.Fprint(conn, "POST /v3/discovery:clusters HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n")
		conn.SetReadDeadline(time.Now().Add(wait))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer to a broken chunked body: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "request body") {
			t.Fatalf("broken chunked body: %d %q, want 400 about the request body", resp.StatusCode, b)
		}
	})
	t.Run("trickled headers", func(t *testing.T) {
		conn := dialRaw(t, r.RESTAddr())
		stop := trickle(conn, []byte("POST /v3/discovery:clusters HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nX-Padding: "+strings.Repeat("p", 1000)))
		defer stop()
		conn.SetReadDeadline(time.Now().Add(wait))
		// Closed: an end of file, or a reset if a byte was still coming.
		if _, err := io.ReadAll(conn); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the connection was not closed")
		}
	})
	t.Run("held poll", func(t *testing.T) {
		resp, err := http.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		first := &discoverypb.DiscoveryResponse{}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err := protojson.Unmarshal(b, first); err != nil {
			t.Fatalf("first poll: %d %s", resp.StatusCode, b)
		}
		held, _ := protojson.Marshal(&discoverypb.DiscoveryRequest{Node: node("rest", "c1"), VersionInfo: first.GetVersionInfo()})
		answer := make(chan string, 1)
		go func() {
			resp, err := http.Post(url, "application/json", bytes.NewReader(held))
			if err != nil {
				answer <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answer <- fmt.Sprint(resp.StatusCode, " ", string(b))
		}()
		select {
		case a := <-answer:
			t.Fatalf("the poll was answered before any change: %s", a)
		case <-time.After(3 * readTimeout):
		}
		cp.Set(t, "c1", "2", testcp.Cluster("x"), testcp.Cluster("y"))
		select {
		case a := <-answer:
			if !strings.HasPrefix(a, "200 ") || !strings.Contains(a, `"y"`) {
				t.Fatalf("held poll: %s, want 200 with the change", a)
			}
		case <-time.After(wait):
			t.Fatal("the held poll was not answered")
		}
	})
}

func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// trickle writes b to conn a byte at a time, 50ms apart, until stopped or
// done.
func trickle(conn net.Conn, b []byte) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := range b {
			select {
			case <-quit:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := conn.Write(b[i : i+1]); err != nil {
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// Each limit and connection bound is checked: a bad value is refused
// naming its key.
func TestValidateLimits(t *testing.T) {
	for key, mutate := range map[string]func(*Config){
		"limits.max_groups":                   func(c *Config) { c.Limits.MaxGroups = -1 },
		"limits.max_names_per_stream":         func(c *Config) { c.Limits.MaxNamesPerStream = -1 },
		"limits.max_names_per_group":          func(c *Config) { c.Limits.MaxNamesPerGroup = -1 },
		"limits.max_streams_per_connection":   func(c *Config) { c.Limits.MaxStreamsPerConnection = 1 << 40 },
		"limits.max_streams":                  func(c *Config) { c.Limits.MaxStreams = -1 },
		"limits.stream_rate":                  func(c *Config) { c.Limits.StreamRate = -1 },
		"limits.stream_burst":                 func(c *Config) { c.Limits.StreamBurst = 0 },
		"limits.first_request_timeout":        func(c *Config) { c.Limits.FirstRequestTimeout = -1 },
		"limits.rest_read_timeout":            func(c *Config) { c.Limits.RESTReadTimeout = -1 },
		"limits.max_polls":                    func(c *Config) { c.Limits.MaxPolls = -1 },
		"downstream.max_connection_age":       func(c *Config) { c.Downstream.MaxConnectionAge = -1 },
		"downstream.max_connection_age_grace": func(c *Config) { c.Downstream.MaxConnectionAgeGrace = -1 },
		"downstream.max_connection_idle":      func(c *Config) { c.Downstream.MaxConnectionIdle = -1 },
	} {
		c := Default()
		mutate(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), key+":") {
			t.Errorf("%s: error %v, want one naming the key", key, err)
		}
	}
}

package relay

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// Connections that rebalance and end: downstream.max_connection_age,
// .max_connection_age_grace and .max_connection_idle.

// dialCounted is dial, counting the connections the ClientConn makes.
func dialCounted(t *testing.T, addr string) (*grpc.ClientConn, *atomic.Int64) {
	t.Helper()
	var dials atomic.Int64
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc, &dials
}

// downstream.max_connection_age: the connection of a delta client is sent
// GOAWAY and, its stream still open after the grace, closed. The client
// opens a new stream on the same ClientConn (as Envoy and gRPC do), which
// reconnects, and is served from the cache: the control plane sees no new
// request.
func TestMaxConnectionAge(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Downstream.MaxConnectionAge = 500 * time.Millisecond
		c.Downstream.MaxConnectionAgeGrace = 500 * time.Millisecond
		c.Downstream.MaxConnectionIdle = 0
	})
	cc, dials := dialCounted(t, r.Addr())
	ads := discoverypb.NewAggregatedDiscoveryServiceClient(cc)
	subscribe := func() grpc.BidiStreamingClient[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse] {
		t.Helper()
		st, err := ads.DeltaAggregatedResources(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1")}, "x")); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if got := deltaNames(resp); !slices.Equal(got, []string{"x"}) {
			t.Fatalf("served %v, want [x]", got)
		}
		return st
	}
	first := subscribe()
	err := endOf(t, first.Recv)
	if grpcstatus.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `debug data: "max_age"`) {
		t.Fatalf("the stream ended with %v, want UNAVAILABLE after a GOAWAY for max_age", err)
	}
	upstream := cp.DeltaRequests.Load()

	subscribe()
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: the aged one and its successor", n)
	}
	deadline := time.After(200 * time.Millisecond)
	for {
		if n := cp.DeltaRequests.Load(); n != upstream {
			t.Fatalf("the reconnected client made %d requests upstream, want none: %v", n-upstream, cp.Requests()[upstream:])
		}
		select {
		case <-deadline:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// downstream.max_connection_idle over gRPC: a connection without streams
// is sent GOAWAY (max_idle) and closed; one with a stream open is not.
func TestMaxConnectionIdleGRPC(t *testing.T) {
	const idle = 300 * time.Millisecond
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Downstream.MaxConnectionAge = 0
		c.Downstream.MaxConnectionIdle = idle
	})
	busy := openDelta(t, r.Addr())
	busy.send(cdsDelta(&discoverypb.DeltaDiscoveryRequest{Node: node("n", "c1")}, "x"))
	busy.recv()

	conn := dialRaw(t, r.Addr())
	if got := goAwayDebugData(t, conn); got != "max_idle" {
		t.Fatalf("GOAWAY with debug data %q, want max_idle", got)
	}
	select {
	case <-busy.done:
		t.Fatal("a connection with a stream open was closed as idle")
	default:
	}
}

// goAwayDebugData speaks just enough HTTP/2 on conn, a connection that opens
// no stream, to read the server's frames until it closes the connection,
// and returns the debug data of its last GOAWAY ("" if none).
func goAwayDebugData(t *testing.T, conn net.Conn) string {
	t.Helper()
	conn.SetDeadline(time.Now().Add(wait))
	const settings, ping, goAway, ack = 0x4, 0x6, 0x7, 0x1
	frame := func(typ, flags byte, payload []byte) []byte {
		h := make([]byte, 9, 9+len(payload))
		h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		h[3], h[4] = typ, flags
		return append(h, payload...)
	}
	if _, err := conn.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(settings, 0, nil)...)); err != nil {
		t.Fatal(err)
	}
	debug := ""
	rd := bufio.NewReader(conn)
	for {
		var h [9]byte
		if _, err := io.ReadFull(rd, h[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "reset") {
				return debug
			}
			t.Fatalf("reading frames: %v (GOAWAY debug data so far %q)", err, debug)
		}
		payload := make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
		if _, err := io.ReadFull(rd, payload); err != nil {
			t.Fatal(err)
		}
		var reply []byte
		switch typ, flags := h[3], h[4]; {
		case typ == settings && flags&ack == 0:
			reply = frame(settings, ack, nil)
		case typ == ping && flags&ack == 0:
			reply = frame(ping, ack, payload)
		case typ == goAway && len(payload) >= 8:
			debug = string(payload[8:])
			if code := binary.BigEndian.Uint32(payload[4:8]); code != 0 {
				t.Fatalf("GOAWAY with error code %d, want NO_ERROR", code)
			}
		}
		if reply != nil {
			conn.Write(reply) // the server may have closed its side already
		}
	}
}

// downstream.max_connection_idle over REST-JSON: a keep-alive connection
// serves one request after another, and is closed once it waits longer
// than the bound for the next.
func TestMaxConnectionIdleREST(t *testing.T) {
	cp := testcp.Start(t)
	cp.Set(t, "c1", "1", testcp.Cluster("x"))
	r := startRelay(t, cp.Addr, func(c *Config) {
		c.Downstream.RESTAddress = "127.0.0.1:0"
		c.Downstream.MaxConnectionIdle = 300 * time.Millisecond
	})
	body, _ := protojson.Marshal(&discoverypb.DiscoveryRequest{Node: node("rest", "c1")})
	conn := dialRaw(t, r.RESTAddr())
	conn.SetDeadline(time.Now().Add(wait))
	rd := bufio.NewReader(conn)
	for i := range 2 { // kept alive between the two
		fmt.Fprintf(conn, "POST /v3/discovery:clusters HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatalf("request %d on the connection: %v", i+1, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Close || !strings.Contains(string(b), `"x"`) {
			t.Fatalf("request %d: %d %q (close %v), want 200 with x, kept alive", i+1, resp.StatusCode, b, resp.Close)
		}
	}
	if n, err := rd.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the idle connection read %d bytes, %v; want it closed", n, err)
	}
}

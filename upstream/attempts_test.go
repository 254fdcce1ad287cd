package upstream

import (
	"net"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
)

// refusedConn is a connection, with its attempts followed, to a loopback
// address that refuses: gRPC tries it every 200ms.
func refusedConn(t *testing.T) (*grpc.ClientConn, *Attempts) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	attempts, counted := TrackAttempts()
	every := backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1, MaxDelay: 200 * time.Millisecond}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), counted,
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: every, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); attempts.Release() })
	return conn, attempts
}

// The connection's failed attempts are counted as gRPC makes them, and
// its closing leaves no attempt failing.
func TestAttemptsCounted(t *testing.T) {
	conn, attempts := refusedConn(t)
	conn.Connect()
	deadline := time.Now().Add(10 * time.Second)
	for {
		failed, failing, next, tracked := attempts.now()
		if failed >= 3 {
			if !failing || !tracked {
				t.Fatalf("3 attempts failed, and failing %v, tracked %v", failing, tracked)
			}
			break
		}
		select {
		case <-next:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%d attempts failed in 10s, want 3", failed)
		}
	}
	conn.Close()
	if _, failing, _, _ := attempts.now(); failing {
		t.Error("a closed connection is still failing")
	}
}

// A client on a connection that is refused reports each failed attempt
// once, though its own backoff (20ms) is shorter than gRPC's (200ms): its
// reconnects never outrun the attempts failed by more than the one being
// reported, and catch up with them.
func TestRefusedAttemptReportedOnce(t *testing.T) {
	conn, attempts := refusedConn(t)
	m := NewMetrics(&metrics.Registry{})
	c := cache.New(cache.Options{Retention: time.Minute})
	w := cache.NewWatch()
	c.Watch(w, resourcev3.ClusterType, "a")
	startClient(t, Options{Servers: []Server{{Name: "refused", Conn: conn, Attempts: attempts}}, Node: &corepb.Node{Id: "n"},
		Cache: c, Metrics: m, Group: "g", Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1, MaxDelay: 20 * time.Millisecond}})
	reconnects := m.Reconnects.With("g")
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := reconnects.Get()
		failed, _, _, _ := attempts.now()
		if n > int64(failed)+1 {
			t.Fatalf("%d reconnects counted for %d failed attempts", n, failed)
		}
		if failed >= 5 && n == int64(failed) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reconnects counted for %d failed attempts after 10s", n, failed)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

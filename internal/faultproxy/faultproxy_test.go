package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend listens on 127.0.0.1:0 and runs handle on each connection it
// accepts, then closes it. stop makes it refuse connections, as a server
// that stopped listening; at the test's end it also waits for its
// handlers, which return once their clients close.
func backend(t *testing.T, handle func(net.Conn)) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	stop = func() { ln.Close() }
	t.Cleanup(func() {
		stop()
		wg.Wait()
	})
	return ln.Addr().String(), stop
}

// echo is a backend that writes back what it reads.
func echo(t *testing.T) string {
	addr, _ := backend(t, func(c net.Conn) { io.Copy(c, c) })
	return addr
}

func start(t *testing.T) (*Proxy, net.Conn) {
	t.Helper()
	p, err := Start(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return p, c
}

func roundTrip(t *testing.T, c net.Conn, msg []byte, within time.Duration) error {
	t.Helper()
	if _, err := c.Write(msg); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(within))
	got := make([]byte, len(msg))
	_, err := io.ReadFull(c, got)
	if err == nil && !bytes.Equal(got, msg) {
		t.Fatalf("echoed %q, want %q", got, msg)
	}
	return err
}

func TestSilentHoldsThenDelivers(t *testing.T) {
	p, c := start(t)
	if err := roundTrip(t, c, []byte("hello"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Set(Silent, 0)
	if err := roundTrip(t, c, []byte("held"), 200*time.Millisecond); err == nil {
		t.Fatal("a silent proxy forwarded bytes")
	}
	p.Set(Pass, 0)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
		t.Fatalf("after the partition healed: %q, %v", got, err)
	}
}

func TestTrickle(t *testing.T) {
	p, c := start(t)
	p.Set(Trickle, 20<<10) // 20 KiB/s each way, together
	start := time.Now()
	if err := roundTrip(t, c, make([]byte, 10<<10), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// 20 KiB crossed (10 each way) at 20 KiB/s, less the first burst.
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Fatalf("trickled 20 KiB in %v", took)
	}
}

func TestReset(t *testing.T) {
	p, c := start(t)
	if err := roundTrip(t, c, []byte("x"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection outlived a reset")
	}
	// New connections are served.
	c2, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := roundTrip(t, c2, []byte("y"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// A silent pair closed by Close does not hold the proxy's goroutines.
func TestCloseWhileSilent(t *testing.T) {
	p, c := start(t)
	p.Set(Silent, 0)
	c.Write([]byte("stuck"))
	time.Sleep(50 * time.Millisecond) // the bytes reach the held forward
	p.Close()
}

// named is a backend that writes its name on every connection it accepts,
// then holds the connection until the client closes it; stop makes it
// refuse connections, as a server that stopped listening.
func named(t *testing.T, name string) (addr string, stop func()) {
	return backend(t, func(c net.Conn) {
		c.Write([]byte(name))
		io.Copy(io.Discard, c)
	})
}

// through opens a connection through p and returns it and the name of the
// backend that answered.
func through(t *testing.T, p *Proxy) (net.Conn, string) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 1)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("no backend answered: %v", err)
	}
	return c, string(got)
}

// With several backends each new connection goes to the next in turn,
// and a backend that refuses is skipped; Open tells where they are.
func TestBalancesAndSkipsARefusingBackend(t *testing.T) {
	a, stopA := named(t, "a")
	b, _ := named(t, "b")
	p, err := Start(a, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	var got []string
	for range 4 {
		_, name := through(t, p)
		got = append(got, name)
	}
	if strings.Join(got, "") != "abab" {
		t.Fatalf("connections went to %v, want a and b in turn", got)
	}
	if open := p.Open(); open[a] != 2 || open[b] != 2 {
		t.Fatalf("open %v, want 2 to each", open)
	}
	stopA()
	got = got[:0]
	for range 3 {
		_, name := through(t, p)
		got = append(got, name)
	}
	if strings.Join(got, "") != "bbb" {
		t.Fatalf("with a refusing, connections went to %v, want b", got)
	}
	// a keeps the connections it had: it stopped listening, as a relay
	// that drains.
	if open := p.Open(); open[a] != 2 || open[b] != 5 {
		t.Fatalf("open %v, want 2 to a and 5 to b", open)
	}
}

// A connection that no backend accepts is closed.
func TestNoBackendAccepts(t *testing.T) {
	a, stopA := named(t, "a")
	stopA()
	p, err := Start(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d, %v: want the connection closed", n, err)
	}
	if _, err := Start(); err == nil {
		t.Fatal("Start without a backend: no error")
	}
}

// A reset ends a silent pair whose bytes are held both ways: its
// connections are closed, and it no longer counts as open.
func TestResetWhileSilent(t *testing.T) {
	a, _ := named(t, "a")
	p, err := Start(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	p.Set(Silent, 0)
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("x"))              // held on its way to a
	time.Sleep(50 * time.Millisecond) // a's name is held on its way back
	p.Reset()
	deadline := time.Now().Add(5 * time.Second)
	for len(p.Open()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("open %v 5s after a reset", p.Open())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StartFrom dials its backend from the address it is given, as a sidecar
// that binds its own address does.
func TestStartFromDialsFromTheSource(t *testing.T) {
	from := make(chan string, 1)
	addr, stop := backend(t, func(c net.Conn) {
		from <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		c.Close()
	})
	defer stop()
	p, err := StartFrom(net.IPv4(127, 0, 0, 6), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case ip := <-from:
		if ip != "127.0.0.6" {
			t.Fatalf("the backend was dialled from %s, want 127.0.0.6", ip)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the backend was not dialled")
	}
}

package downstream

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/metrics"
)

// Marks from many goroutines while flushes run: never two flushes of one
// stream at once, and a flush always follows the last mark.
func TestPumpFlushesOnceAtATimeAndMissesNoMark(t *testing.T) {
	pool := newSendPool(4)
	var marks, seen, running atomic.Int64
	var overlap atomic.Bool
	p := &pump{pool: pool, conn: pool.conn(nil)}
	p.flush = func() error {
		if running.Add(1) > 1 {
			overlap.Store(true)
		}
		seen.Store(marks.Load())
		time.Sleep(10 * time.Microsecond)
		running.Add(-1)
		return nil
	}
	const markers, each = 8, 500
	var wg sync.WaitGroup
	for range markers {
		wg.Go(func() {
			for range each {
				marks.Add(1)
				p.ready()
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for seen.Load() != markers*each {
		if time.Now().After(deadline) {
			t.Fatalf("the last flush saw %d marks of %d", seen.Load(), markers*each)
		}
		time.Sleep(time.Millisecond)
	}
	if overlap.Load() {
		t.Fatal("two flushes of one stream ran at once")
	}
}

// A failed flush ends the stream: no flush runs after, and the handler's
// next request, or its Recv's end, gets the error.
func TestPumpFlushErrorEndsTheStream(t *testing.T) {
	stopped := make(chan struct{})
	pool := newSendPool(1)
	p := &pump{pool: pool, conn: pool.conn(nil)}
	failure := context.DeadlineExceeded
	flushes := 0
	p.flush = func() error { flushes++; close(stopped); return failure }
	p.ready()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream was not stopped")
	}
	p.mu.Lock()
	if p.err != failure || !p.ended {
		t.Errorf("stopped with %v, ended %v", p.err, p.ended)
	}
	p.mu.Unlock()
	p.ready()
	if p.failure() != failure {
		t.Errorf("failure %v, want %v", p.failure(), failure)
	}
	if err := handle[struct{}](p, nil, &struct{}{}); err != failure {
		t.Errorf("handle after the failure: %v", err)
	}
	p.end()
	p.mu.Lock()
	defer p.mu.Unlock()
	if flushes != 1 {
		t.Errorf("%d flushes, want 1", flushes)
	}
}

// A worker whose send is slow is replaced: with one worker blocked, a
// queued stream still flushes.
func TestSendPoolReplacesASlowWorker(t *testing.T) {
	pool := newSendPool(1)
	release := make(chan struct{})
	blocked := &pump{pool: pool, conn: pool.conn(&net.TCPAddr{Port: 1})}
	entered := make(chan struct{})
	blocked.flush = func() error {
		close(entered)
		<-release
		return nil
	}
	blocked.ready()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no worker took the queued stream")
	}
	flushed := make(chan struct{})
	other := &pump{pool: pool, conn: pool.conn(&net.TCPAddr{Port: 2}), flush: func() error { close(flushed); return nil }}
	other.ready()
	pool.slow(nil) // what the send guard calls once the send has been blocked for slowSend
	select {
	case <-flushed:
	case <-time.After(10 * time.Second):
		t.Fatal("the queued stream waited for the blocked worker")
	}
	pool.unblocked(nil)
	close(release)
}

// uncomparableAddr is a net.Addr that cannot be a map key.
type uncomparableAddr struct{ parts []string }

func (uncomparableAddr) Network() string  { return "test" }
func (a uncomparableAddr) String() string { return "uncomparable" }

// Streams are grouped by connection address; an address that cannot be a
// map key gets a queue of its own instead of a panic.
func TestSendPoolGroupsByConnection(t *testing.T) {
	pool := newSendPool(1)
	a := &net.TCPAddr{Port: 1}
	c1, c2 := pool.conn(a), pool.conn(a)
	if c1 != c2 {
		t.Fatal("two streams of one connection have different queues")
	}
	if pool.conn(&net.TCPAddr{Port: 1}) == c1 {
		t.Fatal("another connection from an equal address shares the queue")
	}
	u := pool.conn(uncomparableAddr{})
	if u == nil || u.addr != nil {
		t.Fatalf("uncomparable address: %+v", u)
	}
	pool.release(c1)
	pool.release(c2)
	if _, ok := pool.conns[a]; ok {
		t.Fatal("the connection's queue outlived its streams")
	}
}

// The watchdog finds a send that stays blocked, whether a send worker runs
// it or the stream's handler does (a request's own flush): after slowSend
// it is slow, and a worker is counted out of the pool (a handler's
// goroutine is no worker: the pool is not told); at the send timeout the
// client's connection is closed (xdsrelay_downstream_stuck_total); once
// the send returns the pool counts a worker back and the watchdog stops.
func TestWatchdogFindsBlockedSends(t *testing.T) {
	for _, onWorker := range []bool{true, false} {
		s, err := New(Options{Groups: noGroups{}, Metrics: &metrics.Registry{},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SendTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}})
		release := make(chan struct{})
		g := s.guard(ctx, func(any) error { <-release; return nil }, "test", time.Now())
		p := &pump{pool: s.sends, conn: s.sends.conn(nil), guard: g}
		g.conn = p.conn
		p.flush = func() error { return g.send(nil) }
		done := make(chan error, 1)
		if onWorker {
			p.ready()
		} else {
			p.state.Store(pumpQueued) // as handle leaves it for runInline
			go func() { done <- p.runInline() }()
		}
		blocked := func() int {
			s.sends.mu.Lock()
			defer s.sends.mu.Unlock()
			return s.sends.blocked
		}
		slow := func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.slow
		}
		eventually(t, "the blocked send to be found slow", slow)
		if want := map[bool]int{true: 1, false: 0}[onWorker]; blocked() != want {
			t.Fatalf("worker %v: %d blocked workers counted, want %d", onWorker, blocked(), want)
		}
		if s.stuck.Get() != 0 {
			t.Fatalf("worker %v: the connection was closed before the send timeout", onWorker)
		}
		eventually(t, "the stuck client's connection to be closed", func() bool { return s.stuck.Get() == 1 })
		close(release)
		if !onWorker {
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the handler's send did not return")
			}
		}
		eventually(t, "the send to be counted back", func() bool { return blocked() == 0 })
		eventually(t, "the watchdog to stop", func() bool {
			s.sends.watchMu.Lock()
			defer s.sends.watchMu.Unlock()
			return !s.sends.watching
		})
		if n := s.stuck.Get(); n != 1 {
			t.Fatalf("worker %v: %d connections closed for one stuck send", onWorker, n)
		}
	}
}

// eventually waits up to 10 seconds for cond, as the other packages' tests do.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A flush that ends the stream once the handler's wait for the first
// answer is over, before the handler stops letting flushes end it, is not
// lost: the handler is given its error when it stops (canEnd), rather than
// go on to read requests on a stream that sends nothing more.
func TestPumpEndAfterTheFirstAnswerWaitIsReturned(t *testing.T) {
	pool := newSendPool(1)
	end := status.Error(codes.NotFound, "xdsrelay: x does not exist")
	var ending atomic.Bool
	p := &pump{pool: pool, conn: pool.conn(nil), stream: &streamBase{}}
	p.flush = func() error {
		if ending.Load() {
			return end
		}
		return nil
	}
	p.canEnd(true)
	if err := p.awaitFirst(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("the wait: %v", err)
	}
	ending.Store(true)
	p.ready() // a worker's flush, as a change reaches the stream
	eventually(t, "the flush to end the stream", func() bool { return p.failure() != nil })
	if err := p.canEnd(false); err != end {
		t.Fatalf("the handler was given %v, want %v", err, end)
	}
}

package downstream

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

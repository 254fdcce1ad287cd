package downstream

import (
	"testing"
	"time"
)

// Waits fire in order once due, stopped ones never, and the goroutine ends
// once nothing waits (goleak checks it at the end of the package's tests).
func TestDeadlinesFireInOrder(t *testing.T) {
	d := newDeadlines(50 * time.Millisecond)
	a, b, c := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)
	d.add(a)
	wb := d.add(b)
	d.add(c)
	wb.stop()
	for _, ch := range []chan struct{}{a, c} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("a deadline did not fire")
		}
	}
	select {
	case <-b:
		t.Fatal("a stopped wait fired")
	case <-time.After(100 * time.Millisecond):
	}
	waitIdle(t, d)
}

// The last wait to stop ends the goroutine at once, not at its deadline.
func TestDeadlinesEndWhenNothingWaits(t *testing.T) {
	d := newDeadlines(time.Hour)
	w := d.add(make(chan struct{}, 1))
	w.stop()
	waitIdle(t, d)
	// And it starts again for the next one.
	ch := make(chan struct{}, 1)
	d2 := newDeadlines(10 * time.Millisecond)
	d2.add(ch)
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no fire after a restart")
	}
	waitIdle(t, d2)
}

func waitIdle(t *testing.T, d *deadlines) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.mu.Lock()
		running := d.running
		d.mu.Unlock()
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the deadline goroutine did not end")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

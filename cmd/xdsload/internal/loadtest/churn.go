package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Churn is what a churn run (Config.Churn) measured: clients that connect,
// get their first config and disconnect, over and over, and the server's
// memory before, during and after.
type Churn struct {
	// Elapsed is from the first cycle's start to the last one's end.
	Elapsed    time.Duration `json:"elapsed_ns"`
	Cycles     int           `json:"cycles"` // completed: open, subscribe, first response, close
	Failed     int           `json:"failed_cycles"`
	FirstError string        `json:"first_error,omitempty"`
	PerSec     float64       `json:"cycles_per_sec"` // completed cycles over Elapsed
	Cycle      Summary       `json:"cycle"`          // a completed cycle's time

	// The server: before the clients, at the end of the churn (cycles in
	// flight), ChurnSettle after the last client stopped, and then once it
	// has collected its garbage and returned free memory to the system.
	Baseline  ServerSample `json:"baseline"`
	End       ServerSample `json:"end"`
	Settled   ServerSample `json:"settled"`
	Collected ServerSample `json:"collected"`
}

// ServerSample is the server's memory at one moment.
type ServerSample struct {
	RSS    int64         `json:"rss"`              // zero without a PID
	Memory *ServerMemory `json:"memory,omitempty"` // split runs only
}

// churnLog is what one churning client did; its goroutine owns it.
type churnLog struct {
	cycles []time.Duration
	failed int
	err    error
}

// failurePause spaces a client's cycles after one fails, so that a server
// that refuses streams is not hammered in a tight loop.
const failurePause = 10 * time.Millisecond

// churn runs cfg.Clients clients that cycle until cfg.Churn has passed,
// samples the server along the way and fills res.Churn.
func churn(ctx context.Context, cfg *Config, b backend, res *Result) error {
	x := churnClients(b)
	if x == nil {
		return errors.New("churn: the floor does not churn")
	}
	ch := &Churn{Baseline: ServerSample{RSS: res.RSS.Start, Memory: res.ServerMemoryStart}}
	res.Churn = ch
	logs := make([]churnLog, cfg.Clients)
	var done atomic.Int64
	start := time.Now()
	end := start.Add(cfg.Churn)
	stopProgress := progress(cfg, func(elapsed time.Duration) string {
		return fmt.Sprintf("xdsload: %4.0fs churn: %d cycles", elapsed.Seconds(), done.Load())
	}, start)
	defer stopProgress()
	var wg sync.WaitGroup
	lctx, stop := context.WithDeadline(ctx, end)
	defer stop()
	launch(lctx, cfg.Clients, cfg.Rate, func(i int) {
		wg.Go(func() { logs[i] = churnClient(ctx, x, i, end, &done) })
	})
	<-lctx.Done()
	ch.End = sampleServer(cfg, b, false)
	wg.Wait()
	ch.fill(logs, time.Since(start))
	if err := pause(ctx, cfg.ChurnSettle); err != nil {
		return fmt.Errorf("churn: settling: %w", err)
	}
	ch.Settled = sampleServer(cfg, b, false)
	ch.Collected = sampleServer(cfg, b, true)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("churn: %w", err)
	}
	if ch.Failed > 0 {
		return fmt.Errorf("churn: %d of %d cycles failed; %s", ch.Failed, ch.Failed+ch.Cycles, ch.FirstError)
	}
	return nil
}

// churnClient runs client i's cycles until end (one at least), or until ctx
// ends; it counts every completed one in done.
func churnClient(ctx context.Context, x *xdsClients, i int, end time.Time, done *atomic.Int64) churnLog {
	var l churnLog
	release, err := x.hold(i)
	if err != nil {
		return churnLog{failed: 1, err: fmt.Errorf("client %d: %w", i, err)}
	}
	defer release()
	// Every client completes a cycle at least, however late it starts.
	for first := true; ctx.Err() == nil && (first || time.Now().Before(end)); first = false {
		t := time.Now()
		err := x.cycle(ctx, i)
		if err == nil {
			l.cycles = append(l.cycles, time.Since(t))
			done.Add(1)
			continue
		}
		if ctx.Err() != nil {
			break
		}
		l.failed++
		if l.err == nil {
			l.err = fmt.Errorf("client %d: %w", i, err)
		}
		_ = pause(ctx, failurePause)
	}
	return l
}

// fill computes the cycle figures from every client's log.
func (ch *Churn) fill(logs []churnLog, elapsed time.Duration) {
	ch.Elapsed = elapsed
	var all []time.Duration
	for _, l := range logs {
		all = append(all, l.cycles...)
		ch.Failed += l.failed
		if l.err != nil && ch.FirstError == "" {
			ch.FirstError = l.err.Error()
		}
	}
	ch.Cycles = len(all)
	ch.PerSec = perSecond(ch.Cycles, elapsed)
	ch.Cycle = Summarize(all)
}

// churnClients is the xDS clients of b; nil for the floor.
func churnClients(b backend) *xdsClients {
	switch b := b.(type) {
	case *xdsBackend:
		return b.xdsClients
	case *splitBackend:
		x, _ := b.clients.(*xdsClients)
		return x
	}
	return nil
}

// sampleServer samples the server's RSS and, in a split run, its runtime
// memory; with collectFirst, once it has collected its garbage and
// returned free memory to the system (this process, when not split).
func sampleServer(cfg *Config, b backend, collectFirst bool) ServerSample {
	var s ServerSample
	sb, split := b.(*splitBackend)
	switch {
	case split && collectFirst:
		s.Memory = sb.collect()
	case split:
		s.Memory = sb.memory()
	case collectFirst:
		collect()
	}
	s.RSS = sampleRSS(cfg.PID)
	return s
}

// pause waits for d, or for ctx to end.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeTable prints the cycles, and the server's memory at each sample.
func (ch *Churn) writeTable(tw io.Writer, connections int) {
	fmt.Fprintf(tw, "cycles\tfailed\tconnections\tstreams/s\tcycle (ms) p50\tp99\tmax\telapsed\t\n")
	fmt.Fprintf(tw, "%d\t%d\t%d\t%.1f\t%s\t%s\t%s\t%s\t\n\n", ch.Cycles, ch.Failed, connections, ch.PerSec,
		ms(ch.Cycle.P50), ms(ch.Cycle.P99), ms(ch.Cycle.Max), ch.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "server\tRSS\tgoroutines\theap in use\t\n")
	for _, s := range ch.samples() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", s.name, size(s.RSS), s.goroutines(), s.heap())
	}
	fmt.Fprintln(tw)
}

// namedSample is a ServerSample and when it was taken.
type namedSample struct {
	name string
	ServerSample
}

func (ch *Churn) samples() []namedSample {
	return []namedSample{
		{"baseline", ch.Baseline}, {"end of churn", ch.End},
		{"settled", ch.Settled}, {"after GC", ch.Collected},
	}
}

// goroutines is the sample's goroutine count, "-" without runtime figures.
func (s ServerSample) goroutines() string {
	if s.Memory == nil {
		return "-"
	}
	return fmt.Sprint(s.Memory.Goroutines)
}

// heap is the sample's heap in use, "-" without runtime figures.
func (s ServerSample) heap() string {
	if s.Memory == nil {
		return "-"
	}
	return size(int64(s.Memory.HeapInuse))
}

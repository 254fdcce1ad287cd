package loadtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// floor is the socket floor: a TCP server on loopback that writes to every
// connection, for the initial config and for each update, a frame as large
// as the xDS response that would carry it. A frame is a 4-byte length and a
// payload whose first 4 bytes are the sequence number.
type floor struct {
	// Read-only after startFloor.
	ln         net.Listener // nil on the clients' side of a split run
	addr       string       // where the clients dial
	initial    []byte       // the initial config's frame
	updateSize int          // an update's payload size
	timeout    time.Duration
	acceptDone chan struct{}

	bytes  atomic.Int64
	dialed atomic.Int64

	mu    sync.Mutex
	conns []net.Conn // server side, guarded by mu
}

func startFloor(cfg *Config) (*floor, error) {
	initial, update, err := responseSizes(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	f := &floor{ln: ln, addr: ln.Addr().String(), initial: frame(0, initial), updateSize: update, timeout: cfg.Timeout, acceptDone: make(chan struct{})}
	go f.accept()
	return f, nil
}

// frame is the frame of seq with a payload of size bytes.
func frame(seq, size int) []byte {
	b := make([]byte, 4+max(size, 4))
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	binary.BigEndian.PutUint32(b[4:], uint32(seq))
	return b
}

func (f *floor) accept() {
	defer close(f.acceptDone)
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(f.timeout))
		if _, err := c.Write(f.initial); err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
	}
}

// publish writes the frame of seq to every connection, from as many
// goroutines as there are CPUs.
func (f *floor) publish(seq int) (time.Time, error) {
	f.mu.Lock()
	conns := slices.Clone(f.conns)
	f.mu.Unlock()
	b := frame(seq, f.updateSize)
	t := time.Now()
	err := inParallel(len(conns), func(j int) error {
		_, err := conns[j].Write(b)
		return err
	})
	if err != nil {
		return t, fmt.Errorf("floor: %w", err)
	}
	return t, nil
}

// inParallel calls write for 0..n-1 from as many goroutines as there are
// CPUs, each taking every GOMAXPROCS-th, and returns once every call has;
// the error is the first of each goroutine's, joined.
func inParallel(n int, write func(j int) error) error {
	shards := max(min(runtime.GOMAXPROCS(0), n), 1)
	errs := make([]error, shards)
	var wg sync.WaitGroup
	for w := range shards {
		wg.Go(func() {
			for j := w; j < n; j += shards {
				if err := write(j); err != nil && errs[w] == nil {
					errs[w] = err
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// run is floor client i: it reads frames until ctx ends.
func (f *floor) run(ctx context.Context, i int, tr *tracker) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", f.addr)
	if err != nil {
		return err
	}
	f.dialed.Add(1)
	defer conn.Close()
	defer closeOnDone(ctx, conn)()
	tr.established(i)
	var hdr [4]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(hdr[:]))
		buf = slices.Grow(buf[:0], n)[:n]
		if _, err := io.ReadFull(conn, buf); err != nil {
			return err
		}
		now := time.Now()
		f.bytes.Add(int64(4 + n))
		tr.observe(i, int(binary.BigEndian.Uint32(buf)), now)
	}
}

func (f *floor) bytesReceived() int64 { return f.bytes.Load() }

func (f *floor) connections() int { return int(f.dialed.Load()) }

func (f *floor) stop() {
	if f.ln == nil {
		return
	}
	f.ln.Close()
	<-f.acceptDone
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}

// closeOnDone closes c when ctx ends; the returned func stops watching and
// waits for the watcher to exit.
func closeOnDone(ctx context.Context, c io.Closer) (release func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-ctx.Done():
			c.Close()
		case <-done:
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// responseSizes are the sizes of the responses that carry the initial
// config and an update, as go-control-plane's snapshot cache builds them:
// SotW sends every subscribed resource each time, delta only what changed.
func responseSizes(cfg *Config) (initial, update int, err error) {
	kd := kinds[cfg.Type]
	names := cfg.Names
	if len(names) == 0 {
		names = resourceNames(kd, cfg.Resources)
	}
	var all []*anypb.Any
	for i, n := range names {
		a, err := anypb.New(kd.build(n, i, kd.markMin, cfg.Endpoints))
		if err != nil {
			return 0, 0, err
		}
		all = append(all, a)
	}
	if cfg.Variant == VariantSotW {
		n := proto.Size(&discoverypb.DiscoveryResponse{VersionInfo: "1", Resources: all, TypeUrl: kd.typeURL, Nonce: "1"})
		return n, n, nil
	}
	return deltaSize(kd, names, all), deltaSize(kd, names[:1], all[:1]), nil
}

func deltaSize(kd kind, names []string, all []*anypb.Any) int {
	resp := &discoverypb.DeltaDiscoveryResponse{SystemVersionInfo: "1", TypeUrl: kd.typeURL, Nonce: "1"}
	for i, a := range all {
		resp.Resources = append(resp.Resources, &discoverypb.Resource{Name: names[i], Version: "0123456789abcdef", Resource: a})
	}
	return proto.Size(resp)
}

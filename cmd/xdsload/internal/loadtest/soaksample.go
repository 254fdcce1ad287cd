package loadtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/relay"
)

// RelaySample is the relay's process at one moment of a soak: its memory
// after a forced collection (runtime.GC and debug.FreeOSMemory, as a
// churn's "after GC" sample), goroutines, open files, and the streams the
// relay counts open.
type RelaySample struct {
	RSS       int64 `json:"rss"`
	HeapAlloc int64 `json:"heap_alloc"` // the live heap: objects that survived the collection
	// HeapInuse is the heap's spans in use: the live heap and the free
	// room in its spans, which a 20s soak is still growing into.
	HeapInuse  int64 `json:"heap_inuse"`
	Goroutines int   `json:"goroutines"`
	FDs        int   `json:"fds"`     // entries of /proc/PID/fd
	Streams    int   `json:"streams"` // xdsrelay_downstream_streams, every variant
}

// sampleRelay samples this process, which runs r.
func sampleRelay(r *relay.Relay) (*RelaySample, error) {
	collect()
	m := readMemory()
	pid := os.Getpid()
	rss, err := ReadRSS(pid)
	if err != nil {
		return nil, err
	}
	fds, err := countFDs(pid)
	if err != nil {
		return nil, err
	}
	// Last: the request itself takes a connection and goroutines for a
	// moment.
	streams, err := scrapeGauge(r.AdminAddr(), streamsMetric)
	if err != nil {
		return nil, err
	}
	return &RelaySample{RSS: rss, HeapInuse: int64(m.HeapInuse), HeapAlloc: int64(m.HeapAlloc), Goroutines: m.Goroutines, FDs: fds, Streams: streams}, nil
}

// countFDs counts the open files of process pid, less the one that reads
// them.
func countFDs(pid int) (int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, fmt.Errorf("fds: %w", err)
	}
	return len(entries) - 1, nil
}

// scrapeClient reads the relay's /metrics; it keeps no connection open.
var scrapeClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// The relay's gauges of open downstream streams, and of its groups'
// upstream streams that are up.
const (
	streamsMetric   = "xdsrelay_downstream_streams"
	connectedMetric = "xdsrelay_upstream_connected"
)

// upstreamConnected counts r's groups whose upstream stream is up.
func upstreamConnected(r *relay.Relay) (int, error) {
	return scrapeGauge(r.AdminAddr(), connectedMetric)
}

// scrapeGauge sums gauge name, every series, from the relay's admin
// endpoint's /metrics.
func scrapeGauge(admin, name string) (int, error) {
	if admin == "" {
		return 0, fmt.Errorf("%s: the relay has no admin endpoint", name)
	}
	resp, err := scrapeClient.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: /metrics: %s", name, resp.Status)
	}
	return sumGauge(resp.Body, name)
}

// sumGauge sums the series of gauge name in a Prometheus text exposition.
func sumGauge(body io.Reader, name string) (int, error) {
	n, found := 0.0, false
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest == "" || (rest[0] != '{' && rest[0] != ' ')) {
			continue
		}
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", name, line, err)
		}
		n, found = n+v, true
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	if !found {
		return 0, fmt.Errorf("no %s in /metrics", name)
	}
	return int(n), nil
}

// The in-process relay and control plane, as a soak drives them.

func (s *cpStack) pause() error  { return s.cp.pause() }
func (s *cpStack) resume() error { return s.cp.resume() }

func (s *cpStack) relaySample() (*RelaySample, error) {
	if s.relay == nil {
		return nil, errors.New("soak: no relay to sample")
	}
	return sampleRelay(s.relay)
}

func (s *cpStack) upstreamConnected() (int, error) {
	if s.relay == nil {
		return 0, errors.New("soak: no relay to sample")
	}
	return upstreamConnected(s.relay)
}

func (s relayServer) relaySample() (*RelaySample, error) { return sampleRelay(s.r) }
func (s relayServer) upstreamConnected() (int, error)    { return upstreamConnected(s.r) }

// relaySampler samples a relay; pausable is a control plane that goes
// down and comes back; faultLink is the link between the relay and its
// control plane, through a faultproxy (SoakConfig.Faults). A soak drives
// an in-process server side, or a split run's children, through them.
type (
	relaySampler interface {
		relaySample() (*RelaySample, error)
		upstreamConnected() (int, error)
	}
	pausable interface {
		pause() error
		resume() error
	}
	faultLink interface {
		link(mode faultproxy.Mode, bytesPerSecond int) error
		resetLink() error
	}
)

var (
	errNoSoakServer = errors.New("soak: needs the relay in front of the tool's control plane")
	errNoFaultLink  = errors.New("soak: no faultproxy between the relay and its control plane: give soak-faults")
)

// link sets the faultproxy p's mode; resetLink resets its connections.
func link(p *faultproxy.Proxy, mode faultproxy.Mode, bytesPerSecond int) error {
	if p == nil {
		return errNoFaultLink
	}
	p.Set(mode, bytesPerSecond)
	return nil
}

func resetLink(p *faultproxy.Proxy) error {
	if p == nil {
		return errNoFaultLink
	}
	p.Reset()
	return nil
}

func (s *cpStack) link(mode faultproxy.Mode, rate int) error { return link(s.proxy, mode, rate) }
func (s *cpStack) resetLink() error                          { return resetLink(s.proxy) }

func (b *xdsBackend) link(mode faultproxy.Mode, rate int) error {
	if s, ok := b.server.(faultLink); ok {
		return s.link(mode, rate)
	}
	return errNoSoakServer
}

func (b *xdsBackend) resetLink() error {
	if s, ok := b.server.(faultLink); ok {
		return s.resetLink()
	}
	return errNoSoakServer
}

func (b *splitBackend) link(mode faultproxy.Mode, rate int) error { return link(b.proxy, mode, rate) }
func (b *splitBackend) resetLink() error                          { return resetLink(b.proxy) }

func (b *xdsBackend) pause() error {
	if s, ok := b.server.(pausable); ok {
		return s.pause()
	}
	return errNoSoakServer
}

func (b *xdsBackend) resume() error {
	if s, ok := b.server.(pausable); ok {
		return s.resume()
	}
	return errNoSoakServer
}

func (b *xdsBackend) relaySample() (*RelaySample, error) {
	if s, ok := b.server.(relaySampler); ok {
		return s.relaySample()
	}
	return nil, errNoSoakServer
}

func (b *xdsBackend) upstreamConnected() (int, error) {
	if s, ok := b.server.(relaySampler); ok {
		return s.upstreamConnected()
	}
	return 0, errNoSoakServer
}

// A split soak: the control plane's child pauses and resumes, the relay's
// samples itself.

func (b *splitBackend) pause() error {
	_, err := b.publisher().do(childCommand{Op: "cp-pause"})
	return err
}

func (b *splitBackend) resume() error {
	_, err := b.publisher().do(childCommand{Op: "cp-resume"})
	return err
}

func (b *splitBackend) relaySample() (*RelaySample, error) {
	reply, err := b.child.do(childCommand{Op: "soak"})
	if err != nil {
		return nil, err
	}
	if reply.Sample == nil {
		return nil, errors.New("split: server side: no sample")
	}
	return reply.Sample, nil
}

func (b *splitBackend) upstreamConnected() (int, error) {
	reply, err := b.child.do(childCommand{Op: "upstream"})
	return reply.Connected, err
}

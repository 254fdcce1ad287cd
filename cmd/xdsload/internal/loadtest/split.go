package loadtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/faultproxy"
	"github.com/xdsrelay/xdsrelay/relay"
)

// A split run (Config.Split) runs the server side in a child process: the
// same executable, started with serverSideEnv set, which serves what the
// parent describes and publishes updates when told. Parent and child speak
// JSON lines over the child's stdin and stdout; the child's stderr is the
// parent's progress output.
//
// Both sides run on one machine, so the publish time the child reports
// (wall clock) and the receipt times the parent records are on one clock.

// serverSideEnv, set in a process's environment, makes ServerSideMain serve.
const serverSideEnv = "XDSLOAD_SERVER_SIDE"

// childHello is the parent's first line: what to serve.
type childHello struct {
	Config Config `json:"config"`
	Base   uint32 `json:"seq_base"`
	// RelayUpstream, if set, makes the child run xdsrelay alone, in front
	// of the control plane there (another child, which publishes): the
	// relay's CPU and memory are then its own.
	RelayUpstream string `json:"relay_upstream,omitempty"`
}

// childReady is the child's first line: where it serves, or why it cannot.
type childReady struct {
	Target string `json:"target"`
	PID    int    `json:"pid"`
	Error  string `json:"error,omitempty"`
}

// childCommand is a later line from the parent.
type childCommand struct {
	// "publish", "profile" (start), "profile-stop", "memory", "heap", "gc",
	// "lrs" (the control plane's load reporting server's counts),
	// "streams" (its streams open, and ever opened),
	// or for a soak "soak" (sample the relay), "upstream" (the relay's
	// upstream streams that are up), "cp-pause" and "cp-resume".
	Op   string `json:"op"`
	Seq  int    `json:"seq,omitempty"`
	File string `json:"file,omitempty"`
}

// childReply answers a command.
type childReply struct {
	UnixNano  int64         `json:"unix_nano,omitempty"` // when an update was published
	Memory    *ServerMemory `json:"memory,omitempty"`
	Sample    *RelaySample  `json:"sample,omitempty"`
	Connected int           `json:"connected,omitempty"` // the relay's groups with their upstream stream up
	LRS       *LRSStats     `json:"lrs,omitempty"`       // the control plane's load reporting server's counts
	// Streams are the control plane's streams open, by node.cluster, and
	// Opened those ever opened (a fleet run's "streams" op).
	Streams map[string]int `json:"streams,omitempty"`
	Opened  int            `json:"opened,omitempty"`
	Error   string         `json:"error,omitempty"`
}

// ServerMemory is where a split run's server keeps its memory, as the Go
// runtime tells: what bounds its RSS.
type ServerMemory struct {
	Goroutines int    `json:"goroutines"`
	StackInuse uint64 `json:"stack_inuse"` // goroutine stacks
	HeapInuse  uint64 `json:"heap_inuse"`  // heap spans in use (live objects and garbage not yet swept)
	HeapAlloc  uint64 `json:"heap_alloc"`  // heap objects, live or not yet collected
	Sys        uint64 `json:"sys"`         // everything the runtime took from the OS
}

// goroutines is m's goroutine count; 0 for no figures.
func (m *ServerMemory) goroutines() int {
	if m == nil {
		return 0
	}
	return m.Goroutines
}

func readMemory() *ServerMemory {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return &ServerMemory{Goroutines: runtime.NumGoroutine(), StackInuse: ms.StackInuse,
		HeapInuse: ms.HeapInuse, HeapAlloc: ms.HeapAlloc, Sys: ms.Sys}
}

// ServerSideMain serves as the child of a split run and exits, if this
// process was started as one; otherwise it returns at once. Call it first
// thing in main (and in TestMain of tests that run split).
func ServerSideMain() {
	if os.Getenv(serverSideEnv) == "" {
		return
	}
	if err := serveServerSide(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "xdsload server side:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// serveServerSide starts what the hello read from in describes, reports on
// out where it serves, then carries out commands until in ends. It is one
// piece on purpose: the child's whole protocol, start, then a loop of
// commands, read in one place.
func serveServerSide(in io.Reader, out io.Writer) error {
	dec, enc := json.NewDecoder(in), json.NewEncoder(out)
	var hello childHello
	if err := dec.Decode(&hello); err != nil {
		return fmt.Errorf("reading what to serve: %w", err)
	}
	cfg := hello.Config
	cfg.Progress = os.Stderr
	coding := seqCoding{kind: kinds[cfg.Type], base: hello.Base, updates: cfg.markSpan(), wrap: cfg.soaking()}
	srv, target, err := startServerSide(&cfg, coding, hello.RelayUpstream)
	if err != nil {
		_ = enc.Encode(childReady{Error: err.Error()})
		return err
	}
	defer srv.stop()
	if err := enc.Encode(childReady{Target: target, PID: os.Getpid()}); err != nil {
		return err
	}
	var stopProfile func()
	defer func() {
		if stopProfile != nil {
			stopProfile()
		}
	}()
	for {
		var cmd childCommand
		if err := dec.Decode(&cmd); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		reply := soakCommand(srv, cmd)
		switch cmd.Op {
		case "soak", "upstream", "cp-pause", "cp-resume":
		case "publish":
			t, err := srv.publish(cmd.Seq)
			reply.UnixNano = t.UnixNano()
			if err != nil {
				reply.Error = err.Error()
			}
		case "profile":
			if stopProfile == nil {
				if stopProfile, err = startCPUProfile(cmd.File); err != nil {
					reply.Error = err.Error()
				}
			}
		case "streams":
			if s, ok := srv.(*cpStack); ok {
				reply.Streams, reply.Opened = s.cp.counts.live.count()
			} else {
				reply.Error = "streams: not a control plane"
			}
		case "lrs":
			if s, ok := srv.(*cpStack); ok {
				st := s.lrsStats()
				reply.LRS = &st
			} else {
				reply.Error = "lrs: not a control plane"
			}
		case "memory":
			reply.Memory = readMemory()
		case "heap":
			if err := writeHeapProfile(cmd.File); err != nil {
				reply.Error = err.Error()
			}
		case "gc":
			collect()
			reply.Memory = readMemory()
		case "profile-stop":
			if stopProfile != nil {
				stopProfile()
				stopProfile = nil
			}
		default:
			reply.Error = fmt.Sprintf("unknown op %q", cmd.Op)
		}
		if err := enc.Encode(reply); err != nil {
			return err
		}
	}
}

// soakCommand carries out a soak's command on srv; other commands get
// an empty reply.
func soakCommand(srv serverSide, cmd childCommand) childReply {
	var reply childReply
	sampler, samples := srv.(relaySampler)
	cp, pauses := srv.(pausable)
	err := fmt.Errorf("%s: not a server side that a soak drives this way", cmd.Op)
	switch {
	case cmd.Op == "soak" && samples:
		reply.Sample, err = sampler.relaySample()
	case cmd.Op == "upstream" && samples:
		reply.Connected, err = sampler.upstreamConnected()
	case cmd.Op == "cp-pause" && pauses:
		err = cp.pause()
	case cmd.Op == "cp-resume" && pauses:
		err = cp.resume()
	case !slices.Contains([]string{"soak", "upstream", "cp-pause", "cp-resume"}, cmd.Op):
		return reply
	}
	if err != nil {
		reply.Error = err.Error()
	}
	return reply
}

// serverSide is what serves the clients and publishes updates.
type serverSide interface {
	publish(seq int) (time.Time, error)
	stop()
}

// startServerSide starts the floor's server, the relay alone in front of
// relayUpstream if set, the gRPC floor, or the control plane (and the relay
// in front of it if cfg.Relay), and returns the address clients dial.
func startServerSide(cfg *Config, coding seqCoding, relayUpstream string) (serverSide, string, error) {
	if relayUpstream != "" {
		r, err := startRelay(relayUpstream, cfg)
		if err != nil {
			return nil, "", err
		}
		return relayServer{r}, r.Addr(), nil
	}
	if cfg.Floor {
		f, err := startFloor(cfg)
		if err != nil {
			return nil, "", err
		}
		return f, f.addr, nil
	}
	cfg.Target = ""
	srv, err := startServer(cfg, coding)
	if err != nil {
		return nil, "", err
	}
	if srv == nil {
		return nil, "", errors.New("nothing to serve: give serve-cp, floor or grpc-floor")
	}
	return srv, cfg.Target, nil
}

// relayServer is xdsrelay alone: its control plane, in another process,
// publishes the updates.
type relayServer struct{ r *relay.Relay }

func (relayServer) publish(int) (time.Time, error) {
	return time.Time{}, errors.New("the relay's control plane publishes, not the relay")
}

func (s relayServer) stop() { stopRelay(s.r) }

// collect returns this process's garbage, and the memory it frees, to the
// system: what a server settles to once the load is gone.
func collect() {
	runtime.GC()
	debug.FreeOSMemory()
}

// child is the parent's handle on the server side of a split run.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	enc    *json.Encoder
	dec    *json.Decoder
	target string
	pid    int
	// timeout bounds every exchange: a child that does not answer within
	// it is killed, which ends the wait with an error.
	timeout time.Duration
	// mu makes an exchange (do) whole: a soak's sampler and its control
	// plane's driver both talk to the relay's child.
	mu     sync.Mutex
	exited chan struct{}
	err    error // set before exited closes
}

// bounded runs f, killing the child if f has not returned within the
// child's timeout: a hung child cannot hang the run.
func (c *child) bounded(f func() error) error {
	t := time.AfterFunc(c.timeout, func() { _ = c.cmd.Process.Kill() })
	defer t.Stop()
	return f()
}

// startChild starts this executable as the server side of cfg, or as the
// relay alone in front of relayUpstream if set.
func startChild(cfg *Config, coding seqCoding, relayUpstream string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("split: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), serverSideEnv+"=1")
	cmd.Stderr = cfg.Progress
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("split: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("split: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("split: starting the server side: %w", err)
	}
	c := &child{cmd: cmd, stdin: stdin, enc: json.NewEncoder(stdin), dec: json.NewDecoder(bufio.NewReader(stdout)),
		timeout: cfg.Timeout, exited: make(chan struct{})}
	hello := childHello{Config: *cfg, Base: coding.base, RelayUpstream: relayUpstream}
	hello.Config.Split, hello.Config.CPUProfile = false, ""
	var ready childReady
	_ = c.bounded(func() error {
		if err := c.enc.Encode(hello); err != nil {
			return err
		}
		return c.dec.Decode(&ready)
	})
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if ready.Target == "" {
		c.stop()
		if ready.Error != "" {
			return nil, fmt.Errorf("split: server side: %s", ready.Error)
		}
		return nil, fmt.Errorf("split: server side ended before serving: %v", c.err)
	}
	c.target, c.pid = ready.Target, ready.PID
	return c, nil
}

// do sends cmd and waits for the reply.
func (c *child) do(cmd childCommand) (childReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var reply childReply
	err := c.bounded(func() error {
		if err := c.enc.Encode(cmd); err != nil {
			return err
		}
		return c.dec.Decode(&reply)
	})
	if err != nil {
		return reply, fmt.Errorf("split: server side: %w", err)
	}
	if reply.Error != "" {
		return reply, fmt.Errorf("split: server side: %s", reply.Error)
	}
	return reply, nil
}

func (c *child) publish(seq int) (time.Time, error) {
	reply, err := c.do(childCommand{Op: "publish", Seq: seq})
	return time.Unix(0, reply.UnixNano), err
}

// heapProfile has the child write its heap profile to file.
func (c *child) heapProfile(file string) error {
	_, err := c.do(childCommand{Op: "heap", File: file})
	return err
}

// memory reads the child's runtime memory figures.
func (c *child) memory() *ServerMemory {
	reply, err := c.do(childCommand{Op: "memory"})
	if err != nil {
		return nil
	}
	return reply.Memory
}

// collect makes the child return its garbage and free memory to the
// system, and reads its memory figures then.
func (c *child) collect() *ServerMemory {
	reply, err := c.do(childCommand{Op: "gc"})
	if err != nil {
		return nil
	}
	return reply.Memory
}

// startProfile profiles the child into file until the returned func.
func (c *child) startProfile(file string) (stop func(), err error) {
	if _, err := c.do(childCommand{Op: "profile", File: file}); err != nil {
		return nil, err
	}
	return func() { _, _ = c.do(childCommand{Op: "profile-stop"}) }, nil
}

// stop ends the child (its stdin closing tells it to) and waits for it,
// killing it if it has not exited within childExit.
func (c *child) stop() {
	c.stdin.Close()
	select {
	case <-c.exited:
	case <-time.After(childExit):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// childExit bounds a child's orderly exit.
const childExit = 15 * time.Second

// splitBackend is the clients in this process and the server in a child;
// with cfg.Relay, the relay in a child and its control plane in another.
type splitBackend struct {
	clients interface {
		run(ctx context.Context, i int, tr *tracker) error
		bytesReceived() int64
		connections() int
	}
	*child          // what the clients dial
	upstream *child // the relay's control plane; nil unless cfg.Relay
	// proxy is the link from the relay to its control plane, in this
	// process; nil unless cfg.Soak.Faults.
	proxy *faultproxy.Proxy
}

func (b *splitBackend) run(ctx context.Context, i int, tr *tracker) error {
	return b.clients.run(ctx, i, tr)
}
func (b *splitBackend) bytesReceived() int64 { return b.clients.bytesReceived() }
func (b *splitBackend) connections() int     { return b.clients.connections() }

// publisher is the child that publishes: the control plane or a floor.
func (b *splitBackend) publisher() *child {
	if b.upstream != nil {
		return b.upstream
	}
	return b.child
}

func (b *splitBackend) publish(seq int) (time.Time, error) { return b.publisher().publish(seq) }

// upstreamPID is the relay's control plane's process, 0 without one.
func (b *splitBackend) upstreamPID() int {
	if b.upstream == nil {
		return 0
	}
	return b.upstream.pid
}

func (b *splitBackend) stop() {
	b.child.stop()
	if b.proxy != nil {
		b.proxy.Close()
	}
	if b.upstream != nil {
		b.upstream.stop()
	}
}

// startSplit starts the server side in a child (the relay and its control
// plane in two) and the clients' side here.
func startSplit(cfg *Config, coding seqCoding) (*splitBackend, error) {
	b := &splitBackend{}
	relayUpstream := ""
	if cfg.Relay {
		cp := *cfg
		cp.Relay = false
		up, err := startChild(&cp, coding, "")
		if err != nil {
			return nil, err
		}
		b.upstream = up
		if relayUpstream, err = faultLinkTo(cfg, up.target, &b.proxy); err != nil {
			up.stop()
			return nil, err
		}
	}
	c, err := startChild(cfg, coding, relayUpstream)
	if err != nil {
		if b.proxy != nil {
			b.proxy.Close()
		}
		if b.upstream != nil {
			b.upstream.stop()
		}
		return nil, err
	}
	b.child = c
	if cfg.Floor {
		b.clients = &floor{addr: c.target}
	} else {
		cfg.Target = c.target
		b.clients = newXDSClients(cfg, coding)
	}
	if cfg.PID == 0 {
		cfg.PID = c.pid
	}
	return b, nil
}

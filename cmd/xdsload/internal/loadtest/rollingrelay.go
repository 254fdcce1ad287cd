package loadtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// relayProc is one xdsrelay process of a rolling restart, started from
// the built binary with a configuration file and stopped as an operator
// stops it: SIGTERM. Its log goes to a file beside its configuration.
type relayProc struct {
	// Read-only after newRelayProc.
	name        string // "a" or "b"
	bin, config string
	logFile     string
	addr, admin string // its downstream and admin listen addresses

	// Owned by the rolling restart's goroutine.
	cmd      *exec.Cmd
	started  time.Time
	exited   chan struct{} // closed once cmd has ended; exitErr and exitedAt then set
	exitErr  error
	exitedAt time.Time
}

// relayConfigYAML is a rolling restart's relay: the production defaults
// but for its addresses, the grouping the tool's clients share
// (node.cluster), and its cache saved every second in a directory of its
// own, which it restores from when it starts again.
const relayConfigYAML = `upstream:
  address: %q
  group_by: [cluster]
downstream:
  address: %q
admin:
  address: %q
cache:
  persist_dir: %q
  persist_interval: 1s
log:
  level: info
  format: json
`

// newRelayProc writes relay name's configuration in dir: upstream is
// where it reaches its control plane, and it listens on addr (xDS) and
// admin, the same at every start.
func newRelayProc(name, bin, dir, upstream, addr, admin string) (*relayProc, error) {
	p := &relayProc{name: name, bin: bin, config: filepath.Join(dir, "relay-"+name+".yaml"),
		logFile: filepath.Join(dir, "relay-"+name+".log"), addr: addr, admin: admin}
	cacheDir := filepath.Join(dir, "cache-"+name)
	if err := os.Mkdir(cacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("relay %s: %w", name, err)
	}
	yaml := fmt.Sprintf(relayConfigYAML, upstream, p.addr, p.admin, cacheDir)
	if err := os.WriteFile(p.config, []byte(yaml), 0o600); err != nil {
		return nil, fmt.Errorf("relay %s: %w", name, err)
	}
	return p, nil
}

// freePorts returns n loopback addresses free now, all different: each
// is held until all are chosen, so that the kernel cannot hand one out
// twice.
func freePorts(n int) ([]string, error) {
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// start runs the relay; its log is appended to logFile.
func (p *relayProc) start() error {
	log, err := os.OpenFile(p.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("relay %s: %w", p.name, err)
	}
	defer log.Close() // the child has its own descriptor
	cmd := exec.Command(p.bin, "--config", p.config)
	cmd.Stdout, cmd.Stderr = log, log
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("relay %s: starting %s: %w", p.name, p.bin, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		p.exitErr = cmd.Wait()
		p.exitedAt = time.Now()
		close(exited)
	}(p.exited)
	return nil
}

// terminate sends the relay SIGTERM.
func (p *relayProc) terminate() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("relay %s: SIGTERM: %w", p.name, err)
	}
	return nil
}

// wait waits bound at most for the relay to exit, killing it then, and
// returns its exit code.
func (p *relayProc) wait(bound time.Duration) (int, error) {
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
		return -1, fmt.Errorf("relay %s did not exit within %s of SIGTERM: killed", p.name, bound)
	}
	var exit *exec.ExitError
	if errors.As(p.exitErr, &exit) {
		return exit.ExitCode(), nil
	}
	if p.exitErr != nil {
		return -1, fmt.Errorf("relay %s: %w", p.name, p.exitErr)
	}
	return 0, nil
}

// kill ends the relay if it runs, at the end of the run.
func (p *relayProc) kill() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if _, err := p.wait(relayExit); err != nil {
			return
		}
	}
}

// relayExit bounds a relay's exit after SIGTERM: its drain, its
// shutdown_timeout (10s) for the streams and again for the last save.
const relayExit = 30 * time.Second

// waitReady waits, bound at most, for the relay's /readyz to answer 200;
// a relay that has exited will not, and fails it at once.
func (p *relayProc) waitReady(ctx context.Context, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("relay %s exited before it was ready: %v (its log: %s)", p.name, p.exitErr, p.logFile)
		default:
		}
		resp, err := scrapeClient.Get("http://" + p.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("relay %s: /readyz: %w after %s", p.name, err, bound)
		}
		if pause(ctx, readyPoll) != nil {
			return ctx.Err()
		}
	}
}

const readyPoll = 50 * time.Millisecond

// streams is the relay's open downstream streams.
func (p *relayProc) streams() (int, error) { return scrapeGauge(p.admin, streamsMetric) }

// Package realcp runs, for tests, control planes that nobody here wrote:
// go-control-plane v0.9.8's own server (v098/, a module of its own, since
// it needs grpc v1.27 and protobuf v1.23, which cannot share a build with
// the relay's) and v0.10.3's (v010/, grpc v1.45 and protobuf v1.28), each
// built with the go command and run as a process on 127.0.0.1:0; and
// Envoy Gateway, opt-in (envoygateway.go).
package realcp

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Shape is which of go-control-plane v0.9.8's services the server
// registers.
type Shape string

// The shapes.
const (
	// ShapeADS is the library's ADS and per-type services, as its own
	// example registers them: SotW served, every delta method answered
	// Unknown "not implemented" (go-control-plane <= v0.9.8, and Gloo Edge's
	// solo-kit the same way).
	ShapeADS Shape = "ads"
	// ShapePerType is the per-type services alone, no ADS (Contour's and
	// Cilium's shape): ADS is Unimplemented "unknown service".
	ShapePerType Shape = "per-type"
	// ShapePolite is ShapeADS with delta ADS answered Unimplemented, as a
	// server that follows the spec's word does.
	ShapePolite Shape = "polite"
)

// Server is a running go-control-plane server of an old release.
type Server struct {
	Addr string

	name string // "go-control-plane v0.9.8", for messages

	stdin io.WriteCloser
	cmd   *exec.Cmd
	done  chan struct{} // closed once its output is read to the end

	mu     sync.Mutex
	events []string      // every line it printed after "listening"
	added  chan struct{} // closed and replaced at each line
}

// StartV098 builds (once per test binary, kept in the user's cache
// directory by the hash of its source) and runs v0.9.8's server in shape,
// its snapshots keyed by node.cluster, until the test ends. The build needs
// the Go module proxy (or a module cache that has v0.9.8).
func StartV098(t testing.TB, shape Shape) *Server {
	t.Helper()
	return start(t, "v098", "go-control-plane v0.9.8", "-shape", string(shape))
}

// StartV010 builds (as StartV098) and runs go-control-plane v0.10.3's
// server, SotW and delta over ADS and the per-type services as the
// library's example registers them, its snapshots keyed by node.cluster,
// until the test ends. Its delta server knows the wildcard only in the
// legacy form (docs/control-planes.md).
func StartV010(t testing.TB) *Server {
	t.Helper()
	return start(t, "v010", "go-control-plane v0.10.3")
}

// start builds the program of module (a directory beside this file) and
// runs it with args.
func start(t testing.TB, module, name string, args ...string) *Server {
	t.Helper()
	bin := buildModule(t, module, name)
	cmd := exec.Command(bin, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &testWriter{t: t, name: name}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	v := &Server{name: name, stdin: stdin, cmd: cmd, done: make(chan struct{}), added: make(chan struct{})}
	t.Cleanup(v.stop)
	addr := make(chan string, 1)
	go v.read(stdout, addr)
	select {
	case v.Addr = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not start listening within 30s", name)
	}
	if v.Addr == "" {
		t.Fatalf("%s exited before listening", name)
	}
	return v
}

// read reads the server's lines: the first, its address, goes to addr
// ("" if it ends first); the others are events.
func (v *Server) read(r io.Reader, addr chan<- string) {
	defer close(v.done)
	sc := bufio.NewScanner(r)
	listening := false
	for sc.Scan() {
		line := sc.Text()
		if a, ok := strings.CutPrefix(line, "listening "); ok && !listening {
			listening = true
			addr <- a
			continue
		}
		v.mu.Lock()
		v.events = append(v.events, line)
		close(v.added)
		v.added = make(chan struct{})
		v.mu.Unlock()
	}
	if !listening {
		addr <- ""
	}
}

// stop closes its stdin, which ends it, and waits for it (killed after 10
// s).
func (v *Server) stop() {
	v.stdin.Close()
	exited := make(chan struct{})
	go func() {
		<-v.done
		_ = v.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = v.cmd.Process.Kill()
		<-exited
	}
}

// Set sets the snapshot of the nodes whose cluster is key to resources
// at version, and waits until the server has it.
func (v *Server) Set(t testing.TB, key, version string, resources ...proto.Message) {
	t.Helper()
	line := struct {
		Key       string   `json:"key"`
		Version   string   `json:"version"`
		Resources []string `json:"resources"`
	}{Key: key, Version: version, Resources: []string{}}
	for _, r := range resources {
		a, err := anypb.New(r)
		if err != nil {
			t.Fatal(err)
		}
		b, err := proto.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		line.Resources = append(line.Resources, base64.StdEncoding.EncodeToString(b))
	}
	b, err := json.Marshal(line)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.stdin.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	v.Wait(t, 30*time.Second, "the snapshot set", func(events []string) bool {
		return contains(events, "set "+key+" "+version)
	})
}

// Events returns the lines the server printed: "open METHOD" and "end
// METHOD CODE" for each stream it served, "request TYPEURL N" for each
// SotW request, "set KEY VERSION"; v0.10.3's also "delta TYPEURL
// subscribe=A,B unsubscribe=C versions=N" for each delta request and
// "delta-response TYPEURL N removed=M" for each delta response.
func (v *Server) Events() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.events...)
}

// Count is how many events begin with prefix.
func (v *Server) Count(prefix string) int {
	n := 0
	for _, e := range v.Events() {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

// Wait waits, within bound, until cond holds of the events.
func (v *Server) Wait(t testing.TB, bound time.Duration, what string, cond func(events []string) bool) {
	t.Helper()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		v.mu.Lock()
		events, added := append([]string(nil), v.events...), v.added
		v.mu.Unlock()
		if cond(events) {
			return
		}
		select {
		case <-added:
		case <-v.done:
			t.Fatalf("%s exited while waiting for %s", v.name, what)
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s; its events: %q", bound, what, events)
		}
	}
}

func contains(events []string, e string) bool {
	for _, x := range events {
		if x == e {
			return true
		}
	}
	return false
}

// testWriter passes the server's stderr to the test's log.
type testWriter struct {
	t    testing.TB
	name string
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s: %s", w.name, strings.TrimSpace(string(p)))
	return len(p), nil
}

// builds are the modules' programs, each built once per test binary.
var builds sync.Map // module -> *built

type built struct {
	once sync.Once
	bin  string
	err  error
}

// buildModule builds a module's program once per test binary into the
// user's cache directory, named by the hash of its go.mod, go.sum and
// main.go: a binary built by an earlier run of the same source is used
// as it is.
func buildModule(t testing.TB, module, name string) string {
	t.Helper()
	b, _ := builds.LoadOrStore(module, &built{})
	bb := b.(*built)
	bb.once.Do(func() { bb.bin, bb.err = build(module) })
	if bb.err != nil {
		t.Fatalf("build %s's server (internal/realcp/%s): %v", name, module, bb.err)
	}
	return bb.bin
}

func build(module string) (string, error) {
	_, self, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(self), module)
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	bin := filepath.Join(cache, "xdsrelay-test", module+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	// Built beside, then renamed: test binaries of several packages may
	// build it at once.
	tmp := fmt.Sprintf("%s.%d", bin, os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	return bin, os.Rename(tmp, bin)
}

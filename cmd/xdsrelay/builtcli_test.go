package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The command-line papercuts of issue 34, as a user meets them: the built
// binary, run as a process. The relay it serves is stopped with SIGTERM.
func TestBuiltBinaryPapercuts(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "xdsrelay")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	exit := func(err error) int {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}

	// A mistyped command followed by its flags.
	out, err := exec.Command(bin, "stauts", "--server", "x:1").CombinedOutput()
	if c := exit(err); c != 2 || !strings.Contains(string(out), `unknown command "stauts" for "xdsrelay"; did you mean "status"?`) {
		t.Errorf("xdsrelay stauts --server x:1: exit %d, %q", c, out)
	}

	// The relay, from the example configuration, with a persist_dir.
	// The relay and watch are killed if they outlive this, so that waiting
	// for their exit after a signal is bounded.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	saved := t.TempDir()
	relay := exec.CommandContext(ctx, bin, "--config", filepath.Join(repo, "config.example.yaml"))
	relay.Dir = repo
	relay.Env = append(os.Environ(), "XDSRELAY_DOWNSTREAM_ADDRESS=127.0.0.1:0", "XDSRELAY_ADMIN_ADDRESS=127.0.0.1:0",
		"XDSRELAY_CACHE_PERSIST_DIR="+saved)
	logs := &syncBuffer{}
	relay.Stderr = logs
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer relay.Process.Kill()
	m := waitForLog(t, logs, regexp.MustCompile(`msg="relay serving" downstream=(\S+) upstream=\S+ admin=(\S+)`))
	addr, admin := m[1], m[2]

	// watch, as the Envoy it stands in for, taking the type by its message
	// name, NACKing nothing that is there.
	watch := exec.CommandContext(ctx, bin, "watch", "--server", addr, "--node-id", "n1", "--cluster", "example", "--type", "Cluster",
		"--user-agent", "envoy/1.31.0", "--client-feature", "envoy.lb.does_not_support_overprovisioning", "--nack-matching", "no-such-cluster")
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer watch.Process.Kill()
	if !readUntil(t, stdout, "name: greeter-cluster") {
		t.Fatal("watch printed no greeter-cluster")
	}
	out, err = exec.Command(bin, "admin", "--admin", admin, "/debug/groups").CombinedOutput()
	if exit(err) != 0 || !strings.Contains(string(out), `"user_agent": "envoy/1.31"`) {
		t.Errorf("/debug/groups: %s", out)
	}
	watch.Process.Signal(syscall.SIGINT)
	if c := exit(watch.Wait()); c != 0 {
		t.Errorf("watch after SIGINT: exit %d", c)
	}

	// The admin endpoint's index.
	out, err = exec.Command(bin, "admin", "--admin", admin, "/").CombinedOutput()
	if exit(err) != 0 || !regexp.MustCompile(`(?m)^GET /debug/groups +private and local callers$`).Match(out) {
		t.Errorf("admin /: %s", out)
	}

	// Shutdown says what it saved, and where; persist inspect reads the
	// directory.
	relay.Process.Signal(syscall.SIGTERM)
	if c := exit(relay.Wait()); c != 0 {
		t.Fatalf("the relay after SIGTERM: exit %d\n%s", c, logs)
	}
	if !strings.Contains(logs.String(), `msg="caches saved for the next start" dir=`+saved+` groups=1 `) || !strings.Contains(logs.String(), `msg="shut down"`) {
		t.Errorf("the log after shutting down:\n%s", logs)
	}
	out, err = exec.Command(bin, "persist", "inspect", saved).CombinedOutput()
	if exit(err) != 0 || !regexp.MustCompile(`CDS\s+greeter-cluster`).Match(out) {
		t.Errorf("persist inspect %s: %s", saved, out)
	}
}

// readUntil reads r until a line contains want (true), or it ends or
// cliWait passes (false).
func readUntil(t *testing.T, r io.Reader, want string) bool {
	t.Helper()
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.Contains(sc.Text(), want) {
				found <- true
				io.Copy(io.Discard, r)
				return
			}
		}
		found <- false
	}()
	select {
	case ok := <-found:
		return ok
	case <-time.After(cliWait):
		return false
	}
}

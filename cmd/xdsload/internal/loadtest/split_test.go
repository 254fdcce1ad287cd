package loadtest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunSplit runs each kind of server side in a child process (this test
// binary, started again): the clients here get their config and every
// update, and the RSS sampled is the child's, not this process's.
func TestRunSplit(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"relay", func(c *Config) { c.Relay, c.CPCache = true, CacheLinear }},
		{"relay sharing connections", func(c *Config) { c.Relay, c.StreamsPerConn = true, 2 }},
		{"snapshot sotw", func(c *Config) { c.Variant = VariantSotW }},
		{"floor", func(c *Config) { c.ServeCP, c.Floor = "", true }},
		{"grpc floor", func(c *Config) { c.ServeCP, c.GRPCFloor, c.Clients, c.Updates = "", true, 20, 2 }},
		{"grpc floor sotw sharing connections", func(c *Config) {
			c.ServeCP, c.GRPCFloor, c.Variant, c.StreamsPerConn = "", true, VariantSotW, 3
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			profile := filepath.Join(t.TempDir(), "cpu")
			var progress strings.Builder
			res, err := Run(t.Context(), smallLoad(func(c *Config) {
				c.Split, c.CPUProfile, c.Progress = true, profile, &progress
				tt.mod(c)
			}))
			if err != nil {
				t.Fatalf("%v\n%s", err, progress.String())
			}
			checkDelivered(t, res)
			if pid := res.Config.PID; pid <= 0 || pid == os.Getpid() {
				t.Errorf("RSS sampled from pid %d, want the child's (this is %d)", pid, os.Getpid())
			}
			if res.RSS.Start <= 0 || res.RSS.Configured <= 0 {
				t.Errorf("RSS %+v, want the child's samples", res.RSS)
			}
			checkServerFigures(t, res)
			for _, f := range []string{profile, profile + ".server", profile + ".server.heap", profile + ".server.mutex"} {
				if st, err := os.Stat(f); err != nil || st.Size() == 0 {
					t.Errorf("profile %s: %v", f, err)
				}
			}
		})
	}
}

// checkServerFigures checks that a split run reports the server's
// goroutines per idle stream (none for the floor's server, which writes
// from the publisher) and its CPU over every change.
func checkServerFigures(t *testing.T, res *Result) {
	t.Helper()
	if res.ServerMemoryStart == nil || res.ServerMemory == nil || (res.IdlePerStream.Goroutines <= 0) != res.Config.Floor {
		t.Errorf("server memory %+v then %+v, %+v per stream; want goroutines growing with the streams",
			res.ServerMemoryStart, res.ServerMemory, res.IdlePerStream)
	}
	// CPU times come in 10ms ticks and may be zero for so few changes.
	if res.CPU.Changes != res.Config.Updates || res.CPU.Server < 0 || res.CPU.Upstream < 0 {
		t.Errorf("CPU %+v, want %d changes", res.CPU, res.Config.Updates)
	}
	if up := res.CPU.UpstreamPID; res.Config.Relay && (up <= 0 || up == res.Config.PID || up == os.Getpid()) {
		t.Errorf("relay in pid %d, its control plane in %d; want a process of its own", res.Config.PID, up)
	}
	if want := (res.Config.Clients + res.Config.StreamsPerConn - 1) / res.Config.StreamsPerConn; res.Connections != want {
		t.Errorf("%d connections, want %d", res.Connections, want)
	}
}

// A churn run's server in a child reports its runtime memory at each sample.
func TestRunSplitChurn(t *testing.T) {
	var progress strings.Builder
	res, err := Run(t.Context(), smallLoad(func(c *Config) {
		c.Split, c.Relay, c.CPCache, c.Progress = true, true, CacheLinear, &progress
		c.Clients, c.Churn, c.ChurnSettle = 3, 200*time.Millisecond, 10*time.Millisecond
	}))
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	checkChurn(t, res)
	for _, s := range res.Churn.samples() {
		if s.Memory == nil || s.Memory.Goroutines <= 0 {
			t.Errorf("%s: no runtime memory from the child: %+v", s.name, s.Memory)
		}
	}
}

func TestSplitNeedsItsOwnServer(t *testing.T) {
	cfg := Config{Target: "127.0.0.1:1", Split: true}.Defaults()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "split") {
		t.Errorf("split against a target: %v, want an error naming split", err)
	}
}

// A server side that stops answering cannot hang the run: the exchange
// ends with an error once the child's timeout passes, the child killed.
func TestSplitChildThatHangsIsKilled(t *testing.T) {
	cmd := exec.Command("sleep", "60") // reads nothing, answers nothing
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep command: %v", err)
	}
	c := &child{cmd: cmd, stdin: stdin, enc: json.NewEncoder(stdin), dec: json.NewDecoder(stdout),
		timeout: 200 * time.Millisecond, exited: make(chan struct{})}
	go func() { c.err = cmd.Wait(); close(c.exited) }()
	if _, err := c.publish(1); err == nil {
		t.Error("publish to a child that never answers succeeded")
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the hung child was not killed")
	}
	c.stop()
}

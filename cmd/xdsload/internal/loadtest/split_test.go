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
		{"snapshot sotw", func(c *Config) { c.Variant = VariantSotW }},
		{"floor", func(c *Config) { c.ServeCP, c.Floor = "", true }},
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
			for _, f := range []string{profile, profile + ".server"} {
				if st, err := os.Stat(f); err != nil || st.Size() == 0 {
					t.Errorf("profile %s: %v", f, err)
				}
			}
		})
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

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// docs/load-reports.md's walkthrough, run as written from the quick start
// (its ports moved): with lrs_server self added to the example's cluster,
// the example client's load-reporting stream reaches the relay, and
// /debug/groups and /metrics show what the doc shows.
func TestDocLoadReportsWalkthrough(t *testing.T) {
	line := strings.TrimSpace(docBlock(t, "docs/load-reports.md", "yaml", "lrs_server"))
	cmds := shellCommands(t, docBlock(t, "docs/load-reports.md", "sh", "-count"))
	if len(cmds) != 3 || !cmds[0].background || !cmds[1].background {
		t.Fatalf("the walkthrough's commands: %+v", cmds)
	}
	bin := buildExamples(t, cmds[0].words[2], cmds[1].words[2])
	port := freePort(t)
	r := bootReadme(t, func(name, content string) string {
		if name != "greeter.yaml" {
			return content
		}
		content = moveGreeter(t, port)(name, content)
		// the line the doc adds to greeter-cluster, after its name
		return replaceOnce(t, content, "\nname: greeter-cluster\n", "\nname: greeter-cluster\n"+line+"\n")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := func(c shellCommand, more ...string) {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, filepath.Base(c.words[2])), append(c.words[3:], more...)...)
		cmd.Env = os.Environ()
		for k, v := range c.env {
			if k == "GRPC_XDS_BOOTSTRAP" {
				v = filepath.Join(repo, v)
			}
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	start(cmds[0], "-addr", fmt.Sprintf("127.0.0.1:%d", port))
	start(cmds[1], "-xds-server", r.Addr())

	args := relayArgs(t, cmds[2], r.Addr())
	for i, a := range args {
		if a == "localhost:9901" {
			args[i] = r.AdminAddr()
		}
	}
	want := strings.TrimRight(docBlock(t, "docs/load-reports.md", "text", `"load_reports"`), "\n")
	eventually(t, func() string {
		code, out, errOut := runCLI(args...)
		if code == 0 && strings.Contains(out, want) {
			t.Logf("/debug/groups:\n%s", out)
			return ""
		}
		return fmt.Sprintf("admin /debug/groups: exit %d, %q %q; the doc shows %q", code, out, errOut, want)
	})
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"version"}, nil, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var want bytes.Buffer
	if err := currentVersion().write(&want); err != nil {
		t.Fatal(err)
	}
	if out.String() != want.String() {
		t.Fatalf("printed %q, want %q", out.String(), want.String())
	}
	if !strings.Contains(out.String(), "go:       "+runtime.Version()+" ") {
		t.Errorf("no Go version in %q", out.String())
	}

	out.Reset()
	errOut.Reset()
	if code := run(context.Background(), []string{"version", "extra"}, nil, &out, &errOut); code != 2 {
		t.Fatalf("version extra: exit %d, want 2 (usage); %s", code, errOut.String())
	}
}

func TestVersionWrite(t *testing.T) {
	const rev = "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d"
	platform := " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	tests := []struct {
		name string
		v    buildVersion
		want string
	}{
		{
			name: "nothing recorded",
			v:    buildVersion{Version: "(devel)", GoVersion: "go1.26.8"},
			want: "version:  (devel)\nrevision: unknown\ntime:     unknown\ngo:       go1.26.8" + platform,
		},
		{
			name: "from VCS, modified",
			v:    buildVersion{Version: "v1.2.3", Revision: rev, Time: "2026-11-02T10:00:00Z", Modified: true, GoVersion: "go1.26.8"},
			want: "version:  v1.2.3\nrevision: " + rev + " (modified)\ntime:     2026-11-02T10:00:00Z\ngo:       go1.26.8" + platform,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.v.write(&b); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Errorf("got %q, want %q", b.String(), tc.want)
			}
		})
	}
}

// A binary built as the Dockerfile builds it (no VCS data, the version and
// revision given with -ldflags) reports them in xdsrelay version, in
// --version and in xdsrelay_build_info on /metrics.
func TestBuiltVersion(t *testing.T) {
	const version, rev = "v9.8.7", "0123456789abcdef0123456789abcdef01234567"
	bin := filepath.Join(t.TempDir(), "xdsrelay")
	build := exec.Command("go", "build", "-buildvcs=false",
		"-ldflags", "-X main.version="+version+" -X main.revision="+rev, "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("xdsrelay version: %v", err)
	}
	want := "version:  " + version + "\nrevision: " + rev + "\ntime:     unknown\ngo:       " +
		runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if string(out) != want {
		t.Errorf("xdsrelay version printed %q, want %q", out, want)
	}
	out, err = exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("xdsrelay --version: %v", err)
	}
	if want := "xdsrelay " + version + " (rev " + rev[:12] + ")\n"; string(out) != want {
		t.Errorf("xdsrelay --version printed %q, want %q", out, want)
	}

	labels := scrapeBuildInfo(t, bin)
	for k, v := range map[string]string{"version": version, "revision": rev, "go_version": runtime.Version()} {
		if labels[k] != v {
			t.Errorf("xdsrelay_build_info label %s = %q, want %q", k, labels[k], v)
		}
	}
}

// scrapeBuildInfo runs bin on the example resources until the test ends and
// returns the labels of xdsrelay_build_info on its /metrics.
func scrapeBuildInfo(t *testing.T, bin string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(cmd.Environ(),
		"XDSRELAY_UPSTREAM_ADDRESS=file://"+filepath.Join(repo, "examples", "resources"),
		"XDSRELAY_DOWNSTREAM_ADDRESS=127.0.0.1:0", "XDSRELAY_ADMIN_ADDRESS=127.0.0.1:0")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = cliWait
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		cmd.Wait()
	}()
	serving := regexp.MustCompile(`msg="relay serving".* admin=(\S+)`)
	admin := ""
	lines := bufio.NewScanner(logs)
	for admin == "" && lines.Scan() {
		if m := serving.FindStringSubmatch(lines.Text()); m != nil {
			admin = m[1]
		}
	}
	if admin == "" {
		t.Fatalf("the relay did not log where it serves (%v)", lines.Err())
	}
	go io.Copy(io.Discard, logs) // the rest of the log, until the process ends

	client := &http.Client{Timeout: cliWait}
	resp, err := client.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	mf := mfs["xdsrelay_build_info"]
	if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Fatalf("xdsrelay_build_info: %v, want one series of value 1", mf)
	}
	out := map[string]string{}
	for _, l := range mf.GetMetric()[0].GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// Single-dash long flags become double-dash ones; words, such as the
// version command or a flag's value, stay as they are.
func TestLegacyFlags(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"-version"}, []string{"--version"}},
		{[]string{"-config=x.yaml"}, []string{"--config=x.yaml"}},
		{[]string{"-help"}, []string{"--help"}},
		{[]string{"version"}, []string{"version"}},
		{[]string{"watch", "--node-id", "help"}, []string{"watch", "--node-id", "help"}},
		{[]string{"--", "-version"}, []string{"--", "-version"}},
	} {
		if got := legacyFlags(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("legacyFlags(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's install line, run as written from the clone, installs a
// binary that runs; the README does not offer `go install ...@latest`,
// which fails for a module path that is not published.
func TestReadmeInstall(t *testing.T) {
	for _, block := range docBlocks(t, "README.md", "sh") {
		if strings.Contains(block, "@latest") {
			t.Errorf("the README offers %q, which does not work", strings.TrimSpace(block))
		}
	}
	cmds := shellCommands(t, docBlock(t, "README.md", "sh", "go install"))
	if len(cmds) != 1 || strings.Join(cmds[0].words, " ") != "go install ./cmd/xdsrelay" {
		t.Fatalf("the README's install block: %+v", cmds)
	}
	bin := t.TempDir()
	install := exec.Command(cmds[0].words[0], cmds[0].words[1:]...)
	install.Dir = repo
	install.Env = append(os.Environ(), "GOBIN="+bin)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install ./cmd/xdsrelay: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "xdsrelay"), "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "version:  ") {
		t.Fatalf("the installed xdsrelay version: %v\n%s", err, out)
	}
}

// CHANGELOG.md has an Unreleased section and released versions, each
// with its date and its link; CONTRIBUTING.md says how a release is made.
func TestChangelogReleases(t *testing.T) {
	text := docText(t, "CHANGELOG.md")
	if !strings.Contains(text, "\n## [Unreleased]\n") || !strings.Contains(text, "\n[Unreleased]: ") {
		t.Error("CHANGELOG.md has no Unreleased section with its link")
	}
	versions := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindAllStringSubmatch(text, -1)
	if len(versions) == 0 {
		t.Fatal("CHANGELOG.md has no released version")
	}
	for _, v := range versions {
		if !strings.Contains(text, "\n["+v[1]+"]: https://github.com/xdsrelay/xdsrelay/releases/tag/v"+v[1]+"\n") {
			t.Errorf("CHANGELOG.md: version %s has no link to its tag", v[1])
		}
	}
	if !strings.Contains(text, "[Unreleased]: https://github.com/xdsrelay/xdsrelay/compare/v"+versions[0][1]+"...main") {
		t.Errorf("CHANGELOG.md: [Unreleased] does not compare from the last version, %s", versions[0][1])
	}
	contributing := docText(t, "CONTRIBUTING.md")
	for _, want := range []string{"## Releases", "git tag -a vX.Y.Z", "## [X.Y.Z] - YYYY-MM-DD"} {
		if !strings.Contains(contributing, want) {
			t.Errorf("CONTRIBUTING.md does not say how a release is made: no %q", want)
		}
	}
}

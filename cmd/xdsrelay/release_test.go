package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
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
	if err != nil || !strings.HasPrefix(string(out), "version:  "+release+"\n") {
		t.Fatalf("the installed xdsrelay version: %v\n%s\nwant the release, %s, not a pseudo-version", err, out, release)
	}
}

// newestRelease is the newest released version in CHANGELOG.md, X.Y.Z.
func newestRelease(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindStringSubmatch(docText(t, "CHANGELOG.md"))
	if m == nil {
		t.Fatal("CHANGELOG.md has no released version")
	}
	return m[1]
}

// One release everywhere: the binary's version, the newest version in
// CHANGELOG.md, the chart's appVersion and version, deploy/'s image tag
// (the kustomization's images: entry and the Deployment's image), and the
// README's checkout, image build and run lines all name the same
// release. A release commit changes them together (CONTRIBUTING.md).
func TestOneRelease(t *testing.T) {
	x := newestRelease(t)
	if release != "v"+x {
		t.Errorf("cmd/xdsrelay/version.go's release is %s; CHANGELOG.md's newest is %s", release, x)
	}
	var chart struct {
		Version    string `yaml:"version"`
		AppVersion string `yaml:"appVersion"`
	}
	readYAML(t, "deploy/helm/xdsrelay/Chart.yaml", &chart)
	if chart.AppVersion != release || chart.Version != x {
		t.Errorf("deploy/helm/xdsrelay/Chart.yaml: appVersion %q, version %q; want %s and %s", chart.AppVersion, chart.Version, release, x)
	}
	var kustomization struct {
		Images []struct {
			NewTag string `yaml:"newTag"`
		} `yaml:"images"`
	}
	readYAML(t, "deploy/base/kustomization.yaml", &kustomization)
	if len(kustomization.Images) != 1 || kustomization.Images[0].NewTag != release {
		t.Errorf("deploy/base/kustomization.yaml's image tag %+v, want %s", kustomization.Images, release)
	}
	if !strings.Contains(docText(t, "deploy/base/deployment.yaml"), "image: xdsrelay:"+release+"\n") {
		t.Errorf("deploy/base/deployment.yaml's image is not xdsrelay:%s", release)
	}
	readme := docText(t, "README.md")
	if !strings.Contains(readme, "git checkout "+release+"`") {
		t.Errorf("the README does not name the release to check out, git checkout %s", release)
	}
	for _, want := range []string{"-t xdsrelay:" + release + " .", "docker run -p 18001:18001 -p 9901:9901 xdsrelay:" + release} {
		if !strings.Contains(docBlock(t, "README.md", "sh", "docker build"), want) {
			t.Errorf("the README's image lines do not say %q", want)
		}
	}
	for _, doc := range []string{"README.md", "docs/kubernetes.md"} {
		text := docText(t, doc)
		if strings.Contains(text, "image.tag=latest") || strings.Contains(text, "git describe") {
			t.Errorf("%s builds or installs an image other than the release's (image.tag=latest, git describe)", doc)
		}
		for _, m := range regexp.MustCompile(`(?:-t|docker run[^\n]*) xdsrelay(:\S*)?`).FindAllStringSubmatch(text, -1) {
			if m[1] != ":"+release {
				t.Errorf("%s tags or runs the image as %q, not the release's xdsrelay:%s", doc, m[0], release)
			}
		}
	}
}

// A clone may lack tags (CI clones often have none), and the release's tag
// is made after the release commit: what a test can hold is that a tag,
// where the clone has it, is on a commit whose source is that release.
func TestReleaseTagIsTheRelease(t *testing.T) {
	tags, err := exec.Command("git", "-C", repo, "tag", "--list", "v*").Output()
	if err != nil {
		t.Skipf("git: %v", err)
	}
	if len(strings.TrimSpace(string(tags))) == 0 {
		t.Skip("this clone has no tags")
	}
	for _, tag := range strings.Fields(string(tags)) {
		src, err := exec.Command("git", "-C", repo, "show", tag+":cmd/xdsrelay/version.go").Output()
		if err != nil {
			continue // a release before version.go named its release
		}
		if !strings.Contains(string(src), "const release = \""+tag+"\"") {
			t.Errorf("tag %s is on a commit whose cmd/xdsrelay/version.go is not release %s", tag, tag)
		}
	}
}

// readYAML decodes a YAML file named from the repository root.
func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(docText(t, file)), v); err != nil {
		t.Fatalf("%s: %v", file, err)
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

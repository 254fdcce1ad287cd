package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every document the repository's text names (a comment in a Go file, or
// anywhere in a Markdown, YAML or script file) is in the repository: a
// design note or a spec that no clone contains is never cited.
func TestDocReferencesExist(t *testing.T) {
	checked := 0
	walkRepo(t, func(path, rel string) {
		text, ok := referringText(t, path)
		if !ok {
			return
		}
		checked++
		for _, ref := range missingDocs(repo, filepath.Dir(path), text) {
			t.Errorf("%s names %s, which is not in the repository", rel, ref)
		}
	})
	if checked < 100 {
		t.Fatalf("checked %d files; the walk did not find the repository", checked)
	}
}

// The check finds what it is for: a document that is missing, however it is
// named, and nothing in a URL or a document that exists.
func TestMissingDocs(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"README.md", "docs/architecture.md"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		dir, text string
		want      []string
	}{
		{"", "see docs/architecture.md, invariant 3", nil},
		{"", "as README.md says", nil},
		{"docs", "[the design](architecture.md), [back](../README.md#quick-start)", nil},
		{"", "https://github.com/grpc/grpc/blob/master/doc/connection-backoff.md", nil},
		{"", `("Encode once" in DESIGN.md)`, []string{"DESIGN.md"}},
		{"", "see docs/metrics.md", []string{"docs/metrics.md"}},
		{"", "the spec (../shared/spec/xds-protocol.txt)", []string{"../shared/spec/xds-protocol.txt"}},
		{"docs", "[up](../../outside.md)", []string{"../../outside.md"}},
		{"cache", "(FIELD-NOTES.md, Envoy)", []string{"FIELD-NOTES.md"}},
	} {
		got := missingDocs(root, filepath.Join(root, tc.dir), tc.text)
		if !slices.Equal(got, tc.want) {
			t.Errorf("missingDocs(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}

// walkRepo calls fn with the path, and the path from the repository root,
// of every file of the repository's own text (see skipDir).
func walkRepo(t *testing.T, fn func(path, rel string)) {
	t.Helper()
	err := filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != repo && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(repo, path)
		fn(path, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// skipDir reports whether a directory holds nothing of the repository's own
// text: version control, fuzz corpora, and hidden directories but .ci.
func skipDir(name string) bool {
	return name == "testdata" || (strings.HasPrefix(name, ".") && name != ".ci")
}

// referringText is the text of path that may name documents: a Go file's
// comments, or a text file whole. ok is false for other files.
func referringText(t *testing.T, path string) (text string, ok bool) {
	t.Helper()
	name := filepath.Base(path)
	switch ext := filepath.Ext(name); {
	case ext == ".go":
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, g := range f.Comments {
			b.WriteString(g.Text())
			b.WriteByte('\n')
		}
		return b.String(), true
	case ext == ".md" || ext == ".yaml" || ext == ".yml" || name == "Dockerfile" || name == "run":
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), true
	}
	return "", false
}

var (
	docRef = regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.(?:md|txt)\b`)
	urlRef = regexp.MustCompile(`[a-z]+://[^\s)>\]"'` + "`" + `]+`)
)

// missingDocs returns the documents (*.md, *.txt) text names that are
// neither under root nor, for a relative link, under dir, in the order
// named. Names inside URLs are public pages, not files of the repository.
func missingDocs(root, dir, text string) []string {
	text = urlRef.ReplaceAllString(text, " ")
	var out []string
	for _, ref := range docRef.FindAllString(text, -1) {
		if !docExists(root, root, ref) && !docExists(root, dir, ref) && !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	return out
}

// docExists reports whether ref, from dir, is a file under root.
func docExists(root, dir, ref string) bool {
	path := filepath.Join(dir, filepath.FromSlash(ref))
	if rel, err := filepath.Rel(root, path); err != nil || strings.HasPrefix(rel, "..") {
		return false
	}
	st, err := os.Stat(path)
	return err == nil && !st.IsDir()
}

// A comment that cites an invariant of docs/architecture.md by number cites
// one that is there, under the name the comment gives it.
func TestInvariantCitations(t *testing.T) {
	arch, err := os.ReadFile(filepath.Join(repo, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := invariants(string(arch))
	if len(names) < 15 {
		t.Fatalf("docs/architecture.md: %d numbered invariants, want 15 or more", len(names))
	}
	cited := 0
	err = filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".go" {
			if err == nil && d.IsDir() && path != repo && skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return err
		}
		text, _ := referringText(t, path)
		rel, _ := filepath.Rel(repo, path)
		for _, m := range citation.FindAllStringSubmatch(text, -1) {
			cited++
			name, ok := names[m[1]]
			as := strings.Join(strings.Fields(m[2]), " ") // a name wrapped over lines
			switch {
			case !ok:
				t.Errorf("%s cites invariant %s, which docs/architecture.md does not have", rel, m[1])
			case as != "" && !strings.EqualFold(as, name):
				t.Errorf("%s cites invariant %s as %q; docs/architecture.md calls it %q", rel, m[1], as, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cited == 0 {
		t.Fatal("no comment cites an invariant: the pattern no longer matches how they are cited")
	}
}

var (
	invariantHeading = regexp.MustCompile(`(?m)^### (\d+)\. (.+)$`)
	citation         = regexp.MustCompile(`invariant\s+(\d+)(?:\s+"([^"]+)")?`)
)

// invariants returns the numbered invariants' names by number.
func invariants(arch string) map[string]string {
	out := map[string]string{}
	for _, m := range invariantHeading.FindAllStringSubmatch(arch, -1) {
		out[m[1]] = strings.TrimSpace(m[2])
	}
	return out
}

package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every relative link in the repository's Markdown leads somewhere: the
// file it names exists, and the #anchor it names is a heading of that file
// (as GitHub makes anchors of headings). Text moves between the README and
// docs/; its links must move with it.
func TestMarkdownLinks(t *testing.T) {
	checked := 0
	walkRepo(t, func(path, rel string) {
		if !strings.HasSuffix(path, ".md") {
			return
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, bad := range brokenLinks(path, string(b)) {
			t.Errorf("%s: link %s", rel, bad)
		}
	})
	if checked < 10 {
		t.Fatalf("checked %d Markdown files; the walk did not find the repository", checked)
	}
}

// The check finds what it is for: a missing file, a missing anchor in
// another file or in the same one; and passes links that lead somewhere.
func TestBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "other.md"), []byte("# Other\n\n## Fallback and return (gRFC A71)\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(dir, "from.md")
	text := "# From `x`\n\n[a](other.md#fallback-and-return-grfc-a71) [b](#from-x) [c](https://example.com/#z)\n" +
		"```sh\n[not](a-link.md)\n```\n" +
		"[d](gone.md) [e](other.md#gone) [f](#gone)\n"
	got := brokenLinks(from, text)
	want := []string{"gone.md (no such file)", "other.md#gone (no such heading)", "#gone (no such heading)"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("broken links %q, want %q", got, want)
	}
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// brokenLinks returns the relative links of the Markdown text of path (code
// blocks aside) that lead nowhere, each with why.
func brokenLinks(path, text string) []string {
	var bad []string
	for _, link := range mdLinks(text) {
		if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(link, "#")
		target := path
		if file != "" {
			target = filepath.Join(filepath.Dir(path), file)
			if _, err := os.Stat(target); err != nil {
				bad = append(bad, link+" (no such file)")
				continue
			}
		}
		if anchor == "" || !strings.HasSuffix(target, ".md") {
			continue
		}
		headings := text
		if file != "" {
			b, err := os.ReadFile(target)
			if err != nil {
				bad = append(bad, link+" ("+err.Error()+")")
				continue
			}
			headings = string(b)
		}
		if !headingAnchors(headings)[anchor] {
			bad = append(bad, link+" (no such heading)")
		}
	}
	return bad
}

// mdLinks returns the link targets of Markdown text outside fenced blocks.
func mdLinks(text string) []string {
	var links []string
	inBlock := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
			links = append(links, m[1])
		}
	}
	return links
}

var notInAnchor = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)

// headingAnchors returns the anchors GitHub gives the headings of Markdown
// text: lower case, punctuation dropped, spaces made hyphens, and -1, -2
// after a repeated one.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	inBlock := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		a := strings.ReplaceAll(notInAnchor.ReplaceAllString(strings.ToLower(h), ""), " ", "-")
		for i, base := 1, a; anchors[a]; i++ {
			a = base + "-" + strconv.Itoa(i)
		}
		anchors[a] = true
	}
	return anchors
}

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The reference documents in docs/ are what xdsrelay docs writes now: a
// key, a metric or an admin path changed without running go generate
// fails here.
func TestReferenceDocsUpToDate(t *testing.T) {
	docs, err := referenceDocs()
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 3 {
		t.Fatalf("%d documents, want configuration.md, metrics.md and admin.md", len(docs))
	}
	for name, want := range docs {
		have, err := os.ReadFile(filepath.Join(repo, "docs", name))
		if err != nil {
			t.Errorf("docs/%s: %v (run go generate ./...)", name, err)
			continue
		}
		if !bytes.Equal(have, want) {
			t.Errorf("docs/%s is not what xdsrelay docs writes: run go generate ./... (first difference at line %d)", name, firstDiffLine(have, want))
		}
	}
}

// firstDiffLine is the first line (from 1) where a and b differ.
func firstDiffLine(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

// What the generated references hold: a description of every kind of
// value, every family the relay registers, every admin path. (Every key
// with its default: TestConfigurationDocDocumentsEveryKey reads the rows
// back.)
func TestReferenceDocsContent(t *testing.T) {
	docs, err := referenceDocs()
	if err != nil {
		t.Fatal(err)
	}
	for k := range kind(len(kindNames)) {
		if kindDocs[k] == "" {
			t.Errorf("kind %s: no description in kindDocs", k)
		}
	}
	families, err := metricFamilies()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.Name)
		if !strings.Contains(string(docs["metrics.md"]), "| `"+f.Name+"` | "+f.Type) {
			t.Errorf("metrics.md has no row for %s", f.Name)
		}
	}
	// One family from each source the generator builds a relay for.
	for _, want := range []string{"xdsrelay_unroutable_names_total", "xdsrelay_file_invalid_resources", "xdsrelay_build_info", "xdsrelay_downstream_streams"} {
		if !slices.Contains(names, want) {
			t.Errorf("the families the generator finds lack %s", want)
		}
	}
	for _, p := range []string{"`GET /readyz`", "`POST /debug/rollout/release`", "`/debug/pprof/`"} {
		if !strings.Contains(string(docs["admin.md"]), "| "+p+" |") {
			t.Errorf("admin.md has no row for %s", p)
		}
	}
}

// xdsrelay docs writes the documents; --check says which differ (exit 1)
// and writes nothing.
func TestDocsCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"docs", "--dir", dir}, nil, &out, &errOut); code != 0 {
		t.Fatalf("docs: exit %d: %s", code, errOut.String())
	}
	want, err := referenceDocs()
	if err != nil {
		t.Fatal(err)
	}
	for name, doc := range want {
		if have, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(have, doc) {
			t.Errorf("%s: written %d bytes (%v), want %d", name, len(have), err, len(doc))
		}
	}
	if code := run(context.Background(), []string{"docs", "--dir", dir, "--check"}, nil, &out, &errOut); code != 0 {
		t.Fatalf("docs --check on what it wrote: exit %d: %s", code, errOut.String())
	}
	stale := filepath.Join(dir, "metrics.md")
	if err := os.WriteFile(stale, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errOut.Reset()
	if code := run(context.Background(), []string{"docs", "--dir", dir, "--check"}, nil, &out, &errOut); code != 1 {
		t.Fatalf("docs --check on a stale metrics.md: exit %d, want 1", code)
	}
	if !strings.Contains(errOut.String(), stale) || strings.Contains(errOut.String(), "admin.md") {
		t.Errorf("docs --check said %q, want only %s named", errOut.String(), stale)
	}
	if b, _ := os.ReadFile(stale); string(b) != "old\n" {
		t.Error("docs --check wrote the stale file")
	}
	errOut.Reset()
	missing := filepath.Join(dir, "nope")
	if code := run(context.Background(), []string{"docs", "--dir", missing}, nil, &out, &errOut); code != 1 ||
		strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), missing) {
		t.Errorf("docs --dir into a missing directory: exit %d, %q; want 1 and one line naming it", code, errOut.String())
	}
}

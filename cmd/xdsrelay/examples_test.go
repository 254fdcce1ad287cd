package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// buildExamples builds the example programs, as `go run` would, into a
// temporary directory and returns it.
func buildExamples(t *testing.T, pkgs ...string) string {
	t.Helper()
	bin := t.TempDir()
	args := append([]string{"build", "-o", bin + string(os.PathSeparator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

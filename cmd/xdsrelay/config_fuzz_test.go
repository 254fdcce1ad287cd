package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoadConfig loads fuzzed YAML and environment (one NAME=value a line):
// the result is an error or a configuration that validates, never a panic.
// Seeds: testdata/fuzz/FuzzLoadConfig. To fuzz longer:
//
//	go test -run '^$' -fuzz=FuzzLoadConfig -fuzztime=5m ./cmd/xdsrelay
func FuzzLoadConfig(f *testing.F) {
	file := filepath.Join(f.TempDir(), "config.yaml") // inputs run one at a time per process
	f.Fuzz(func(t *testing.T, yaml, env string) {
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		o, _, err := loadConfig(file, strings.Split(env, "\n"))
		if err != nil {
			return
		}
		if err := o.Relay.Validate(); err != nil {
			t.Fatalf("loaded a configuration that does not validate: %v", err)
		}
	})
}

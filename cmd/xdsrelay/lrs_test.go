package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// docs/load-reports.md's lrs block is configuration the relay takes, with the
// defaults it names.
func TestDocLoadReportsConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "lrs.yaml")
	if err := os.WriteFile(file, []byte(docBlock(t, "docs/load-reports.md", "yaml", "max_pending:")), 0o600); err != nil {
		t.Fatal(err)
	}
	o, _, err := loadConfig(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	def := defaultOptions()
	if o.Relay.LRS != def.Relay.LRS || o.Relay.LRS.Interval != 10*time.Second || o.Relay.LRS.MaxPending != 1000 {
		t.Errorf("docs/load-reports.md's lrs block: %+v; the defaults: %+v", o.Relay.LRS, def.Relay.LRS)
	}
}

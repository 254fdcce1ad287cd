package upstream

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// FuzzLoadFile reads fuzzed contents as a resource file, alone (loadFile)
// and as a directory (loadDir): an error or resources, never a panic, and
// every resource loaded is of a relayed type and filed under its own name.
// Seeds: testdata/fuzz/FuzzLoadFile. To fuzz longer:
//
//	go test -run '^$' -fuzz=FuzzLoadFile -fuzztime=5m ./upstream
func FuzzLoadFile(f *testing.F) {
	f.Fuzz(func(t *testing.T, content []byte, json bool) {
		dir := t.TempDir()
		path := filepath.Join(dir, "resources.yaml")
		if json {
			path = filepath.Join(dir, "resources.json")
		}
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		anys, _ := loadFile(path)
		for i, fa := range anys {
			if fa.a == nil || fa.n < 1 {
				t.Fatalf("resource %d is %+v", i, fa)
			}
		}
		l, err := loadDir(dir)
		if err != nil {
			return
		}
		for typeURL, byName := range l.resources {
			if !xds.Known(typeURL) {
				t.Fatalf("loaded a resource of type %q", typeURL)
			}
			for name, r := range byName {
				if r == nil || r.Name != name || name == "" {
					t.Fatalf("%s %q filed as %+v", typeURL, name, r)
				}
			}
		}
	})
}

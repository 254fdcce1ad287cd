package relay

import (
	"go/build"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Imports point one way (docs/architecture.md, "Packages"): cmd → relay →
// {upstream, downstream} → {cache, loadstats} → internal. The wire helpers
// (internal/xds) sit below the cache they serve. A package may import only
// what its rule lists, of the module's own packages.
func TestImportsPointOneWay(t *testing.T) {
	const module = "github.com/xdsrelay/xdsrelay/"
	internalOnly := func(p string) bool { return strings.HasPrefix(p, "internal/") }
	allowed := map[string]func(string) bool{
		"cache":     func(p string) bool { return p == "internal/xds" },
		"loadstats": internalOnly,
		"upstream": func(p string) bool {
			return p == "cache" || p == "loadstats" || internalOnly(p)
		},
		"downstream": func(p string) bool {
			return p == "cache" || p == "loadstats" || internalOnly(p)
		},
		"relay": func(p string) bool { return !strings.HasPrefix(p, "cmd/") },
	}
	root := ".."
	dirs, err := os.ReadDir(filepath.Join(root, "internal"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if d.IsDir() {
			// internal packages import only each other; envoysim, testcp
			// and faultproxy are for tests and the load tool.
			allowed["internal/"+d.Name()] = internalOnly
		}
	}
	for pkg, ok := range allowed {
		bp, err := build.Default.ImportDir(filepath.Join(root, pkg), 0)
		if err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		for _, imp := range bp.Imports {
			own, isOwn := strings.CutPrefix(imp, module)
			if isOwn && !ok(own) {
				t.Errorf("%s imports %s: against the one-way rule", pkg, own)
			}
		}
	}
}

package relay

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// ownError is a per-resource error the relay makes itself, in its source:
// xds.NewError(name, codes.X, ...), and giveUnavailable for UNAVAILABLE.
var ownError = regexp.MustCompile(`xds\.NewError\([^,]+, codes\.([A-Za-z]+)|(giveUnavailable)\(`)

// docs/clients.md's errors table ("Answers instead of timers") has a row
// for every code of the errors the relay makes itself, one row for each
// file that makes one (each is a case of its own: the router, the timer,
// authorization, an outage, a silent server), and docs/control-planes.md says the same of an
// unroutable name: SotW clients get its NOT_FOUND too.
func TestErrorsTableIsTheRelaysErrors(t *testing.T) {
	made := map[string]int{} // code → files that make it: each a case of its own
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			strings.Contains(path, "internal/") || strings.Contains(path, "cmd/xdsload") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		inFile := map[string]bool{}
		for _, m := range ownError.FindAllStringSubmatch(string(b), -1) {
			code := "UNAVAILABLE"
			if m[1] != "" {
				var c codes.Code
				if err := c.UnmarshalJSON([]byte(`"` + strings.ToUpper(snake(m[1])) + `"`)); err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				code = strings.ToUpper(snake(m[1]))
			}
			inFile[code] = true
		}
		for code := range inFile {
			made[code]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../docs/clients.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, "|"); len(f) == 5 && strings.HasPrefix(strings.TrimSpace(f[2]), "`") {
			rows[strings.Trim(strings.TrimSpace(f[2]), "`")]++
		}
	}
	if len(made) == 0 {
		t.Fatal("found no error the relay makes")
	}
	for code, n := range made {
		if rows[code] < n {
			t.Errorf("the relay makes %s errors in %d files; docs/clients.md's table has %d rows for it", code, n, rows[code])
		}
	}
	cp, err := os.ReadFile("../docs/control-planes.md")
	if err != nil {
		t.Fatal(err)
	}
	if text := strings.Join(strings.Fields(string(cp)), " "); strings.Contains(text, "SotW clients never get it") ||
		!strings.Contains(text, "every client gets a `NOT_FOUND` error for it") {
		t.Error("docs/control-planes.md does not say that every client, SotW included, gets an unroutable name's NOT_FOUND")
	}
	t.Logf("the relay's own errors: %v", made)
}

// snake turns NotFound into NOT_FOUND's lower form, not_found.
func snake(s string) string {
	var out []rune
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			out = append(out, '_')
		}
		out = append(out, r)
	}
	return strings.ToLower(string(out))
}

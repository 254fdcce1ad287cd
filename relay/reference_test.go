package relay

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// registeredAdminPatterns reads, from the package's own source, every
// pattern the admin endpoint's mux registers (mux.Handle and
// mux.HandleFunc with a literal pattern).
func registeredAdminPatterns(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "mux" {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: a mux registration whose pattern is not a literal", fset.Position(call.Pos()))
				return true
			}
			p, _ := strconv.Unquote(lit.Value)
			out = append(out, p)
			return true
		})
	}
	slices.Sort(out)
	return out
}

// AdminPaths lists every path the admin endpoint registers, and nothing
// else.
func TestAdminPathsAreRegistered(t *testing.T) {
	got := registeredAdminPatterns(t)
	var listed []string
	for _, p := range AdminPaths() {
		listed = append(listed, p.Pattern)
		if p.Returns == "" || !slices.Contains([]string{AdminAnyone, AdminDetails, AdminViews, AdminPrivate}, p.Access) {
			t.Errorf("%s: access %q, returns %q", p.Pattern, p.Access, p.Returns)
		}
	}
	slices.Sort(listed)
	if len(got) < 10 {
		t.Fatalf("found %d registrations in the source: the scan no longer finds them", len(got))
	}
	if !slices.Equal(got, listed) {
		t.Errorf("the admin endpoint registers %q;\nAdminPaths lists %q", got, listed)
	}
}

// adminRequest is a request for an AdminPath: its method (GET for a
// pattern without one), its path, and a body and query that make a private
// caller's request succeed quickly.
func adminRequest(p AdminPath) (method, path, body string) {
	method, path, ok := strings.Cut(p.Shown(), " ")
	if !ok {
		method, path = http.MethodGet, p.Pattern
	}
	switch path {
	case "/debug/pprof/profile":
		path += "?seconds=1" // whole seconds only
	case "/debug/pprof/trace":
		path += "?seconds=0.05"
	case "/debug/loglevel":
		body = "info"
	}
	return method, path, body
}

// Each admin path answers as AdminPaths says: a caller on a public
// admin.address gets 403 exactly on the views and the private paths, a
// caller on admin.local_address exactly on the private paths, and a private
// caller gets none. Paths served only with a setting are 404 without it.
func TestAdminPathsAccess(t *testing.T) {
	with := func(c *Config) { c.Admin.Pprof = true }
	public, _ := startJSONRelay(t, FilePrefix+t.TempDir(), publicAdmin(t), with)
	private, _ := startJSONRelay(t, FilePrefix+t.TempDir(), with)
	bare := startRelay(t, FilePrefix+t.TempDir()) // no admin.pprof, no run-time log level
	for _, p := range AdminPaths() {
		method, path, body := adminRequest(p)
		code, _ := do(t, method, "http://"+public.AdminAddr()+path, body)
		if forbidden := code == http.StatusForbidden; forbidden != (p.Access == AdminPrivate || p.Access == AdminViews) {
			t.Errorf("%s %s to a caller who is not private: %d; AdminPaths says %q", method, path, code, p.Access)
		}
		code, _ = do(t, method, "http://"+public.AdminLocalAddr()+path, body)
		if forbidden := code == http.StatusForbidden; forbidden != (p.Access == AdminPrivate) {
			t.Errorf("%s %s to a caller on admin.local_address: %d; AdminPaths says %q", method, path, code, p.Access)
		}
		code, _ = do(t, method, "http://"+private.AdminAddr()+path, body)
		if code == http.StatusForbidden || code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
			t.Errorf("%s %s to a private caller: %d", method, path, code)
		}
		code, _ = do(t, method, "http://"+bare.AdminAddr()+path, body)
		if unserved := code == http.StatusNotFound || code == http.StatusMethodNotAllowed; unserved != (p.Served != "") {
			t.Errorf("%s %s without admin.pprof and a run-time log level: %d; AdminPaths says served %q", method, path, code, p.Served)
		}
	}
}

// The metric families the relay describes are those /metrics serves.
func TestMetricFamiliesAreServed(t *testing.T) {
	r := startRelay(t, FilePrefix+t.TempDir())
	served := gathered(t, r)
	var described []string
	for _, f := range r.MetricFamilies() {
		described = append(described, f.Name)
		mf := served[f.Name]
		if mf == nil {
			continue // a family with no series yet is not served
		}
		if !strings.EqualFold(mf.GetType().String(), f.Type) || mf.GetHelp() != f.Help {
			t.Errorf("%s: served as a %s %q, described as a %s %q", f.Name, mf.GetType(), mf.GetHelp(), f.Type, f.Help)
		}
	}
	for name := range served {
		if strings.HasPrefix(name, "xdsrelay_") && !slices.Contains(described, name) {
			t.Errorf("%s is served but not described", name)
		}
	}
}

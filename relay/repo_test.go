package relay

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/lockorder/lockcheck"
)

// Imports point one way (docs/architecture.md, "Packages"): cmd → relay →
// {upstream, downstream} → {cache, loadstats} → internal. The wire helpers
// (internal/xds) sit below the cache they serve. A package may import only
// what its rule lists, of the module's own packages.
func TestImportsPointOneWay(t *testing.T) {
	const module = "github.com/xdsrelay/xdsrelay/"
	internalOnly := func(p string) bool { return strings.HasPrefix(p, "internal/") }
	allowed := map[string]func(string) bool{
		"cache":     func(p string) bool { return p == "internal/xds" || p == "internal/lockorder" },
		"loadstats": internalOnly,
		"upstream": func(p string) bool {
			return p == "cache" || p == "loadstats" || internalOnly(p)
		},
		"downstream": func(p string) bool {
			return p == "cache" || p == "loadstats" || internalOnly(p)
		},
		"relay": func(p string) bool { return !strings.HasPrefix(p, "cmd/") },
		"fleet": internalOnly,
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

// maxFuncLines is the longest a function may be without a comment that
// says why it is one piece.
const maxFuncLines = 70

// Functions stay short: one longer than maxFuncLines says in its comment
// why it is one piece.
func TestLongFunctionsSayWhy(t *testing.T) {
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			doc := strings.Join(strings.Fields(fd.Doc.Text()), " ")
			if lines > maxFuncLines && !strings.Contains(doc, "one piece") {
				t.Errorf("%s: %s is %d lines, and its comment does not say why it is one piece", fset.Position(fd.Pos()), fd.Name.Name, lines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

var parenthesized = regexp.MustCompile(`\([^)]*\)`)

// The package table of docs/architecture.md ("Packages") lists, for each
// package, the relay's own packages it imports: exactly those its code
// imports (for cmd/xdsload, its library's).
func TestPackageTableIsTheImports(t *testing.T) {
	const module = "github.com/xdsrelay/xdsrelay/"
	b, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := lockcheck.Table(string(b), "| Package | What it is | Imports of the relay's own |")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatal("no package table")
	}
	for _, row := range rows {
		var pkgs []string
		for i, m := range lockcheck.Backticked.FindAllStringSubmatch(row[0], -1) {
			p := m[1]
			if i > 0 && !strings.Contains(p, "/") {
				p = "internal/" + p // `internal/testcp`, `envoysim`, ...
			}
			pkgs = append(pkgs, p)
		}
		var listed []string // what the row says outside parentheses
		for _, m := range lockcheck.Backticked.FindAllStringSubmatch(parenthesized.ReplaceAllString(row[2], ""), -1) {
			listed = append(listed, m[1])
		}
		slices.Sort(listed)
		for _, p := range pkgs {
			dirs := []string{p}
			if p == "cmd/xdsload" {
				dirs = append(dirs, "cmd/xdsload/internal/loadtest")
			}
			var imports []string
			for _, d := range dirs {
				bp, err := build.Default.ImportDir(filepath.Join("..", d), 0)
				if err != nil {
					t.Fatalf("%s: %v", d, err)
				}
				for _, imp := range bp.Imports {
					if own, ok := strings.CutPrefix(imp, module); ok && !strings.HasPrefix(own, p+"/") {
						imports = append(imports, own)
					}
				}
			}
			slices.Sort(imports)
			imports = slices.Compact(imports)
			if !slices.Equal(imports, listed) {
				t.Errorf("%s imports %v; docs/architecture.md lists %v", p, imports, listed)
			}
		}
	}
}

// No test changes a package-level variable of the code it tests
// (docs/architecture.md, "Locks": no mutable globals): what a test needs to set
// is a field or option of the thing it starts (downstream's
// Options.betweenTypes, the relay's Config.hooks), so that tests that run
// at once never see each other's settings. An assignment to such a
// variable, or a call that changes it (Store, Swap, CompareAndSwap, Add,
// Set), in a _test.go file is refused.
func TestTestsSetNoPackageVariable(t *testing.T) {
	changes := map[string]bool{"Store": true, "Swap": true, "CompareAndSwap": true, "Add": true, "Set": true}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case !d.IsDir():
			return nil
		case path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "deploy"):
			return filepath.SkipDir
		}
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, p := range pkgs {
			vars := map[string]bool{} // declared by the code, not its tests
			for name, f := range p.Files {
				if strings.HasSuffix(name, "_test.go") {
					continue
				}
				for _, decl := range f.Decls {
					if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
						for _, s := range g.Specs {
							for _, n := range s.(*ast.ValueSpec).Names {
								vars[n.Name] = n.Name != "_"
							}
						}
					}
				}
			}
			// An identifier a file does not resolve is the package's (or
			// the universe's): a package-level variable if vars has it.
			global := func(e ast.Expr) (string, bool) {
				id, ok := e.(*ast.Ident)
				if !ok {
					return "", false
				}
				return id.Name, id.Obj == nil && vars[id.Name]
			}
			for name, f := range p.Files {
				if !strings.HasSuffix(name, "_test.go") {
					continue
				}
				ast.Inspect(f, func(n ast.Node) bool {
					switch x := n.(type) {
					case *ast.AssignStmt:
						for _, l := range x.Lhs {
							if v, ok := global(l); ok {
								t.Errorf("%s: a test sets %s, a variable of the package: make it a field or option of what the test starts", fset.Position(l.Pos()), v)
							}
						}
					case *ast.CallExpr:
						if sel, ok := x.Fun.(*ast.SelectorExpr); ok && changes[sel.Sel.Name] {
							if v, ok := global(sel.X); ok {
								t.Errorf("%s: a test changes %s (%s), a variable of the package: make it a field or option of what the test starts", fset.Position(sel.Pos()), v, sel.Sel.Name)
							}
						}
					}
					return true
				})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

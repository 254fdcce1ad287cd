package lockcheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

func TestMain(m *testing.M) { Main(m) }

// Classes named as the design names two locks, for the planted inversion.
type relayMu struct{}

func (relayMu) LockName() string { return "Relay.mu" }

type cacheMu struct{}

func (cacheMu) LockName() string { return "Cache.mu" }

// The checker fails a test run that takes two locks against the order
// (Relay.mu → Cache.mu is the design's; the run takes Cache.mu, then
// Relay.mu): its tests pass, and the run fails, naming the pair, the
// cycle and both call sites.
func TestAPlantedInversionFailsTheRun(t *testing.T) {
	if !lockorder.Checking {
		t.Skip("locks are recorded in a race build only (go test -race)")
	}
	if os.Getenv("LOCKCHECK_PLANT") == "1" {
		var r lockorder.Mutex[relayMu]
		var c lockorder.RWMutex[cacheMu]
		c.RLock()
		r.Lock()
		r.Unlock()
		c.RUnlock()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAPlantedInversionFailsTheRun$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LOCKCHECK_PLANT=1")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("the run ended with %v, want exit status 1:\n%s", err, out)
	}
	for _, want := range []string{
		"PASS", // the tests passed: the checker failed the run
		"Cache.mu → Relay.mu is taken, and the lock order does not list it",
		"the locks are taken in a cycle, which can deadlock: Cache.mu → Relay.mu → Cache.mu",
		"Cache.mu taken at lockcheck.TestAPlantedInversionFailsTheRun (lockcheck/lockcheck_test.go:",
		"then Relay.mu taken at lockcheck.TestAPlantedInversionFailsTheRun (lockcheck/lockcheck_test.go:",
		"Relay.mu → Cache.mu: in the lock order, not taken here",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the run's output lacks %q:\n%s", want, out)
		}
	}
}

// notChecked are the directories whose locks need not be lockorder
// types: they are not the relay, and take none of its locks.
var notChecked = map[string]string{
	"cmd/xdsload":         "the load tool, not part of the relay",
	"internal/testcp":     "a control plane for tests",
	"internal/envoysim":   "a client for tests, behaving as Envoy",
	"internal/faultproxy": "a TCP proxy for tests",
	"internal/testlog":    "a log buffer for tests",
	"internal/realcp":     "real control planes, run for tests",
}

func exempt(dir string) bool {
	for d := range notChecked {
		if dir == d || strings.HasPrefix(dir, d+"/") {
			return true
		}
	}
	return false
}

// goFiles parses the module's Go files that are not tests (nor testdata,
// nor another module's: deploy/'s), by directory relative to the root.
func goFiles(t *testing.T) (fset *token.FileSet, files map[string][]*ast.File) {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	fset, files = token.NewFileSet(), map[string][]*ast.File{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir() && path != root && fileExists(filepath.Join(path, "go.mod")):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		files[filepath.ToSlash(rel)] = append(files[filepath.ToSlash(rel)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fset, files
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// syncLocks returns where the files declare a sync.Mutex or sync.RWMutex:
// a field, a variable or an embedded one.
func syncLocks(fset *token.FileSet, f *ast.File) []string {
	name := "sync"
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "sync" && imp.Name != nil {
			name = imp.Name.Name
		}
	}
	var at []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == name && (sel.Sel.Name == "Mutex" || sel.Sel.Name == "RWMutex") {
			at = append(at, fset.Position(sel.Pos()).String())
		}
		return true
	})
	return at
}

// classes returns the lock classes the files declare: the string each
// type's LockName returns, by the type's name.
func classes(f *ast.File) map[string]string {
	out := map[string]string{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv == nil || fd.Name.Name != "LockName" || fd.Body == nil || len(fd.Body.List) != 1 {
			continue
		}
		ret, ok := fd.Body.List[0].(*ast.ReturnStmt)
		if !ok || len(ret.Results) != 1 {
			continue
		}
		lit, ok := ret.Results[0].(*ast.BasicLit)
		if !ok {
			continue
		}
		s, _ := strconv.Unquote(lit.Value)
		if id, ok := fd.Recv.List[0].Type.(*ast.Ident); ok {
			out[id.Name] = s
		}
	}
	return out
}

// guarded returns the locks the document's "Who guards what" names.
func guarded(t *testing.T) map[string]bool {
	t.Helper()
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, Doc))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := Table(string(b), "| Lock | Guards |")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, row := range rows {
		for _, m := range Backticked.FindAllStringSubmatch(row[0], -1) {
			out[m[1]] = true
		}
	}
	return out
}

// Every lock in the code is a lockorder type, so that the race run checks
// its order, and the design says what it guards: "Who guards what" names
// its class, once.
func TestEveryLockIsChecked(t *testing.T) {
	fset, files := goFiles(t)
	guards := guarded(t)
	byName := map[string]string{} // class name → where declared
	for dir, fs := range files {
		for _, f := range fs {
			if !exempt(dir) && dir != "internal/lockorder" {
				for _, at := range syncLocks(fset, f) {
					t.Errorf("%s: a sync lock; make it a lockorder.Mutex or RWMutex of a class the design names", at)
				}
			}
			for typ, name := range classes(f) {
				where := dir + "." + typ
				if prev, ok := byName[name]; ok {
					t.Errorf("lock class %q is both %s and %s", name, prev, where)
				}
				byName[name] = where
				if !guards[name] {
					t.Errorf("lock class %s (%s) is not in %s's table of who guards what", name, where, Doc)
				}
			}
		}
	}
	if len(byName) == 0 {
		t.Fatal("no lock class found: the walk found no code")
	}
	for name := range guards {
		if _, ok := byName[name]; !ok {
			t.Errorf("%s's table of who guards what names %s, which no lock of the code is", Doc, name)
		}
	}
}

// codeNames are the functions and methods of the relay's packages, as
// "Func", "Type.Method" and "pkg.Func".
func codeNames(files map[string][]*ast.File) map[string]bool {
	names := map[string]bool{}
	for dir, fs := range files {
		pkg := filepath.Base(dir)
		for _, f := range fs {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok {
					continue
				}
				names[fd.Name.Name] = true
				if fd.Recv == nil {
					names[pkg+"."+fd.Name.Name] = true
					continue
				}
				typ := fd.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				switch ix := typ.(type) {
				case *ast.IndexExpr:
					typ = ix.X
				case *ast.IndexListExpr:
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					names[id.Name+"."+fd.Name.Name] = true
				}
			}
		}
	}
	return names
}

// The order's table is well formed: each lock a row names is one "Who
// guards what" lists, each function its third column names exists (or is
// a lock), and the order has no cycle.
func TestTheOrderIsWellFormed(t *testing.T) {
	_, files := goFiles(t)
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, Doc))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := Table(string(b), Header)
	if err != nil {
		t.Fatal(err)
	}
	pairs, err := Pairs(rows)
	if err != nil {
		t.Fatal(err)
	}
	guards, names := guarded(t), codeNames(files)
	for i, p := range pairs {
		for _, l := range []string{p.Held, p.Taken} {
			if l != lockorder.Any && !guards[l] {
				t.Errorf("lock order: %s is not in the table of who guards what", l)
			}
		}
		for _, m := range Backticked.FindAllStringSubmatch(rows[i][2], -1) {
			if !names[m[1]] && !guards[m[1]] {
				t.Errorf("lock order %s → %s: %s names no function of the code", p.Held, p.Taken, m[1])
			}
		}
	}
	if slices.ContainsFunc(pairs, func(p lockorder.Pair) bool { return p.Held == p.Taken }) {
		t.Error("lock order: a lock taken under itself")
	}
	for _, p := range lockorder.Check(lockorder.Observation{}, lockorder.NewOrder(pairs)) {
		t.Error(p)
	}
}

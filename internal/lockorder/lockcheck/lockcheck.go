// Package lockcheck holds a package's tests to the lock order of
// docs/architecture.md ("Locks"), the design of record: Main runs the
// tests, checks goroutine leaks as goleak.VerifyTestMain does, then fails
// the run on any pair of locks the tests took that the document's table
// does not list, or on a cycle, naming where both locks were taken. The
// pairs are recorded in a race build (internal/lockorder), which is how
// CI runs the tests.
package lockcheck

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// Doc is the design of record, from the module's root.
const Doc = "docs/architecture.md"

// Header is the header line of the document's table of the lock order.
const Header = "| Held | Taken | Where |"

// Main runs m's tests with goleak's check (opts) and the lock order's,
// and exits with their status. Call it from TestMain. With LOCKCHECK_PAIRS
// set in the environment, it writes every pair taken, with where, to
// stderr: what the table's Where column says.
func Main(m *testing.M, opts ...goleak.Option) {
	order, err := Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockcheck:", err)
		os.Exit(1)
	}
	lockorder.Expect(order)
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	obs := lockorder.Observed()
	if os.Getenv("LOCKCHECK_PAIRS") != "" {
		for _, e := range obs.Edges {
			fmt.Fprintf(os.Stderr, "lockcheck: %s → %s\n\t%s\n\t%s\n", e.Held, e.Taken, strings.Join(e.HeldAt, " ← "), strings.Join(e.TakenAt, " ← "))
		}
	}
	if problems := lockorder.Check(obs, order); len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "lockcheck: the locks taken do not keep %s's order (\"Locks\"):\n", Doc)
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "  "+p)
		}
		code = 1
	}
	os.Exit(code)
}

// Load reads the lock order from the design of record, found from the
// working directory up.
func Load() (*lockorder.Order, error) {
	root, err := Root()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(root, Doc))
	if err != nil {
		return nil, err
	}
	rows, err := Table(string(b), Header)
	if err != nil {
		return nil, err
	}
	pairs, err := Pairs(rows)
	if err != nil {
		return nil, err
	}
	return lockorder.NewOrder(pairs), nil
}

// Root returns the module's root: the nearest directory up from the
// working directory with a go.mod naming the relay's module.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/xdsrelay/xdsrelay\n") {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod of github.com/xdsrelay/xdsrelay above the working directory")
		}
		dir = up
	}
}

// Table returns the rows of the markdown table of doc whose header line is
// header, each a list of trimmed cells.
func Table(doc, header string) ([][]string, error) {
	_, after, ok := strings.Cut(doc, header+"\n")
	if !ok {
		return nil, fmt.Errorf("no table %q in %s", header, Doc)
	}
	var rows [][]string
	for i, line := range strings.Split(after, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		if i == 0 {
			continue // the |---| line
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.TrimSpace(c))
		}
		rows = append(rows, cells)
	}
	return rows, nil
}

// Backticked finds the code spans of a cell.
var Backticked = regexp.MustCompile("`([^`]+)`")

// Pairs reads the rows of the order's table: a held lock and a taken
// lock, each one code span, or "any" for one of them.
func Pairs(rows [][]string) ([]lockorder.Pair, error) {
	var pairs []lockorder.Pair
	for _, row := range rows {
		if len(row) < 2 {
			return nil, fmt.Errorf("lock order row %q: want Held | Taken | Where", row)
		}
		held, taken := lockOrAny(row[0]), lockOrAny(row[1])
		if held == "" || taken == "" || held == lockorder.Any && taken == lockorder.Any {
			return nil, fmt.Errorf("lock order row %q: a lock is one code span, or \"any\" for one of the two", row)
		}
		pairs = append(pairs, lockorder.Pair{Held: held, Taken: taken})
	}
	return pairs, nil
}

func lockOrAny(cell string) string {
	if cell == lockorder.Any {
		return cell
	}
	return span(cell)
}

func span(cell string) string {
	m := Backticked.FindAllStringSubmatch(cell, -1)
	if len(m) != 1 || m[0][0] != cell {
		return ""
	}
	return m[0][1]
}

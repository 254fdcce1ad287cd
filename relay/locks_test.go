package relay

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// lockProbe is a log handler that, at each record whose message starts
// with prefix, takes the relay's mu as any reader of the groups does:
// the callback that logs the record would deadlock if it ran under that
// lock. It tries for a bound instead of blocking, so that the test fails
// rather than hangs, and counts the records it got the lock at and those
// it did not.
type lockProbe struct {
	slog.Handler
	prefix   string
	r        *atomic.Pointer[Relay]
	got, not *atomic.Int32
}

func (h lockProbe) Handle(ctx context.Context, rec slog.Record) error {
	if r := h.r.Load(); r != nil && strings.HasPrefix(rec.Message, h.prefix) {
		if tryLockWithin(&r.mu, 2*time.Second) {
			r.mu.Unlock()
			h.got.Add(1)
		} else {
			h.not.Add(1)
		}
	}
	if !h.Handler.Enabled(ctx, rec.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, rec)
}

// Enabled sees every record: the probe is not bound by the level.
func (h lockProbe) Enabled(context.Context, slog.Level) bool { return true }

func (h lockProbe) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h lockProbe) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// tryLockWithin takes mu unless it stays held for d.
func tryLockWithin(mu interface{ TryLock() bool }, d time.Duration) bool {
	for end := time.Now().Add(d); !mu.TryLock(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// probedRelay starts a relay in front of cp whose log is probed at records
// starting with prefix (see lockProbe); got and not count them.
func probedRelay(t *testing.T, cp *testcp.ControlPlane, prefix string, mutate func(*Config)) (r *Relay, got, not *atomic.Int32) {
	t.Helper()
	var rp atomic.Pointer[Relay]
	got, not = &atomic.Int32{}, &atomic.Int32{}
	logger := slog.New(lockProbe{Handler: testLogger().Handler(), prefix: prefix, r: &rp, got: got, not: not})
	r = startRelayLogged(t, cp.Addr, logger, mutate)
	rp.Store(r)
	return r, got, not
}

// No lock is held across a callback (docs/architecture.md, "Locks"): the
// sweeper ends a guard hold that guard.hold let pass, and releases a
// rollout's change after rollout.bake, and the cache tells the relay
// (OnGuard, OnRollout), which logs it. A log handler that reads the groups
// takes Relay.mu there; were the sweeper to hold it across Sweep, that
// would deadlock.
func TestSweepCallsBackWithoutTheRelaysLock(t *testing.T) {
	t.Run("OnGuard", func(t *testing.T) {
		cp := testcp.Start(t)
		rs, names := endpoints(20)
		cp.Set(t, "c1", "1", rs...)
		r, got, not := probedRelay(t, cp, "guard: hold ended", func(c *Config) { c.Guard.Hold = 200 * time.Millisecond })
		s := subscribeAll(t, r, "n", names)
		cp.Set(t, "c1", "2") // all 20 removed: held, until guard.hold ends it
		removed := 0
		for removed < len(names) {
			removed += len(s.recvWithin(wait).GetRemovedResources())
		}
		eventually(t, "the hold's end to be logged", func() bool { return got.Load()+not.Load() > 0 })
		if not.Load() > 0 {
			t.Fatal("the sweeper held Relay.mu while the cache told it the hold ended")
		}
	})
	t.Run("OnRollout", func(t *testing.T) {
		cp := testcp.Start(t)
		cp.Set(t, "c1", "1", testcp.Endpoints("x", "127.0.0.1:1"), testcp.Endpoints("y", "127.0.0.1:1"))
		r, got, not := probedRelay(t, cp, "rollout: change released after rollout.bake", func(c *Config) {
			c.Rollout.Canary, c.Rollout.Bake = 1, 200*time.Millisecond
		})
		// The canary (the lower rank) watches x only; the other client y.
		canary, other := "client-a", "client-b"
		if compareRank(downstream.Rank(canary), downstream.Rank(other)) > 0 {
			canary, other = other, canary
		}
		subscribeAll(t, r, canary, []string{"x"})
		s := subscribeAll(t, r, other, []string{"y"})
		// y changes: no canary watches it, so it is released once the bake
		// passes, by the sweeper.
		cp.Set(t, "c1", "2", testcp.Endpoints("x", "127.0.0.1:1"), testcp.Endpoints("y", "127.0.0.1:2"))
		s.recvWithin(wait)
		eventually(t, "the release to be logged", func() bool { return got.Load()+not.Load() > 0 })
		if not.Load() > 0 {
			t.Fatal("the sweeper held Relay.mu while the cache told it the change was released")
		}
	})
}

// lockOrder is the order in which locks are taken, as the code takes them:
// held → taken. docs/architecture.md ("Locks") shows it as a table, which
// TestLockOrderIsDocumented holds to this one. A change that takes a lock
// under another adds its pair here and its row there.
var lockOrder = [][2]string{
	{"Relay.mu", "Cache.mu"},
	{"Relay.mu", "loadstats.Store.mu"},
	{"Relay.mu", "routedFeed.mu"},
	{"Relay.mu", "Client.mu"},
	{"Relay.mu", "Cache.wakeMu"},
	{"pump.mu", "Cache.mu"},
	{"pump.mu", "Cache.wakeMu"},
	{"pump.mu", "Watch.mu"},
	{"pump.mu", "streamStatus.mu"},
	{"pump.mu", "sendGuard.mu"},
	{"pump.mu", "sendPool.watchMu"},
	{"pump.mu", "sendConn.warmMu"},
	{"pump.mu", "warmInbox.mu"},
	{"pump.mu", "loadstats.Store.mu"},
	{"pump.mu", "sendConn.mu"},
	{"pump.mu", "sendPool.mu"},
	{"sendGuard.mu", "sendConn.mu"},
	{"sendGuard.mu", "sendPool.mu"},
	{"Cache.wakeMu", "Cache.mu"},
	{"Cache.wakeMu", "Watch.mu"},
	{"Cache.wakeMu", "sendConn.mu"},
	{"Cache.wakeMu", "sendPool.mu"},
	{"Cache.mu", "convergence.mu"},
	{"streamStatus.mu", "convergence.mu"},
	{"streamStatus.mu", "Rejections.mu"},
	{"Relay.mu", "Switch.mu"},
	{"Relay.mu", "Members.mu"},
	{"Relay.mu", "fleetWiring.mu"},
}

// mdTable returns the rows of the markdown table of doc whose header line
// is header, each a list of cells.
func mdTable(t *testing.T, doc, header string) [][]string {
	t.Helper()
	_, after, ok := strings.Cut(doc, header+"\n")
	if !ok {
		t.Fatalf("no table %q", header)
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
	return rows
}

var backticked = regexp.MustCompile("`([^`]+)`")

// codeNames are the functions and methods of the relay's packages, as
// "Func", "Type.Method" and "pkg.Func".
func codeNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, pkg := range []string{"relay", "cache", "upstream", "downstream", "loadstats", "fleet"} {
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, filepath.Join("..", pkg), func(fi fs.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkgs {
			for _, f := range p.Files {
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
					if ix, ok := typ.(*ast.IndexExpr); ok {
						typ = ix.X
					}
					if id, ok := typ.(*ast.Ident); ok {
						names[id.Name+"."+fd.Name.Name] = true
					}
				}
			}
		}
	}
	return names
}

// The lock order of docs/architecture.md is the code's (lockOrder): the
// same pairs, each lock one that the "Who guards what" table lists, every
// function a row names one that exists, and no cycle.
func TestLockOrderIsDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	guarded := map[string]bool{}
	for _, row := range mdTable(t, doc, "| Lock | Guards |") {
		for _, m := range backticked.FindAllStringSubmatch(row[0], -1) {
			guarded[m[1]] = true
		}
	}
	names := codeNames(t)
	var documented [][2]string
	for _, row := range mdTable(t, doc, "| Held | Taken | Where |") {
		held, taken := strings.Trim(row[0], "`"), strings.Trim(row[1], "`")
		documented = append(documented, [2]string{held, taken})
		for _, l := range []string{held, taken} {
			if !guarded[l] {
				t.Errorf("lock order: %s is not in the table of who guards what", l)
			}
		}
		for _, m := range backticked.FindAllStringSubmatch(row[2], -1) {
			if !names[m[1]] {
				t.Errorf("lock order %s → %s: %s names no function of the code", held, taken, m[1])
			}
		}
	}
	slices.SortFunc(documented, func(a, b [2]string) int { return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1]) })
	want := slices.Clone(lockOrder)
	slices.SortFunc(want, func(a, b [2]string) int { return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1]) })
	if !slices.Equal(documented, want) {
		t.Errorf("docs/architecture.md's lock order:\n%v\nthe code's (lockOrder):\n%v", documented, want)
	}
	// No cycle: taking locks in this order can never deadlock.
	after := map[string][]string{}
	for _, e := range lockOrder {
		after[e[0]] = append(after[e[0]], e[1])
	}
	state := map[string]int{} // 1: on the path, 2: done
	var visit func(l string, path []string)
	visit = func(l string, path []string) {
		switch state[l] {
		case 1:
			t.Fatalf("the lock order has a cycle: %v", append(path, l))
		case 2:
			return
		}
		state[l] = 1
		for _, n := range after[l] {
			visit(n, append(path, l))
		}
		state[l] = 2
	}
	for l := range after {
		visit(l, nil)
	}
}

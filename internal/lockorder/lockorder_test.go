package lockorder

import (
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/petermattis/goid"
)

type classA struct{}

func (classA) LockName() string { return "test.A" }

type classB struct{}

func (classB) LockName() string { return "test.B" }

type classC struct{}

func (classC) LockName() string { return "test.C" }

type classD struct{}

func (classD) LockName() string { return "test.D" }

type classE struct{}

func (classE) LockName() string { return "test.E" }

// observedAmong returns the pairs recorded between the classes named.
func observedAmong(names ...string) map[Pair]Edge {
	out := map[Pair]Edge{}
	for _, e := range Observed().Edges {
		if slices.Contains(names, e.Held) && slices.Contains(names, e.Taken) {
			out[Pair{e.Held, e.Taken}] = e
		}
	}
	return out
}

func needChecking(t *testing.T) {
	t.Helper()
	if !Checking {
		t.Skip("locks are recorded in a race build only (go test -race)")
	}
}

// A lock costs no memory beyond its sync mutex.
func TestALockIsItsSyncMutex(t *testing.T) {
	if got, want := unsafe.Sizeof(Mutex[classA]{}), unsafe.Sizeof(sync.Mutex{}); got != want {
		t.Errorf("Mutex: %d bytes, sync.Mutex %d", got, want)
	}
	if got, want := unsafe.Sizeof(RWMutex[classA]{}), unsafe.Sizeof(sync.RWMutex{}); got != want {
		t.Errorf("RWMutex: %d bytes, sync.RWMutex %d", got, want)
	}
}

// Two classes taken in both orders: the checker reports the pair the
// order does not list and the cycle, each with where both locks were
// taken.
func TestPlantedInversionFails(t *testing.T) {
	needChecking(t)
	var a Mutex[classA]
	var b Mutex[classB]
	a.Lock()
	b.Lock() // test.A → test.B: listed
	b.Unlock()
	a.Unlock()
	done := make(chan struct{})
	go func() { // another goroutine, as a deadlock needs
		defer close(done)
		b.Lock()
		a.Lock() // test.B → test.A: the inversion
		a.Unlock()
		b.Unlock()
	}()
	<-done
	seen := observedAmong("test.A", "test.B")
	if len(seen) != 2 {
		t.Fatalf("recorded %v, want test.A → test.B and test.B → test.A", seen)
	}
	obs := Observation{Edges: []Edge{seen[Pair{"test.A", "test.B"}], seen[Pair{"test.B", "test.A"}]}}
	problems := Check(obs, NewOrder([]Pair{{"test.A", "test.B"}}))
	if len(problems) != 2 {
		t.Fatalf("problems %q, want the unlisted pair and the cycle", problems)
	}
	unlisted, cycle := problems[0], problems[1]
	if !strings.HasPrefix(unlisted, "test.B → test.A is taken, and the lock order does not list it") {
		t.Errorf("first problem %q, want the unlisted pair", unlisted)
	}
	if !strings.Contains(cycle, "cycle") || !strings.Contains(cycle, "test.A → test.B → test.A") {
		t.Errorf("second problem %q, want the cycle", cycle)
	}
	// Both call sites: this file, the lines of the goroutine's b.Lock and
	// a.Lock.
	for _, p := range problems {
		if n := strings.Count(p, "lockorder_test.go:"); n < 2 {
			t.Errorf("%q names %d call sites of this file, want both locks'", p, n)
		}
		if !strings.Contains(p, "TestPlantedInversionFails.func1") {
			t.Errorf("%q does not name the goroutine that inverted", p)
		}
	}
}

// A lock taken with TryLock waits for nothing, so it is ordered under
// nothing; what is taken under it is ordered after it.
func TestTryLockOrdersWhatIsTakenUnderIt(t *testing.T) {
	needChecking(t)
	var c Mutex[classC]
	var d Mutex[classD]
	c.Lock()
	if !d.TryLock() {
		t.Fatal("TryLock of a free lock failed")
	}
	d.Unlock()
	c.Unlock()
	if !d.TryLock() {
		t.Fatal("TryLock of a free lock failed")
	}
	c.Lock()
	c.Unlock()
	d.Unlock()
	got := observedAmong("test.C", "test.D")
	if _, ok := got[Pair{"test.C", "test.D"}]; ok {
		t.Error("a TryLock under test.C was ordered after it")
	}
	if _, ok := got[Pair{"test.D", "test.C"}]; !ok {
		t.Error("test.C taken under a TryLock of test.D was not ordered after it")
	}
}

// A read lock is ordered as a write lock; a lock unlocked on another
// goroutine than the one that locked it is no longer held by either.
func TestReadLocksAndUnlocksElsewhere(t *testing.T) {
	needChecking(t)
	var e RWMutex[classE]
	var a Mutex[classA]
	a.Lock()
	e.RLock()
	e.RUnlock()
	done := make(chan struct{})
	go func() { defer close(done); a.Unlock() }()
	<-done
	e.Lock() // a is no longer held here: no test.A → test.E from this
	e.Unlock()
	got := observedAmong("test.A", "test.E")
	if len(got) != 1 {
		t.Fatalf("recorded %v, want test.A → test.E once", got)
	}
	if e := got[Pair{"test.A", "test.E"}]; len(e.TakenAt) == 0 || !strings.Contains(e.TakenAt[0], "TestReadLocksAndUnlocksElsewhere") {
		t.Errorf("test.E taken at %q, want this test", e.TakenAt)
	}
	if s := Observed().Strays; s != 0 {
		t.Errorf("%d unlocks of locks held by no goroutine", s)
	}
}

// Check's words: a pair under Any is allowed under every lock, and a
// cycle of the order alone is one.
func TestCheck(t *testing.T) {
	order := NewOrder([]Pair{{"X", "Y"}, {"Y", "Z"}, {Any, "M"}, {"F", Any}})
	for _, tc := range []struct {
		name  string
		edges []Pair
		order *Order
		want  []string
	}{
		{name: "listed", edges: []Pair{{"X", "Y"}, {"X", "M"}, {"Z", "M"}}, order: order},
		{name: "unlisted", edges: []Pair{{"X", "Z"}}, order: order, want: []string{"X → Z is taken"}},
		{name: "inverted", edges: []Pair{{"Z", "X"}}, order: order, want: []string{"Z → X is taken", "cycle, which can deadlock: X → Y → Z → X"}},
		{name: "under any, taking", edges: []Pair{{"M", "X"}}, order: order, want: []string{"M → X is taken"}},
		{name: "first, over any", edges: []Pair{{"F", "X"}, {"F", "M"}}, order: order},
		{name: "first, under one", edges: []Pair{{"F", "X"}, {"X", "F"}}, order: order, want: []string{"X → F is taken", "cycle, which can deadlock: F → X → F"}},
		{name: "same class", edges: []Pair{{"X", "X"}}, order: order, want: []string{"X → X is taken", "cycle, which can deadlock: X → X"}},
		{name: "the order's own cycle", order: NewOrder([]Pair{{"X", "Y"}, {"Y", "X"}}), want: []string{"cycle, which can deadlock: X → Y → X"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var obs Observation
			for _, p := range tc.edges {
				obs.Edges = append(obs.Edges, Edge{Held: p.Held, Taken: p.Taken, HeldAt: []string{"h"}, TakenAt: []string{"t"}})
			}
			got := Check(obs, tc.order)
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %q", got, tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("problem %q, want %q", got[i], tc.want[i])
				}
			}
		})
	}
}

// The goroutine ids the recorder keys held locks by are the runtime's own
// (the library reads them from the runtime's g, whose layout a Go release
// may change).
func TestGoroutineIDsAreTheRuntimes(t *testing.T) {
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			buf := make([]byte, 64)
			buf = buf[:runtime.Stack(buf, false)]
			field := strings.Fields(strings.TrimPrefix(string(buf), "goroutine "))[0]
			want, err := strconv.ParseInt(field, 10, 64)
			if err != nil {
				t.Errorf("runtime.Stack: %q", buf)
				return
			}
			if got := goid.Get(); got != want {
				t.Errorf("goid.Get() = %d, the runtime says %d", got, want)
			}
		})
	}
	wg.Wait()
}

var sink int

func BenchmarkMutex(b *testing.B) {
	b.Run("sync.Mutex", func(b *testing.B) {
		var mu sync.Mutex
		for b.Loop() {
			mu.Lock()
			sink++
			mu.Unlock()
		}
	})
	b.Run("lockorder.Mutex", func(b *testing.B) {
		var mu Mutex[classA]
		for b.Loop() {
			mu.Lock()
			sink++
			mu.Unlock()
		}
	})
	b.Run("sync.RWMutex.RLock", func(b *testing.B) {
		var mu sync.RWMutex
		for b.Loop() {
			mu.RLock()
			sink++
			mu.RUnlock()
		}
	})
	b.Run("lockorder.RWMutex.RLock", func(b *testing.B) {
		var mu RWMutex[classA]
		for b.Loop() {
			mu.RLock()
			sink++
			mu.RUnlock()
		}
	})
	b.Run("nested/lockorder.Mutex", func(b *testing.B) {
		var mu Mutex[classA]
		var mu2 Mutex[classB]
		for b.Loop() {
			mu.Lock()
			mu2.Lock()
			sink++
			mu2.Unlock()
			mu.Unlock()
		}
	})
}

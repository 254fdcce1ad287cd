package lockorder

import (
	"fmt"
	"slices"
	"strings"
)

// Any, as the held lock of a Pair, allows the taken lock under any lock
// (a lock that takes nothing while held); as the taken lock, it allows any
// lock under the held one (a lock taken first, under no other).
const Any = "any"

// Pair is one step of the order: Taken may be taken while Held is held.
type Pair struct {
	Held, Taken string
}

// Order is the lock order a design gives: the pairs that may be taken one
// under the other.
type Order struct {
	pairs map[Pair]bool
	any   map[string]bool // taken under any lock
	first map[string]bool // may hold any lock
}

// NewOrder returns the order of pairs.
func NewOrder(pairs []Pair) *Order {
	o := &Order{pairs: map[Pair]bool{}, any: map[string]bool{}, first: map[string]bool{}}
	for _, p := range pairs {
		switch {
		case p.Held == Any:
			o.any[p.Taken] = true
		case p.Taken == Any:
			o.first[p.Held] = true
		default:
			o.pairs[p] = true
		}
	}
	return o
}

// Allows says whether taken may be taken while held is held.
func (o *Order) Allows(held, taken string) bool {
	return o.any[taken] || o.first[held] || o.pairs[Pair{held, taken}]
}

// Edge is a pair of classes the code took one under the other, with the
// first place each was taken: call sites, innermost first.
type Edge struct {
	Held, Taken     string
	HeldAt, TakenAt []string
}

func (e Edge) where() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\t%s taken at %s\n", e.Held, strings.Join(e.HeldAt, "\n\t\tcalled from "))
	fmt.Fprintf(&b, "\tthen %s taken at %s\n", e.Taken, strings.Join(e.TakenAt, "\n\t\tcalled from "))
	return b.String()
}

// Observation is what a race build recorded: the pairs taken, and what it
// could not follow.
type Observation struct {
	Edges   []Edge
	Strays  int // unlocks of a lock no goroutine was recorded holding
	Deep    int // locks taken while a goroutine held maxHeld
	Dropped int // pairs past what the recorder keeps
}

// Observed returns what this process recorded so far: nothing outside a
// race build (Checking).
func Observed() Observation { return observed() }

// Expect sets the order each pair is told against as it is first taken:
// one that o does not allow is written to stderr at once, with where, so
// that a test that deadlocks on it has said why. Call it before the locks
// are taken (TestMain).
func Expect(o *Order) { expect(o) }

// Check holds what was observed to o: each pair o does not allow, each
// cycle among the pairs observed and allowed, and what the recorder could
// not follow, is a problem, said with the call sites of both locks.
func Check(obs Observation, o *Order) []string {
	var problems []string
	for _, e := range obs.Edges {
		if !o.Allows(e.Held, e.Taken) {
			problems = append(problems, fmt.Sprintf("%s → %s is taken, and the lock order does not list it:\n%s", e.Held, e.Taken, e.where()))
		}
	}
	problems = append(problems, cycles(obs.Edges, o)...)
	if obs.Strays > 0 {
		problems = append(problems, fmt.Sprintf("%d unlocks of a lock no goroutine was recorded holding", obs.Strays))
	}
	if obs.Deep > 0 {
		problems = append(problems, fmt.Sprintf("%d locks taken while a goroutine held %d already: not recorded", obs.Deep, maxHeldAll))
	}
	if obs.Dropped > 0 {
		problems = append(problems, fmt.Sprintf("%d pairs past the %d the recorder keeps: not checked", obs.Dropped, maxEdgesAll))
	}
	return problems
}

// The recorder's bounds, in every build, for Check's words.
const (
	maxHeldAll  = 32
	maxEdgesAll = 1024
)

// cycles returns each cycle of the graph of the pairs observed and those o
// lists (a row with Any adds no pair: what it allows is in the graph as
// observed), naming where each observed pair of it was taken.
func cycles(observed []Edge, o *Order) []string {
	next := map[string][]string{}
	at := map[Pair]Edge{}
	add := func(p Pair) {
		if !slices.Contains(next[p.Held], p.Taken) {
			next[p.Held] = append(next[p.Held], p.Taken)
		}
	}
	for p := range o.pairs {
		add(p)
	}
	for _, e := range observed {
		p := Pair{e.Held, e.Taken}
		add(p)
		if _, ok := at[p]; !ok {
			at[p] = e
		}
	}
	var nodes []string
	for n := range next {
		nodes = append(nodes, n)
		slices.Sort(next[n])
	}
	slices.Sort(nodes)
	var out []string
	state := map[string]int{} // 1: on the path, 2: done
	var path []string
	var visit func(n string)
	visit = func(n string) {
		switch state[n] {
		case 1:
			i := slices.Index(path, n)
			out = append(out, describeCycle(append(slices.Clone(path[i:]), n), at))
			return
		case 2:
			return
		}
		state[n] = 1
		path = append(path, n)
		for _, m := range next[n] {
			visit(m)
		}
		path = path[:len(path)-1]
		state[n] = 2
	}
	for _, n := range nodes {
		visit(n)
	}
	return out
}

func describeCycle(cycle []string, at map[Pair]Edge) string {
	var b strings.Builder
	fmt.Fprintf(&b, "the locks are taken in a cycle, which can deadlock: %s\n", strings.Join(cycle, " → "))
	for i := 0; i+1 < len(cycle); i++ {
		p := Pair{cycle[i], cycle[i+1]}
		if e, ok := at[p]; ok {
			b.WriteString(e.where())
		} else {
			fmt.Fprintf(&b, "\t%s → %s: in the lock order, not taken here\n", p.Held, p.Taken)
		}
	}
	return b.String()
}

// shortFunc trims a function's package path to its last element:
// "github.com/x/y/cache.(*Cache).Apply" → "cache.(*Cache).Apply".
func shortFunc(f string) string {
	if i := strings.LastIndex(f, "/"); i >= 0 {
		return f[i+1:]
	}
	return f
}

// shortFile keeps a file's last directory and name: "cache/apply.go".
func shortFile(f string) string {
	i := strings.LastIndex(f, "/")
	if i < 0 {
		return f
	}
	if j := strings.LastIndex(f[:i], "/"); j >= 0 {
		return f[j+1:]
	}
	return f
}

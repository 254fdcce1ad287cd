package fleet

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// owners is the owner of each of n keys on a ring of members.
func owners(members []string, n int) []string {
	r := NewRing(members)
	out := make([]string, n)
	for i := range out {
		out[i] = r.Owner(fmt.Sprintf("cluster=c%d,user_agent=envoy/1.3%d", i, i%7))
	}
	return out
}

func membersOf(n int) []string {
	var m []string
	for i := range n {
		m = append(m, fmt.Sprintf("10.0.0.%d:18001", i+1))
	}
	return m
}

// Removing one of N members moves exactly the keys it owned (about 1/N),
// each to another member, and no other key; adding one moves about
// 1/(N+1) of the keys, each to the new member.
func TestRendezvousMovesOnlyTheKeysOfTheMemberThatComesOrGoes(t *testing.T) {
	const keys = 20000
	for _, n := range []int{2, 3, 5, 10} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			all := membersOf(n)
			before := owners(all, keys)
			gone := all[n/2]
			after := owners(slices.DeleteFunc(slices.Clone(all), func(m string) bool { return m == gone }), keys)
			moved := 0
			for i := range before {
				switch {
				case before[i] == gone && after[i] == gone:
					t.Fatalf("key %d still owned by the removed member", i)
				case before[i] == gone:
					moved++
				case before[i] != after[i]:
					t.Fatalf("key %d moved from %s to %s though its owner stayed", i, before[i], after[i])
				}
			}
			checkShare(t, "removed", moved, keys, n)

			added := "10.0.1.1:18001"
			grown := owners(append(slices.Clone(all), added), keys)
			moved = 0
			for i := range before {
				if grown[i] != before[i] {
					if grown[i] != added {
						t.Fatalf("key %d moved from %s to %s, not to the new member", i, before[i], grown[i])
					}
					moved++
				}
			}
			checkShare(t, "added", moved, keys, n+1)
		})
	}
}

// checkShare holds moved of keys to about 1/n: within 15% of it.
func checkShare(t *testing.T, what string, moved, keys, n int) {
	t.Helper()
	want := float64(keys) / float64(n)
	if math.Abs(float64(moved)-want) > 0.15*want {
		t.Errorf("%s one of %d members: %d of %d keys moved, want about %.0f", what, n, moved, keys, want)
	}
}

// Every member computes the same owner from the same view, whatever order
// it lists the members in.
func TestRendezvousOwnerDoesNotDependOnOrder(t *testing.T) {
	m := membersOf(7)
	a := owners(m, 2000)
	slices.Reverse(m)
	if b := owners(m, 2000); !slices.Equal(a, b) {
		t.Fatal("the owners depend on the order of the members")
	}
}

// Each member of a view owns about its share of the keys.
func TestRendezvousSpreadsKeys(t *testing.T) {
	const keys = 30000
	count := map[string]int{}
	for _, o := range owners(membersOf(3), keys) {
		count[o]++
	}
	for m, c := range count {
		checkShare(t, "owned by "+m, c, keys, 3)
	}
}

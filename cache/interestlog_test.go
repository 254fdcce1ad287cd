package cache

import (
	"maps"
	"strconv"
	"testing"
)

// An interest log keeps the last word on each name since it was taken,
// and past maxInterestLog names says to read the whole interest instead;
// so does a log dropped on purpose. Taking it empties it.
func TestInterestLog(t *testing.T) {
	var l InterestLog
	l.Note(eds, "a", true)
	l.Note(eds, "b", true)
	l.Note(eds, "a", false)
	l.Note(cds, "*", true)
	changes, all := l.Take()
	want := map[string]map[string]bool{eds: {"a": false, "b": true}, cds: {"*": true}}
	if all || len(changes) != 2 || !maps.Equal(changes[eds], want[eds]) || !maps.Equal(changes[cds], want[cds]) {
		t.Fatalf("took %v (all %v), want %v", changes, all, want)
	}
	if changes, all := l.Take(); changes != nil || all {
		t.Fatalf("taken again: %v (all %v), want nothing", changes, all)
	}
	for i := range maxInterestLog + 1 {
		l.Note(eds, strconv.Itoa(i), true)
	}
	l.Note(eds, "after", true) // dropped: noted no more
	if changes, all := l.Take(); changes != nil || !all {
		t.Fatalf("past the bound: %d types (all %v), want all", len(changes), all)
	}
	l.Note(eds, "a", true)
	l.Drop()
	if changes, all := l.Take(); changes != nil || !all {
		t.Fatalf("dropped: %v (all %v), want all", changes, all)
	}
	if changes, all := l.Take(); changes != nil || all {
		t.Fatalf("after all was taken: %v (all %v), want nothing", changes, all)
	}
}

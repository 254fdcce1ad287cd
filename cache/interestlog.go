package cache

import "slices"

// maxInterestLog bounds an interest log: past it, the log is dropped and
// whoever takes it reads the whole interest instead.
const maxInterestLog = 1 << 16

// InterestLog is a bounded log of how a union of interests changed, by
// type: name → whether it is wanted now, "*" standing for the wildcard.
// Past maxInterestLog names it is dropped, and says so: whoever takes it
// reads the whole interest instead. It is the cache's (InterestChanges)
// and each upstream's share of it (upstream/router.go); its owner's lock
// guards it. The zero value is an empty log.
type InterestLog struct {
	changes map[string]map[string]bool
	n       int  // names in changes
	all     bool // dropped: read the whole interest
}

// Note records that name of typeURL entered (wanted) or left the union.
func (l *InterestLog) Note(typeURL, name string, wanted bool) {
	if l.all {
		return
	}
	if l.changes == nil {
		l.changes = make(map[string]map[string]bool)
	}
	m := l.changes[typeURL]
	if m == nil {
		m = make(map[string]bool)
		l.changes[typeURL] = m
	}
	if _, ok := m[name]; !ok {
		l.n++
	}
	m[name] = wanted
	if l.n > maxInterestLog {
		l.Drop()
	}
}

// Drop drops what the log holds: the next Take says to read the whole
// interest.
func (l *InterestLog) Drop() { *l = InterestLog{all: true} }

// Take returns the changes noted since the last Take and empties the log;
// all is set instead if they were dropped.
func (l *InterestLog) Take() (changes map[string]map[string]bool, all bool) {
	changes, all = l.changes, l.all
	*l = InterestLog{}
	return changes, all
}

// noteLocked records that name (the wildcard: "*") of a type entered or
// left the union of interests, for InterestChanges.
func (c *Cache) noteLocked(typeURL, name string, wanted bool) {
	c.igen++
	if !wanted && name != "*" {
		if e := c.types[typeURL].entryLocked(name); e != nil && e.refIn {
			return // still in the interest: something points at it
		}
	}
	c.ilog.Note(typeURL, name, wanted)
}

// InterestChanges returns how the union of interests changed since the
// last call, by type: name → whether it is wanted now, "*" standing for the
// wildcard. If there were too many changes to keep, all is set instead:
// read Interest. Its cost is that of the changes, not of the interest, so
// that subscribing one name upstream costs the same whatever the group
// already holds.
func (c *Cache) InterestChanges() (changes map[string]map[string]bool, all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ilog.Take()
}

// TypeInterest is Interest for one type.
func (c *Cache) TypeInterest(typeURL string) Interest {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.types[typeURL]
	if t == nil {
		return Interest{}
	}
	return t.interestLocked()
}

func (t *typeState) interestLocked() Interest {
	in := Interest{Wildcard: t.wantWildcard}
	for n, e := range t.entries {
		if e.wanted || e.refIn {
			in.Names = append(in.Names, n)
		}
	}
	slices.Sort(in.Names)
	return in
}

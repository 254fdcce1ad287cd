package cache

import "slices"

// maxInterestLog bounds the interest log: past it, the log is dropped and
// whoever takes it reads the whole interest instead.
const maxInterestLog = 1 << 16

// noteLocked records that name (the wildcard: "*") of a type entered or
// left the union of interests, for InterestChanges.
func (c *Cache) noteLocked(typeURL, name string, wanted bool) {
	c.igen++
	if c.ilogFull {
		return
	}
	if !wanted && name != "*" {
		if e := c.types[typeURL].entryLocked(name); e != nil && e.refIn {
			return // still in the interest: something points at it
		}
	}
	if c.ilog == nil {
		c.ilog = make(map[string]map[string]bool)
	}
	m := c.ilog[typeURL]
	if m == nil {
		m = make(map[string]bool)
		c.ilog[typeURL] = m
	}
	if _, ok := m[name]; !ok {
		c.ilogLen++
	}
	m[name] = wanted
	if c.ilogLen > maxInterestLog {
		c.ilog, c.ilogLen, c.ilogFull = nil, 0, true
	}
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
	changes, all = c.ilog, c.ilogFull
	c.ilog, c.ilogLen, c.ilogFull = nil, 0, false
	return changes, all
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

package cache

import (
	"slices"
	"strings"
	"time"
)

// TypeState is one type's contents, as a warm restart saves and restores
// them.
type TypeState struct {
	TypeURL string
	// Wildcard is set when the wildcard is part of the interest, Synced when
	// upstream had answered it: the resources are then the complete state.
	Wildcard, Synced bool
	Resources        []*Resource // sorted by name
	Absent           []string    // names upstream said do not exist
}

// Export returns the cache's contents by type, sorted by type URL, as
// released to the group, and the cache's generation (see Generation).
func (c *Cache) Export() ([]TypeState, uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]TypeState, 0, len(c.types))
	for typeURL, t := range c.types {
		ts := TypeState{TypeURL: typeURL, Wildcard: t.wantWildcard, Synced: t.synced}
		for n, e := range t.entries {
			// What the group was released (Rollout): a restart does not
			// release what was held; upstream sends it again on resume.
			res, absent := e.res, e.absent
			if e.rel != nil {
				res, absent = e.rel.res, e.rel.absent
			}
			switch {
			case res != nil:
				ts.Resources = append(ts.Resources, res)
			case absent && e.wanted:
				ts.Absent = append(ts.Absent, n)
			}
		}
		if len(ts.Resources) == 0 && len(ts.Absent) == 0 && !ts.Wildcard {
			continue
		}
		slices.SortFunc(ts.Resources, func(a, b *Resource) int { return strings.Compare(a.Name, b.Name) })
		slices.Sort(ts.Absent)
		out = append(out, ts)
	}
	slices.SortFunc(out, func(a, b TypeState) int { return strings.Compare(a.TypeURL, b.TypeURL) })
	return out, c.seq
}

// Generation changes whenever the cache's contents do (each op that
// changes something), or its union of interests: while it stays, what
// Get, Interest and Synced answer stays. A reader that derives something
// from the whole interest (upstream's Client.missing) reads it again only
// once the generation moved.
func (c *Cache) Generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.seq + c.igen
}

// Import fills an empty cache with saved contents. What it restores is held
// as if its last watcher had just left: it stays for the retention period
// unless a client watches it, and is in the interest meanwhile, so that the
// upstream stream resumes with it. What the restore has to tell (names
// refused at MaxNames, as Apply tells them) is told once the locks are let
// go.
func (c *Cache) Import(states []TypeState) {
	c.wakeMu.Lock()
	c.mu.Lock()
	o := c.beginLocked()
	now := c.now()
	for _, ts := range states {
		t := c.typeLocked(ts.TypeURL)
		if ts.Wildcard {
			t.wantWildcard, t.synced, t.wildcardIdle = true, ts.Synced, now
			c.idle.Add(idleKey{typeURL: ts.TypeURL, wildcard: true}, struct{}{})
		}
		for _, n := range ts.Absent {
			e := t.newEntryLocked(n)
			e.absent, e.idle = true, now
			c.wantLocked(t.entries[n], true)
			c.idle.Add(idleKey{typeURL: ts.TypeURL, name: n}, struct{}{})
		}
		for _, r := range ts.Resources {
			if !ts.Wildcard {
				t.newEntryLocked(r.Name).idle = now
				c.wantLocked(t.entries[r.Name], true)
				c.idle.Add(idleKey{typeURL: ts.TypeURL, name: r.Name}, struct{}{})
			}
			c.putLocked(t, ts.TypeURL, r, o)
		}
		o.change(t, ts.TypeURL)
	}
	c.evictLocked(o)
	c.finishLocked(o)
	c.ilog.Drop() // taken whole from Interest
	c.mu.Unlock()
	c.signalInterest()
	o.markAll()
	c.wakeMu.Unlock()
	c.tell(o)
}

// TypeStat is what the cache holds of one type, for metrics.
type TypeStat struct {
	Resources int
	Bytes     int       // of the resources' delta encodings
	Received  time.Time // as View.Received
}

// Stats returns, by type, what the cache holds. It walks every resource:
// for a scrape, not for a request path.
func (c *Cache) Stats() map[string]TypeStat {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]TypeStat, len(c.types))
	for typeURL, t := range c.types {
		st := TypeStat{Received: t.received}
		for _, e := range t.entries {
			if e.res != nil {
				st.Resources++
				st.Bytes += len(e.res.Wire)
			}
		}
		out[typeURL] = st
	}
	return out
}

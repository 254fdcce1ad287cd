package cache

import (
	"slices"
	"strings"
)

// What the admin endpoint reads of a cache to show what it holds: its
// types and their sizes, and the resources clients were sent, by the
// versions their streams recorded (downstream's status records): the
// cache's own resources, no copy.

// TypeSize is one type of a cache: how many resources of it are present
// and its version.
type TypeSize struct {
	TypeURL   string
	Resources int
	Version   uint64
}

// Sizes returns every type the cache holds or wants, sorted by type URL.
// It costs one step per type: the counts are kept as resources come and
// go.
func (c *Cache) Sizes() []TypeSize {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]TypeSize, 0, len(c.types))
	for typeURL, t := range c.types {
		if t.present == 0 && !t.heldLocked() {
			continue
		}
		out = append(out, TypeSize{TypeURL: typeURL, Resources: t.present, Version: t.version})
	}
	slices.SortFunc(out, func(a, b TypeSize) int { return strings.Compare(a.TypeURL, b.TypeURL) })
	return out
}

// AtVersions looks up, for each name of typeURL and the version of it a
// client was sent (names[i] at versions[i]), the resource the cache holds
// at that version: the latest from upstream or, while a release step
// holds that back from all but the canaries (the rollout, the guard), the
// one released to the group. Nil where the cache holds the name at
// neither version: the client holds one the cache has let go, or is
// about to be sent another.
func (c *Cache) AtVersions(typeURL string, names, versions []string) []*Resource {
	out := make([]*Resource, len(names))
	c.mu.RLock()
	defer c.mu.RUnlock()
	t := c.types[typeURL]
	if t == nil {
		return out
	}
	for i, n := range names {
		for _, rel := range []bool{false, true} {
			if r := t.lookupLocked(n, rel).Resource; r != nil && r.Version == versions[i] {
				out[i] = r
				break
			}
		}
	}
	return out
}

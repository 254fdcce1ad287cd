package cache

import "strings"

// xdstpPrefix starts a resource name in the xdstp scheme ("xDS Resource
// Names").
const xdstpPrefix = "xdstp://"

// IsGlob reports whether name is an xdstp glob collection
// (xdstp://AUTH/TYPE/path/*, context parameters allowed after "?"): a
// subscription to every resource of the collection (TP1, "xDS Resource
// Names"). LEDS subscribes this way.
func IsGlob(name string) bool {
	if !strings.HasPrefix(name, xdstpPrefix) {
		return false
	}
	base, _, _ := strings.Cut(name, "?")
	return strings.HasSuffix(base, "/*")
}

// GlobOf is the glob collection an xdstp name belongs to: its last path
// segment replaced by "*", its context parameters kept; "" for a name that
// is not xdstp or has no collection.
func GlobOf(name string) string {
	if !strings.HasPrefix(name, xdstpPrefix) {
		return ""
	}
	base, query, hasQuery := strings.Cut(name, "?")
	i := strings.LastIndexByte(base, '/')
	if i < len(xdstpPrefix) || base[i+1:] == "*" {
		return ""
	}
	glob := base[:i+1] + "*"
	if hasQuery {
		glob += "?" + query
	}
	return glob
}

// newEntryLocked adds the entry of name, counting glob collections.
func (t *typeState) newEntryLocked(name string) *entry {
	if e := t.entries[name]; e != nil {
		return e // made for a reference (refs.go): kept with what points at it
	}
	e := &entry{}
	t.entries[name] = e
	if IsGlob(name) {
		t.globs++
	}
	return e
}

// deleteEntryLocked forgets the entry of name.
func (t *typeState) deleteEntryLocked(name string) {
	if _, ok := t.entries[name]; ok && IsGlob(name) {
		t.globs--
		t.recheck = true // its members are held no more: the next sweep drops them
	}
	delete(t.entries, name)
}

// globLocked is the entry of the glob collection name belongs to, if a
// client wants or watches it: it holds name ("xDS Resource Names": a glob
// subscription is to every resource of the collection). Nil otherwise, and
// at once while the type has no glob (the common case).
func (t *typeState) globLocked(name string) *entry {
	if t.globs == 0 {
		return nil
	}
	g := t.entries[GlobOf(name)]
	if g == nil || (!g.wanted && g.watchers.len() == 0) {
		return nil
	}
	return g
}

// markGlob marks the watchers of name's glob collection with name.
func (o *op) markGlob(t *typeState, typeURL, name string) {
	if g := t.globLocked(name); g != nil {
		o.markWatchers(g, typeURL, name)
	}
}

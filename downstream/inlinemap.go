package downstream

import (
	"iter"
	"maps"
)

// inlineMap is a map by resource name that holds its first entry inline
// and makes a Go map only for a second. A stream holds one name of a type,
// or a few, and a Go map of one entry costs a group of eight: hundreds of
// bytes a stream, for each of the stream's maps. The zero value is empty.
// (cache.NameSet is its cousin for what a change marks: up to four names
// inline, added to and read but never removed from one by one, and kept
// for reuse across marks.)
type inlineMap[V any] struct {
	oneKey string
	one    V
	hasOne bool
	more   map[string]V // the entries other than the inline one
}

func (m *inlineMap[V]) get(key string) (V, bool) {
	if m.hasOne && m.oneKey == key {
		return m.one, true
	}
	v, ok := m.more[key]
	return v, ok
}

// value is the entry of key, the zero value if none.
func (m *inlineMap[V]) value(key string) V {
	v, _ := m.get(key)
	return v
}

func (m *inlineMap[V]) has(key string) bool {
	_, ok := m.get(key)
	return ok
}

func (m *inlineMap[V]) set(key string, v V) {
	switch {
	case m.hasOne && m.oneKey == key:
		m.one = v
	case !m.hasOne:
		if _, ok := m.more[key]; ok {
			m.more[key] = v
			return
		}
		m.oneKey, m.one, m.hasOne = key, v, true
	default:
		if m.more == nil {
			m.more = make(map[string]V)
		}
		m.more[key] = v
	}
}

func (m *inlineMap[V]) remove(key string) {
	if m.hasOne && m.oneKey == key {
		var zero V
		m.oneKey, m.one, m.hasOne = "", zero, false
		return
	}
	delete(m.more, key)
}

func (m *inlineMap[V]) len() int {
	n := len(m.more)
	if m.hasOne {
		n++
	}
	return n
}

// all yields every entry; the yielded entry may be set or removed
// meanwhile.
func (m *inlineMap[V]) all() iter.Seq2[string, V] {
	return func(yield func(string, V) bool) {
		if m.hasOne && !yield(m.oneKey, m.one) {
			return
		}
		for k, v := range m.more {
			if !yield(k, v) {
				return
			}
		}
	}
}

// appendKeys appends the keys, in no particular order, to dst.
func (m *inlineMap[V]) appendKeys(dst []string) []string {
	if m.hasOne {
		dst = append(dst, m.oneKey)
	}
	for k := range m.more {
		dst = append(dst, k)
	}
	return dst
}

// clear removes every entry, keeping the map for the next ones.
func (m *inlineMap[V]) clear() {
	var zero V
	m.oneKey, m.one, m.hasOne = "", zero, false
	clear(m.more)
}

// removeFunc removes the entries for which drop is true.
func (m *inlineMap[V]) removeFunc(drop func(string, V) bool) {
	if m.hasOne && drop(m.oneKey, m.one) {
		m.remove(m.oneKey)
	}
	maps.DeleteFunc(m.more, drop)
}

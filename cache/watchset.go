package cache

import "iter"

// watchSet is the watchers of one name. Most names have one watcher (or
// a few), so the first is held inline and a map is made only for more:
// a name costs no map of its own.
type watchSet struct {
	one  *Watch
	more map[*Watch]struct{}
}

func (s *watchSet) add(w *Watch) {
	switch {
	case s.one == nil || s.one == w:
		s.one = w
	default:
		if s.more == nil {
			s.more = make(map[*Watch]struct{})
		}
		s.more[w] = struct{}{}
	}
}

func (s *watchSet) remove(w *Watch) {
	if s.one == w {
		s.one = nil
		for m := range s.more { // keep one inline
			s.one = m
			delete(s.more, m)
			break
		}
		return
	}
	delete(s.more, w)
}

func (s *watchSet) has(w *Watch) bool {
	if s.one == w {
		return w != nil
	}
	_, ok := s.more[w]
	return ok
}

func (s *watchSet) len() int {
	if s.one == nil {
		return 0
	}
	return 1 + len(s.more)
}

func (s *watchSet) all() iter.Seq[*Watch] {
	return func(yield func(*Watch) bool) {
		if s.one == nil || !yield(s.one) {
			return
		}
		for w := range s.more {
			if !yield(w) {
				return
			}
		}
	}
}

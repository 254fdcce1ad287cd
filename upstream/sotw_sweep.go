package upstream

import (
	"maps"
	"slices"
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// What a state-of-the-world server stopped sending under the wildcard, of a
// type other than Listener and Cluster. A SotW response of such a type is
// not the type's complete state: it is grouped as in the incremental
// protocol ("Grouping Resources into Responses"), and a server may send
// only what changed (go-control-plane's LinearCache does), so absence from
// one says nothing and removes nothing (docs/architecture.md, invariants 16
// and 21). But a new stream asks with no version_info, and the server
// knows nothing the relay holds: it must send every resource it has
// ("Basic Protocol Overview": what changed since the version the client
// indicated), in one response or in several. A name the relay holds of
// the type that no response of the type on the new stream carries within
// cache.retention of the request is not the server's any more, and is
// removed: a removal like any other, through the guard and the
// references' waits (cache release step). Nothing more is inferred while
// the stream lasts; its next stream learns again. cache.retention 0:
// nothing is.

// sweep is what a new stream's wildcard request of a type has not heard
// of yet.
type sweep struct {
	due      time.Time
	left     map[string]struct{} // held when asked, not carried since
	answered bool                // a response of the type arrived
}

// sweeps are a session's sweeps by type, and the timer of the earliest.
// Owned like the session.
type sweeps struct {
	byType map[string]*sweep
	timer  *time.Timer
}

// C fires when the earliest sweep is due; nil (never) with none.
func (w *sweeps) C() <-chan time.Time {
	if w.timer == nil {
		return nil
	}
	return w.timer.C
}

// arm sets the timer for the earliest sweep, if none is set.
func (w *sweeps) arm() {
	if w.timer != nil || len(w.byType) == 0 {
		return
	}
	var due time.Time
	for _, sw := range w.byType {
		if due.IsZero() || sw.due.Before(due) {
			due = sw.due
		}
	}
	w.timer = time.NewTimer(time.Until(due))
}

// stop releases the timer when the stream ends.
func (w *sweeps) stop() {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.byType = nil
}

// cancel drops typeURL's sweep: the wildcard left the stream.
func (w *sweeps) cancel(typeURL string) { delete(w.byType, typeURL) }

// carried notes the names of r, a SotW response of typeURL, as heard of;
// before encode lets its resources go.
func (w *sweeps) carried(typeURL string, r *xds.Received) {
	sw := w.byType[typeURL]
	if sw == nil {
		return
	}
	sw.answered = true
	for i := range r.Resources {
		delete(sw.left, r.Resources[i].Name)
	}
}

// startSweep starts typeURL's sweep, as the stream sends the type's
// wildcard request: every name of the type the cache holds from this
// upstream is to be heard of within cache.retention.
func (s *session) startSweep(typeURL string) {
	retention := s.c.opts.Cache.Retention()
	if s.sotw == nil || xds.FullState(typeURL) || retention <= 0 {
		return
	}
	left := map[string]struct{}{}
	for n := range s.c.opts.Cache.Versions(typeURL) {
		if s.c.owns(typeURL, n) {
			left[n] = struct{}{}
		}
	}
	if len(left) == 0 {
		return
	}
	if s.sweeps.byType == nil {
		s.sweeps.byType = map[string]*sweep{}
	}
	s.sweeps.byType[typeURL] = &sweep{due: time.Now().Add(retention), left: left}
	s.sweeps.arm()
}

// swept removes, of each sweep due by now on a stream that answered its
// type, the names still held that no response carried.
func (s *session) swept(now time.Time) {
	s.sweeps.timer = nil
	for typeURL, sw := range s.sweeps.byType {
		if sw.due.After(now) {
			continue
		}
		delete(s.sweeps.byType, typeURL)
		if sub := s.subs[typeURL]; sw.answered && sub != nil && sub.wildcard {
			s.dropStale(typeURL, slices.Sorted(maps.Keys(sw.left)))
		}
	}
	s.sweeps.arm()
}

// dropStale removes the names of typeURL the cache still holds: the
// server's new stream did not send them.
func (s *session) dropStale(typeURL string, names []string) {
	var gone []string
	for _, l := range s.c.opts.Cache.Get(typeURL, names) {
		if l.Resource != nil {
			gone = append(gone, l.Name)
		}
	}
	if len(gone) == 0 {
		return
	}
	s.c.opts.Cache.Apply(typeURL, cache.Change{Removed: gone})
	s.c.opts.Metrics.StaleRemoved.With(xds.ShortName(typeURL)).Add(int64(len(gone)))
	s.c.log.Info("names a new state-of-the-world stream did not send within cache.retention are removed: the server no longer has them",
		"type", xds.ShortName(typeURL), "names", len(gone), "first", xds.Clip(gone[0]), "server", s.c.servers[s.server].name)
}

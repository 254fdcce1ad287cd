package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Router is several control planes as one Source (gRFC A47 federation, for
// a fleet): each name a group wants goes to the one upstream Routes picks,
// and each group keeps a stream to an upstream only while it wants
// something that upstream serves.
type Router struct {
	// Read-only after NewRouter.
	routes     *Routes
	members    []Source // by route index; 0 is the default
	metrics    *Metrics // the group series, which the relay sets from Status
	unroutable *metrics.Vec
	log        *slog.Logger
	logLimit   *rate.Sometimes // unroutable names are logged at most once a second
}

// NewRouter returns a source that routes names among members, in the
// order of routes (member 0 is the default upstream).
func NewRouter(routes *Routes, members []Source, m *Metrics, reg *metrics.Registry, logger *slog.Logger) (*Router, error) {
	if routes == nil || len(members) != routes.Len() || m == nil {
		return nil, errors.New("upstream: NewRouter needs one source per route, and the upstream metrics")
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Router{
		routes:     routes,
		members:    members,
		metrics:    m,
		unroutable: RouterMetrics(reg),
		log:        logger.With("component", "router"),
		logLimit:   &rate.Sometimes{Interval: time.Second},
	}, nil
}

// RouterMetrics registers the router's family on reg, every type's series
// at 0, and returns it: a relay registers it whatever its upstreams, so
// that it is on /metrics from the start.
func RouterMetrics(reg *metrics.Registry) *metrics.Vec {
	return reg.Counter("xdsrelay_unroutable_names_total",
		"xdstp names clients asked for whose authority no upstream lists: reported as not existing, asked of no control plane.", "type").
		ZeroEach(xds.TypeLabels()...)
}

var (
	_ Source   = (*Router)(nil)
	_ Feed     = (*routedFeed)(nil)
	_ Interest = (*view)(nil)
)

// Feed returns what fills the group's cache from the upstreams.
func (r *Router) Feed(g Group) (Feed, error) {
	f := &routedFeed{r: r, g: g, members: make([]*member, r.routes.Len()), unroutableWanted: map[string]map[string]struct{}{}}
	for i := range f.members {
		f.members[i] = &member{view: newView(), rejections: NewRejections()}
	}
	return f, nil
}

// Run runs every member's shared work until ctx is done.
func (r *Router) Run(ctx context.Context) error {
	errs := make([]error, len(r.members))
	var wg sync.WaitGroup
	for i, m := range r.members {
		wg.Go(func() { errs[i] = m.Run(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close closes every member.
func (r *Router) Close() error {
	var errs []error
	for _, m := range r.members {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// routedFeed is one group's share of the router: it reads the group's
// union of interests, splits it by upstream into views, and runs a member
// feed for each upstream whose view is not empty.
type routedFeed struct {
	// Read-only after Feed.
	r       *Router
	g       Group
	members []*member // by route index

	mu      lockorder.Mutex[routedFeedMu]
	running []*member // guarded by mu; in route order

	// Owned by Run.
	unroutableWanted map[string]map[string]struct{} // type → unroutable names in the interest, reported once
}

// member is one upstream of a group.
type member struct {
	view       *view       // read-only after Feed
	rejections *Rejections // read-only after Feed: the member's inbox, kept while its feed stops and starts

	// Owned by routedFeed.Run; feed is read by Status under routedFeed.mu.
	feed   Feed
	cancel context.CancelFunc
	done   chan struct{}
}

// Rejected gives r to the upstream that serves its name (forward.go);
// an unroutable name has no control plane to tell.
func (f *routedFeed) Rejected(r cache.Rejection) {
	if i := f.r.routes.Of(r.Type, r.Name); i >= 0 && i < len(f.members) {
		f.members[i].rejections.Put(r)
	}
}

// Run splits the group's interest among the upstreams until ctx is done,
// then stops every member feed and waits for it.
func (f *routedFeed) Run(ctx context.Context) {
	defer f.r.metrics.Streams.Delete(f.g.ID)
	defer f.r.metrics.Reconnects.Delete(f.g.ID)
	defer f.stopAll()
	f.dispatch(ctx, nil, true)
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.g.Cache.InterestChanged():
			changes, all := f.g.Cache.InterestChanges()
			f.dispatch(ctx, changes, all)
		}
	}
}

// dispatch gives each view its share of the interest's changes (or of the
// whole interest), reports unroutable names as not existing, and starts or
// stops the member feeds.
func (f *routedFeed) dispatch(ctx context.Context, changes map[string]map[string]bool, all bool) {
	var before map[string]map[string]struct{} // reported before this full read
	if all {
		before, f.unroutableWanted = f.unroutableWanted, map[string]map[string]struct{}{}
		changes = map[string]map[string]bool{}
		for typeURL, in := range f.g.Cache.Interest() {
			m := make(map[string]bool, len(in.Names)+1)
			for _, n := range in.Names {
				m[n] = true
			}
			if in.Wildcard {
				m["*"] = true
			}
			changes[typeURL] = m
		}
		for _, m := range f.members {
			m.view.reset()
		}
	}
	for typeURL, names := range changes {
		var missing []string
		for n, wanted := range names {
			i := f.r.routes.Of(typeURL, n)
			if i == Unroutable {
				if f.noteUnroutable(typeURL, n, wanted, before) {
					missing = append(missing, n)
				}
				continue
			}
			f.members[i].view.note(typeURL, n, wanted)
		}
		if len(missing) > 0 {
			f.unroutable(typeURL, missing)
		}
	}
	for i, m := range f.members {
		m.view.signal()
		switch {
		case m.feed == nil && !m.view.empty():
			f.start(ctx, i)
		case m.feed != nil && m.view.empty():
			f.stop(i)
		}
	}
}

// noteUnroutable records that an unroutable name entered or left the
// interest, and tells whether it is new there: a full read repeats what the
// interest log may hold too, and before is what was reported until then.
func (f *routedFeed) noteUnroutable(typeURL, name string, wanted bool, before map[string]map[string]struct{}) bool {
	names := f.unroutableWanted[typeURL]
	if !wanted {
		delete(names, name)
		return false
	}
	if _, ok := names[name]; ok {
		return false
	}
	if names == nil {
		names = map[string]struct{}{}
		f.unroutableWanted[typeURL] = names
	}
	names[name] = struct{}{}
	_, reported := before[typeURL][name]
	return !reported
}

// unroutable reports xdstp names whose authority no upstream lists as not
// existing, with a NOT_FOUND error (gRFC A88) that says why: delta clients
// get them in removed_resources and the error at once, SotW clients the
// error, and no control plane is asked.
func (f *routedFeed) unroutable(typeURL string, names []string) {
	slices.Sort(names)
	errs := make([]*cache.ResourceError, len(names))
	for i, n := range names {
		auth, _ := xds.Authority(n)
		errs[i] = xds.NewError(n, codes.NotFound, fmt.Sprintf("no upstream of this relay serves the xdstp authority %q", auth))
	}
	f.g.Cache.Apply(typeURL, cache.Change{Removed: names, Errors: errs})
	f.r.unroutable.With(xds.ShortName(typeURL)).Add(int64(len(names)))
	f.r.logLimit.Do(func() {
		f.r.log.Warn("xdstp names whose authority no upstream lists: reported as not existing", "group", f.g.ID,
			"type", xds.ShortName(typeURL), "names", len(names), "first", xds.Clip(names[0]))
	})
}

// start opens member i's feed.
func (f *routedFeed) start(ctx context.Context, i int) {
	m := f.members[i]
	node := f.g.Node
	if i < len(f.g.Nodes) && f.g.Nodes[i] != nil {
		node = f.g.Nodes[i] // that upstream's node.* keys
	}
	feed, err := f.r.members[i].Feed(Group{ID: f.g.ID, Node: node, Cache: f.g.Cache,
		Upstream: f.r.routes.Name(i), Interest: m.view,
		Owns:       func(typeURL, name string) bool { return f.r.routes.Of(typeURL, name) == i },
		Rejections: m.rejections, Prove: f.g.Prove, Fresh: f.g.Fresh})
	if err != nil {
		f.r.log.Error("upstream feed", "upstream", f.r.routes.Name(i), "error", err)
		return
	}
	fctx, cancel := context.WithCancel(ctx)
	m.feed, m.cancel, m.done = feed, cancel, make(chan struct{})
	go func() {
		defer close(m.done)
		feed.Run(fctx)
	}()
	f.mu.Lock()
	f.running = append(f.running, m)
	slices.SortFunc(f.running, func(a, b *member) int {
		return slices.Index(f.members, a) - slices.Index(f.members, b)
	})
	f.mu.Unlock()
	f.r.log.Info("group's stream to upstream opened", "group", f.g.ID, "upstream", f.r.routes.Name(i))
}

// stop closes member i's feed once nothing it serves is wanted (the cache
// kept what was wanted for cache.retention first) and waits for it.
func (f *routedFeed) stop(i int) {
	m := f.members[i]
	m.cancel()
	<-m.done
	f.mu.Lock()
	f.running = slices.DeleteFunc(f.running, func(x *member) bool { return x == m })
	f.mu.Unlock()
	m.feed, m.cancel, m.done = nil, nil, nil
	f.r.log.Info("group's stream to upstream closed: nothing it serves is wanted", "group", f.g.ID,
		"upstream", f.r.routes.Name(i))
}

func (f *routedFeed) stopAll() {
	for i, m := range f.members {
		if m.feed != nil {
			f.stop(i)
		}
	}
}

// Status sums up the upstreams the group has a stream to, and lists them.
func (f *routedFeed) Status() Status {
	// The feeds are collected under mu: stop clears a member's feed once it
	// has left running, so the member's field is not read after unlocking.
	f.mu.Lock()
	feeds := make([]Feed, 0, len(f.running))
	for _, m := range f.running {
		feeds = append(feeds, m.feed)
	}
	f.mu.Unlock()
	s := Status{Connected: len(feeds) > 0}
	var errs []string
	for _, feed := range feeds {
		ms := feed.Status()
		s.Upstreams = append(s.Upstreams, ms)
		s.Connected = s.Connected && ms.Connected
		if ms.LastResponse.After(s.LastResponse) {
			s.LastResponse = ms.LastResponse
		}
		if !ms.Connected && ms.LastError != "" {
			errs = append(errs, ms.Upstream+": "+ms.LastError)
		}
		if ms.Invalid != "" {
			s.Invalid = joinNonEmpty(s.Invalid, ms.Upstream+": "+ms.Invalid)
		}
	}
	for _, e := range errs {
		s.LastError = joinNonEmpty(s.LastError, e)
	}
	return s
}

func joinNonEmpty(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// view is one upstream's share of a group's union of interests: an
// Interest for the upstream's client, kept by the routedFeed.
type view struct {
	wake chan struct{} // capacity 1

	mu       lockorder.Mutex[viewMu]
	wanted   map[string]map[string]struct{} // type → names; guarded by mu
	wildcard map[string]bool                // types whose wildcard is wanted; guarded by mu
	log      cache.InterestLog              // changes since InterestChanges; guarded by mu
	changed  bool                           // something to signal; guarded by mu
	gen      uint64                         // moves with every change of wanted and wildcard; guarded by mu
}

func newView() *view {
	return &view{wake: make(chan struct{}, 1), wanted: map[string]map[string]struct{}{}, wildcard: map[string]bool{}}
}

// reset empties the view before the whole interest is noted again.
func (v *view) reset() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.wanted, v.wildcard = map[string]map[string]struct{}{}, map[string]bool{}
	v.log.Drop()
	v.changed = true
	v.gen++
}

// note records that name ("*": the wildcard) of typeURL entered or left
// the union of interests.
func (v *view) note(typeURL, name string, wanted bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if name == "*" {
		if wanted {
			v.wildcard[typeURL] = true
		} else {
			delete(v.wildcard, typeURL)
		}
	} else {
		names := v.wanted[typeURL]
		if wanted {
			if names == nil {
				names = map[string]struct{}{}
				v.wanted[typeURL] = names
			}
			names[name] = struct{}{}
		} else {
			delete(names, name)
			if len(names) == 0 {
				delete(v.wanted, typeURL)
			}
		}
	}
	v.changed = true
	v.gen++
	v.log.Note(typeURL, name, wanted)
}

// signal wakes the client if something changed since the last signal.
func (v *view) signal() {
	v.mu.Lock()
	changed := v.changed
	v.changed = false
	v.mu.Unlock()
	if changed {
		select {
		case v.wake <- struct{}{}:
		default:
		}
	}
}

func (v *view) empty() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.wanted) == 0 && len(v.wildcard) == 0
}

func (v *view) InterestChanged() <-chan struct{} { return v.wake }

// Generation moves whenever what Interest returns may have changed.
func (v *view) Generation() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.gen
}

func (v *view) InterestChanges() (map[string]map[string]bool, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.log.Take()
}

func (v *view) Interest() map[string]cache.Interest {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[string]cache.Interest{}
	for _, typeURL := range slices.Concat(slices.Collect(maps.Keys(v.wanted)), slices.Collect(maps.Keys(v.wildcard))) {
		out[typeURL] = v.typeLocked(typeURL)
	}
	return out
}

func (v *view) TypeInterest(typeURL string) cache.Interest {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.typeLocked(typeURL)
}

func (v *view) typeLocked(typeURL string) cache.Interest {
	return cache.Interest{Wildcard: v.wildcard[typeURL], Names: slices.Sorted(maps.Keys(v.wanted[typeURL]))}
}

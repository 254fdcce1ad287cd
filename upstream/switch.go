package upstream

import (
	"context"
	"errors"
	"log/slog"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Path is a source a Switch may draw a group from.
type Path struct {
	// Name names the path in logs and status; two paths are the same
	// path when their names are.
	Name   string
	Source Source
	// Node is the node presented on the path; the group's (Group.Node
	// and Nodes) if nil.
	Node *corepb.Node
	// Upstream names the path's upstream in status and metrics (a
	// Group's Upstream); the source's own if empty.
	Upstream string
	// Fresh makes the path's streams subscribe without
	// initial_resource_versions (Group.Fresh): for a server that counts a
	// client as holding only what it sent it.
	Fresh bool
}

// SwitchOptions configure a Switch.
type SwitchOptions struct {
	// Fallback is the path drawn from while the one wanted cannot be
	// reached and the group wants something the cache lacks (gRFC A71's
	// rule); required. Load reports go to it (ServerOf).
	Fallback Path
	// Recheck is how long a new path may take to answer before it is
	// given up, and, while on the fallback, how often the path wanted is
	// tried again; DefaultFallbackRecheck if 0.
	Recheck time.Duration
	// Settle is how long a new path's stream may be up without an answer
	// before it takes over anyway: its server had nothing new to send.
	// Recheck if 0.
	Settle time.Duration
	// OnMove, if set, is called when a path takes over from another (not
	// when the first starts), after the old one has stopped.
	OnMove  func(from, to Path)
	Metrics *Metrics     // required: the group's series are the switch's
	Logger  *slog.Logger // slog.Default() if nil
}

// Switch is one group's feed, drawn from one path at a time, that moves
// between paths make-before-break (docs/architecture.md, invariant 22
// "One fetch per group per fleet"): the path wanted next is opened beside
// the one that serves, each with its own copy of the group's interest,
// and takes over once it has answered (or has been up for Settle with
// nothing to send); then the old one is closed. Both apply to the one
// cache meanwhile: what the new path sends again unchanged is no change
// (cache.Apply compares before it stores), so no client is sent anything
// for the move, and nothing is removed. While the path wanted cannot be
// reached and the group wants something the cache lacks, the fallback
// path is opened, as gRFC A71 falls back between servers, and the path
// wanted is tried again every Recheck. The caller says which path is
// wanted (Want); the switch never asks what a path is.
type Switch struct {
	// Read-only after NewSwitch.
	g    Group
	opts SwitchOptions
	log  *slog.Logger
	want chan struct{} // capacity 1: Want was called

	mu      lockorder.Mutex[switchMu]
	wanted  Path // guarded by mu
	serving *run // guarded by mu; set by Run
	lrs     Feed // guarded by mu: the fallback path's feed for ServerOf while it does not serve; made once

	// Owned by Run.
	candidate *run
	retryAt   time.Time // a candidate for path retryFor is not started before
	retryFor  string
}

// run is one path's feed, running.
type run struct {
	path      Path
	feed      Feed
	view      *view
	cancel    context.CancelFunc
	done      chan struct{}
	started   time.Time
	connected time.Time // when its stream was first seen up; zero until then
}

var _ Feed = (*Switch)(nil)

// NewSwitch returns a switch for g that draws from the fallback path until
// Want names another.
func NewSwitch(g Group, opts SwitchOptions) (*Switch, error) {
	if opts.Fallback.Source == nil || opts.Metrics == nil || g.Cache == nil {
		return nil, errors.New("upstream: NewSwitch needs the group's cache, a fallback path and the metrics")
	}
	if opts.Recheck <= 0 {
		opts.Recheck = DefaultFallbackRecheck
	}
	if opts.Settle <= 0 {
		opts.Settle = opts.Recheck
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if g.Interest == nil {
		g.Interest = g.Cache
	}
	return &Switch{g: g, opts: opts, wanted: opts.Fallback, want: make(chan struct{}, 1),
		log: opts.Logger.With("component", "upstream", "group", xds.Clip(g.ID))}, nil
}

// Want names the path to draw from; it takes over make-before-break. It
// never blocks.
func (s *Switch) Want(p Path) {
	s.mu.Lock()
	s.wanted = p
	s.mu.Unlock()
	select {
	case s.want <- struct{}{}:
	default:
	}
}

// Serving is the path that serves now, and whether it serves as the
// fallback for another that is wanted; false before Run starts one.
func (s *Switch) Serving() (p Path, fallback, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving == nil {
		return Path{}, false, false
	}
	p = s.serving.path
	return p, p.Name == s.opts.Fallback.Name && s.wanted.Name != p.Name, true
}

// Run draws the group from the paths until ctx is done, then stops every
// path's feed and waits for it.
func (s *Switch) Run(ctx context.Context) {
	defer s.opts.Metrics.Streams.Delete(s.g.ID)
	defer s.opts.Metrics.Reconnects.Delete(s.g.ID)
	defer s.stopAll()
	s.settle(ctx)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		var tick <-chan time.Time
		if every := s.watchEvery(); every > 0 {
			t.Reset(every)
			tick = t.C
		}
		select {
		case <-ctx.Done():
			return
		case <-s.g.Interest.InterestChanged():
			changes, all := s.g.Interest.InterestChanges()
			s.dispatch(changes, all)
		case <-s.want:
		case <-tick:
		}
		t.Stop()
		s.settle(ctx)
	}
}

// watchEvery is how soon the switch looks again without an event: soon
// while a path is being opened or the serving one is down, now and then
// while a path other than the fallback serves (it may go down), never
// while the fallback serves what is wanted.
func (s *Switch) watchEvery() time.Duration {
	s.mu.Lock()
	serving, wanted := s.serving, s.wanted
	s.mu.Unlock()
	switch {
	case s.candidate != nil || serving == nil || !s.retryAt.IsZero():
		return 25 * time.Millisecond
	case down(serving):
		return 25 * time.Millisecond
	case serving.path.Name != s.opts.Fallback.Name || wanted.Name != serving.path.Name:
		return 250 * time.Millisecond
	}
	return 0
}

// settle moves the switch one step towards the path it should draw from:
// the first path starts serving; a candidate that is ready takes over; a
// candidate for a path no longer wanted is stopped; one for the target is
// started, and given up after Recheck without an answer.
func (s *Switch) settle(ctx context.Context) {
	now := time.Now()
	s.mu.Lock()
	serving := s.serving
	s.mu.Unlock()
	if serving == nil {
		s.setServing(s.start(ctx, s.target(nil)))
		return
	}
	if c := s.candidate; c != nil && s.ready(c, now) {
		s.takeOver(c, now)
		serving = c
	}
	target := s.target(serving)
	if s.candidate != nil && s.candidate.path.Name != target.Name {
		s.stopRun(s.candidate)
		s.candidate = nil
	}
	switch {
	case serving.path.Name == target.Name:
		s.retryAt, s.retryFor = time.Time{}, ""
	case s.candidate == nil && (target.Name != s.retryFor || !now.Before(s.retryAt)):
		s.candidate = s.start(ctx, target)
	case s.candidate != nil && now.Sub(s.candidate.started) > s.opts.Recheck:
		s.log.Info("a new upstream path did not answer; kept the one that serves, and will try again",
			"path", s.candidate.path.Name, "serving", serving.path.Name, "recheck", s.opts.Recheck)
		s.stopRun(s.candidate)
		s.candidate, s.retryAt, s.retryFor = nil, now.Add(s.opts.Recheck), target.Name
	}
}

// target is the path to draw from: the one wanted, unless it serves, is
// down and the group wants something the cache lacks, when the fallback
// is (gRFC A71).
func (s *Switch) target(serving *run) Path {
	s.mu.Lock()
	wanted := s.wanted
	s.mu.Unlock()
	if serving != nil && serving.path.Name == wanted.Name && wanted.Name != s.opts.Fallback.Name &&
		down(serving) && missing(s.g.Interest, s.g.Cache) {
		return s.opts.Fallback
	}
	return wanted
}

// ready reports whether candidate c may take over: it has answered, or
// its stream has been up for Settle (its server has nothing new).
func (s *Switch) ready(c *run, now time.Time) bool {
	st := c.feed.Status()
	if !st.LastResponse.IsZero() {
		return true
	}
	if !st.Connected {
		c.connected = time.Time{}
		return false
	}
	if c.connected.IsZero() {
		c.connected = now
	}
	return now.Sub(c.connected) >= s.opts.Settle
}

// down reports whether r's stream has failed and is not up again.
func down(r *run) bool {
	st := r.feed.Status()
	return !st.Connected && st.LastError != ""
}

// takeOver makes candidate c the serving path, and stops the old one.
func (s *Switch) takeOver(c *run, now time.Time) {
	s.mu.Lock()
	old, wanted := s.serving, s.wanted
	s.serving = c
	s.mu.Unlock()
	s.candidate = nil
	s.stopRun(old)
	if c.path.Name == s.opts.Fallback.Name && wanted.Name != c.path.Name {
		s.retryAt, s.retryFor = now.Add(s.opts.Recheck), wanted.Name // on the fallback: the wanted path again after Recheck
		s.log.Warn("the upstream path wanted cannot be reached and something wanted is not cached; drawing from the fallback (gRFC A71)",
			"wanted", wanted.Name, "fallback", c.path.Name)
	} else {
		s.log.Info("moved the group to another upstream path, make-before-break", "from", old.path.Name, "to", c.path.Name)
	}
	if s.opts.OnMove != nil {
		s.opts.OnMove(old.path, c.path)
	}
}

func (s *Switch) setServing(r *run) {
	s.mu.Lock()
	s.serving = r
	s.mu.Unlock()
}

// start opens path p's feed with a copy of the whole interest.
func (s *Switch) start(ctx context.Context, p Path) *run {
	v := newView()
	r := &run{path: p, view: v, started: time.Now(), done: make(chan struct{})}
	s.fill(v)
	feed, err := p.Source.Feed(s.group(p, v))
	if err != nil {
		// A source that cannot make a feed is a configuration the relay
		// checked: the path is taken to be down, and never answers.
		s.log.Error("upstream path", "path", p.Name, "error", err)
		feed = failedFeed{why: err.Error()}
	}
	rctx, cancel := context.WithCancel(ctx)
	r.feed, r.cancel = feed, cancel
	go func() {
		defer close(r.done)
		feed.Run(rctx)
	}()
	return r
}

// group is what path p's source is told of the group: its view of the
// interest, the path's node, and every name its own (so that its client
// leaves the group's series to the switch).
func (s *Switch) group(p Path, v *view) Group {
	g := Group{ID: s.g.ID, Node: s.g.Node, Nodes: s.g.Nodes, Cache: s.g.Cache, Interest: v, Prove: true, Fresh: p.Fresh,
		Upstream: p.Upstream, Owns: func(string, string) bool { return true }}
	if p.Node != nil {
		g.Node, g.Nodes = p.Node, nil
	}
	return g
}

// fill notes the whole interest in v.
func (s *Switch) fill(v *view) {
	v.reset()
	for typeURL, in := range s.g.Interest.Interest() {
		for _, n := range in.Names {
			v.note(typeURL, n, true)
		}
		if in.Wildcard {
			v.note(typeURL, "*", true)
		}
	}
	v.signal()
}

// dispatch gives every running path the interest's changes, or the whole
// interest when the log was dropped.
func (s *Switch) dispatch(changes map[string]map[string]bool, all bool) {
	s.mu.Lock()
	runs := []*run{s.serving, s.candidate}
	s.mu.Unlock()
	for _, r := range runs {
		if r == nil {
			continue
		}
		if all {
			s.fill(r.view)
			continue
		}
		for typeURL, names := range changes {
			for n, wanted := range names {
				r.view.note(typeURL, n, wanted)
			}
		}
		r.view.signal()
	}
}

// stopRun stops r's feed and waits for it; nil is stopped.
func (s *Switch) stopRun(r *run) {
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

func (s *Switch) stopAll() {
	s.stopRun(s.candidate)
	s.candidate = nil
	s.mu.Lock()
	serving := s.serving
	s.serving = nil
	s.mu.Unlock()
	s.stopRun(serving)
}

// Status is the serving path's; not connected before one serves.
func (s *Switch) Status() Status {
	s.mu.Lock()
	serving := s.serving
	s.mu.Unlock()
	if serving == nil {
		return Status{}
	}
	return serving.feed.Status()
}

// Rejected gives r to the serving path, which forwards it.
func (s *Switch) Rejected(r cache.Rejection) {
	s.mu.Lock()
	serving := s.serving
	s.mu.Unlock()
	if serving != nil {
		serving.feed.Rejected(r)
	}
}

// serverOf is the fallback path's server: load reports go to it, the
// control plane, whichever path serves the group's resources.
func (s *Switch) serverOf(typeURL string) (Server, bool) {
	return ServerOf(s.lrsFeed(), typeURL)
}

// lrsFeed is the fallback path's feed: the running one if it serves, or
// one made (never run) for its servers.
func (s *Switch) lrsFeed() Feed {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving != nil && s.serving.path.Name == s.opts.Fallback.Name {
		return s.serving.feed
	}
	if s.lrs == nil {
		f, err := s.opts.Fallback.Source.Feed(s.group(s.opts.Fallback, newView()))
		if err != nil {
			return failedFeed{why: err.Error()}
		}
		s.lrs = f
	}
	return s.lrs
}

// failedFeed is a path whose source made no feed: down, for ever.
type failedFeed struct{ why string }

func (f failedFeed) Run(ctx context.Context)  { <-ctx.Done() }
func (f failedFeed) Status() Status           { return Status{LastError: f.why} }
func (failedFeed) Rejected(r cache.Rejection) {}

package upstream

import (
	"context"
	"errors"
	"log/slog"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/xdsrelay/xdsrelay/cache"
)

// Source is where a relay's resources come from: a control plane spoken to
// with delta ADS (NewADS), or a directory of resource files (NewFile). The
// relay holds one and asks it for a Feed per group.
type Source interface {
	// Feed returns what keeps one group's cache filled; the relay runs it
	// until the group ends.
	Feed(g Group) (Feed, error)
	// Run does the work the source shares among its groups (watching the
	// files) until ctx is done.
	Run(ctx context.Context) error
	// Close releases what the source holds (the connection to the control
	// plane), once every feed has ended.
	Close() error
}

// Group is what a source is told of a group of clients.
type Group struct {
	ID    string       // the group id (relay.GroupID), for logs and metrics
	Node  *corepb.Node // the node presented upstream
	Cache *cache.Cache // the group's cache, filled by the feed
	// Nodes, for a Router, is the node presented to each upstream, by its
	// index in the routes; Node where it is nil or too short.
	Nodes []*corepb.Node
	// Set by a Router for one of several upstreams: the upstream's name,
	// its share of the group's interest (the cache's whole interest if
	// nil) and which names are its own (every name if nil).
	Upstream string
	Interest Interest
	Owns     func(typeURL, name string) bool
	// Rejections, set by a Router, is the inbox of the versions clients
	// rejected that are this upstream's to forward (forward.go).
	Rejections *Rejections
	// Prove, set by a Switch, makes each stream's resume leave one cached
	// name of each type out (Options.Prove), so that the server answers
	// and its first answer proves the path.
	Prove bool
	// Fresh, set by a Switch for a path that asks it (Path.Fresh), makes
	// each stream subscribe without initial_resource_versions
	// (Options.Fresh).
	Fresh bool
}

// Feed keeps one group's cache filled.
type Feed interface {
	// Run fills the cache until ctx is done.
	Run(ctx context.Context)
	// Status is what the admin endpoint shows of the feed.
	Status() Status
	// Rejected tells the feed that a first client of the group rejected
	// a version (cache.Options.OnRejected), for its control plane
	// (forward.go); it never blocks. Resource files have no control
	// plane to tell.
	Rejected(r cache.Rejection)
}

var (
	_ Source = (*ADS)(nil)
	_ Source = (*File)(nil)
	_ Feed   = (*Client)(nil)
)

// ADS is a control plane as a source: one delta-ADS stream (a Client) per
// group, all on one connection per server.
type ADS struct {
	opts Options // read-only after NewADS; the group's fields empty
}

// NewADS returns a source that relays the control plane opts describes:
// its servers (each a connection closed by Close) and the settings every
// group's client shares, and its name (Upstream: DefaultUpstream if
// empty). The group's fields of opts (Node, Cache, Group, Interest, Owns)
// are ignored: each Feed takes them from its Group.
func NewADS(opts Options) (*ADS, error) {
	if len(opts.Servers) == 0 && opts.Conn != nil {
		name := ""
		if t, ok := opts.Conn.(interface{ Target() string }); ok {
			name = t.Target()
		}
		opts.Servers, opts.Conn = []Server{{Name: name, Conn: opts.Conn}}, nil
	}
	switch {
	case len(opts.Servers) == 0:
		return nil, errors.New("upstream: Options.Servers (or Conn) is required")
	case opts.Metrics == nil:
		return nil, errors.New("upstream: Options.Metrics is required")
	}
	if opts.Upstream == "" {
		opts.Upstream = DefaultUpstream
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.found = newFound(opts.Protocol, opts.Upstream, opts.Peers, serverNames(opts.Servers), opts.Metrics, opts.Logger.With("component", "upstream"))
	opts.Node, opts.Cache, opts.Group, opts.Interest, opts.Owns, opts.Rejections = nil, nil, "", nil, nil, nil
	return &ADS{opts: opts}, nil
}

// Feed returns the group's delta-ADS client: the source's settings, the
// group's fields from g.
func (a *ADS) Feed(g Group) (Feed, error) {
	o := a.opts
	o.Node, o.Cache, o.Group, o.Interest, o.Owns, o.Rejections = g.Node, g.Cache, g.ID, g.Interest, g.Owns, g.Rejections
	o.Prove, o.Fresh = g.Prove, g.Fresh
	if g.Upstream != "" {
		o.Upstream = g.Upstream
	}
	return New(o)
}

// Run has nothing to share among groups: it waits for ctx.
func (a *ADS) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Close closes the connections to the control plane's servers.
func (a *ADS) Close() error {
	a.opts.found.retire()
	var errs []error
	for _, s := range a.opts.Servers {
		if c, ok := s.Conn.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
		s.Attempts.Release()
	}
	return errors.Join(errs...)
}

// fileFeed is one group's view of the files.
type fileFeed struct {
	f *File
	g Group
}

func (ff fileFeed) Run(ctx context.Context) { ff.f.serve(ctx, ff.g) }

// Rejected has no control plane to tell.
func (fileFeed) Rejected(cache.Rejection) {}
func (ff fileFeed) Status() Status {
	s := ff.f.Status()
	s.Upstream = ff.g.Upstream
	return s
}

// Feed returns what fills the group's cache from the files.
func (f *File) Feed(g Group) (Feed, error) {
	if g.Interest == nil {
		g.Interest = g.Cache
	}
	if g.Owns == nil {
		g.Owns = func(string, string) bool { return true }
	}
	return fileFeed{f: f, g: g}, nil
}

// Close has nothing to release.
func (f *File) Close() error { return nil }

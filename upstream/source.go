package upstream

import (
	"context"
	"errors"
	"log/slog"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

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
	Key   string       // the group key, for logs and metrics
	Node  *corepb.Node // the node presented upstream
	Cache *cache.Cache // the group's cache, filled by the feed
	// Set by a Router for one of several upstreams: the upstream's name,
	// its share of the group's interest (the cache's whole interest if
	// nil) and which names are its own (every name if nil).
	Upstream string
	Interest Interest
	Owns     func(typeURL, name string) bool
}

// Feed keeps one group's cache filled.
type Feed interface {
	// Run fills the cache until ctx is done.
	Run(ctx context.Context)
	// Status is what the admin endpoint shows of the feed.
	Status() Status
}

var (
	_ Source = (*ADS)(nil)
	_ Source = (*File)(nil)
	_ Feed   = (*Client)(nil)
)

// ADSOptions configure an ADS source.
type ADSOptions struct {
	// Servers are the control plane's servers in priority order (gRFC
	// A71), each a connection closed by Close; Conn alone stands for one.
	Servers []Server
	Conn    *grpc.ClientConn // the control plane, if Servers is empty
	Metrics *Metrics         // required
	Logger  *slog.Logger     // slog.Default() if nil
	Backoff backoff.Config   // backoff.DefaultConfig if zero
	// NotFoundTimeout is how long a subscribed name may go unanswered
	// before it is taken not to exist; 0 disables the timer.
	NotFoundTimeout time.Duration
	// ProbeTimeout bounds a probe of a stream's connection (see Options).
	ProbeTimeout time.Duration
	// MaxRequestBytes bounds every request sent upstream (see Options).
	MaxRequestBytes int
	// FallbackRecheck is how often a group on a fallback server tries the
	// higher ones (see Options).
	FallbackRecheck time.Duration
}

// ADS is a control plane as a source: one delta-ADS stream (a Client) per
// group, all on one connection per server.
type ADS struct {
	opts ADSOptions // read-only after NewADS
}

// NewADS returns a source that relays the control plane on opts.Conn.
func NewADS(opts ADSOptions) (*ADS, error) {
	if len(opts.Servers) == 0 && opts.Conn != nil {
		opts.Servers = []Server{{Name: opts.Conn.Target(), Conn: opts.Conn}}
	}
	switch {
	case len(opts.Servers) == 0:
		return nil, errors.New("upstream: ADSOptions.Servers (or Conn) is required")
	case opts.Metrics == nil:
		return nil, errors.New("upstream: ADSOptions.Metrics is required")
	}
	return &ADS{opts: opts}, nil
}

// Feed returns the group's delta-ADS client.
func (a *ADS) Feed(g Group) (Feed, error) {
	return New(Options{
		Servers: a.opts.Servers, Node: g.Node, Cache: g.Cache, Group: g.Key, Upstream: g.Upstream,
		Interest: g.Interest, Owns: g.Owns, Metrics: a.opts.Metrics,
		Logger: a.opts.Logger, Backoff: a.opts.Backoff, NotFoundTimeout: a.opts.NotFoundTimeout, ProbeTimeout: a.opts.ProbeTimeout,
		MaxRequestBytes: a.opts.MaxRequestBytes, FallbackRecheck: a.opts.FallbackRecheck,
	})
}

// Run has nothing to share among groups: it waits for ctx.
func (a *ADS) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Close closes the connections to the control plane's servers.
func (a *ADS) Close() error {
	var errs []error
	for _, s := range a.opts.Servers {
		if c, ok := s.Conn.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// fileFeed is one group's view of the files.
type fileFeed struct {
	f *File
	g Group
}

func (ff fileFeed) Run(ctx context.Context) { ff.f.serve(ctx, ff.g) }
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

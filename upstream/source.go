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
	Conn    *grpc.ClientConn // the control plane; required, closed by Close
	Metrics *Metrics         // required
	Logger  *slog.Logger     // slog.Default() if nil
	Backoff backoff.Config   // backoff.DefaultConfig if zero
	// NotFoundTimeout is how long a subscribed name may go unanswered
	// before it is taken not to exist; 0 disables the timer.
	NotFoundTimeout time.Duration
	// MaxRequestBytes bounds every request sent upstream (see Options).
	MaxRequestBytes int
}

// ADS is a control plane as a source: one delta-ADS stream (a Client) per
// group, all on one connection.
type ADS struct {
	opts ADSOptions // read-only after NewADS
}

// NewADS returns a source that relays the control plane on opts.Conn.
func NewADS(opts ADSOptions) (*ADS, error) {
	switch {
	case opts.Conn == nil:
		return nil, errors.New("upstream: ADSOptions.Conn is required")
	case opts.Metrics == nil:
		return nil, errors.New("upstream: ADSOptions.Metrics is required")
	}
	return &ADS{opts: opts}, nil
}

// Feed returns the group's delta-ADS client.
func (a *ADS) Feed(g Group) (Feed, error) {
	return New(Options{
		Conn: a.opts.Conn, Node: g.Node, Cache: g.Cache, Group: g.Key, Metrics: a.opts.Metrics,
		Logger: a.opts.Logger, Backoff: a.opts.Backoff, NotFoundTimeout: a.opts.NotFoundTimeout,
		MaxRequestBytes: a.opts.MaxRequestBytes,
	})
}

// Run has nothing to share among groups: it waits for ctx.
func (a *ADS) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Close closes the connection to the control plane.
func (a *ADS) Close() error { return a.opts.Conn.Close() }

// fileFeed is one group's view of the files.
type fileFeed struct {
	f *File
	c *cache.Cache
}

func (ff fileFeed) Run(ctx context.Context) { ff.f.Serve(ctx, ff.c) }
func (ff fileFeed) Status() Status          { return ff.f.Status() }

// Feed returns what fills the group's cache from the files.
func (f *File) Feed(g Group) (Feed, error) { return fileFeed{f: f, c: g.Cache}, nil }

// Close has nothing to release.
func (f *File) Close() error { return nil }

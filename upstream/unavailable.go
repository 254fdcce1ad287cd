package upstream

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// reach is what a client knows of its servers since its last stream that
// answered: which failed without answering. Once every one has, the
// control plane is unreachable, and the names the group wants that the
// cache does not hold get UNAVAILABLE (gRFC A88), as does a wildcard it
// has not answered (cache.Change.WildcardUnavailable): clients learn it at once
// instead of waiting for a does-not-exist timer, and since the relay cannot
// know whether such a name exists, it is never a removal
// (docs/architecture.md, invariant 15 "Silence is not an answer"). The
// error clears when the resource arrives.
// Owned by Run.
type reach struct {
	failed []bool // by server
	// refused, by server: what it refused (Client.refusal), if that is
	// how it failed: it answered, and is never said to be unreachable.
	refused []string
	down    bool // every server failed
	// The types whose unanswered wildcard was said unavailable, in c:
	// said reachable again once a stream answers.
	wild []string
	c    *cache.Cache
}

// fail records that server i failed: without answering, or refusing
// what the relay asked (refused); it reports whether every server now
// has.
func (r *reach) fail(i, servers int, refused string) bool {
	if r.failed == nil {
		r.failed, r.refused = make([]bool, servers), make([]string, servers)
	}
	r.failed[i], r.refused[i] = true, refused
	for _, f := range r.failed {
		if !f {
			return false
		}
	}
	r.down = true
	return true
}

// refusing reports whether a server failed by refusing what the relay
// asked: it answered, and is not said to be unreachable.
func (r *reach) refusing() bool {
	return slices.ContainsFunc(r.refused, func(w string) bool { return w != "" })
}

// answered records a stream that answered: the control plane is
// reachable, and the wildcards said unavailable may be answered yet.
func (r *reach) answered() {
	clear(r.failed)
	clear(r.refused)
	r.down = false
	for _, typeURL := range r.wild {
		r.c.WildcardReachable(typeURL)
	}
	r.wild = nil
}

// markUnavailable gives every name the group wants of this upstream that
// the cache neither holds nor knows not to exist an UNAVAILABLE error,
// unless it has one already.
func (c *Client) markUnavailable() {
	msg := c.unusable("this resource")
	down := "control plane unreachable"
	if c.reach.refusing() {
		down = "control plane refuses the relay"
	}
	for typeURL, in := range c.opts.Interest.Interest() {
		if errs := c.giveUnavailable(typeURL, in.Names, msg); len(errs) > 0 {
			c.log.Warn(down+": names not cached are reported UNAVAILABLE to clients", "type", xds.ShortName(typeURL),
				"names", len(errs), "first", xds.Clip(errs[0].Name))
		}
		if in.Wildcard && !c.opts.Cache.Synced(typeURL) && c.opts.Cache.WildcardUnavailable(typeURL) == "" {
			c.opts.Cache.Apply(typeURL, cache.Change{WildcardUnavailable: c.unusable("the complete state of this type")})
			c.reach.wild, c.reach.c = append(c.reach.wild, typeURL), c.opts.Cache
			c.log.Warn(down+": wildcard clients not yet answered are ended with UNAVAILABLE", "type", xds.ShortName(typeURL))
		}
	}
}

// unusable says why no server of the upstream can serve what the relay
// has not cached (what): every one unreachable, in the words clients have
// always had; or, when some refused what the relay asked, what each did
// (never "unreachable" of a server that answered) and that the relay asks
// again after the backoff.
func (c *Client) unusable(what string) string {
	if !c.reach.refusing() {
		return fmt.Sprintf("every server of upstream %q is unreachable, and the relay has not cached %s", c.opts.Upstream, what)
	}
	var each []string
	for i, r := range c.reach.refused {
		if r == "" {
			r = "is unreachable"
		}
		each = append(each, fmt.Sprintf("server %s %s", c.servers[i].name, r))
	}
	return xds.Clip(fmt.Sprintf("no server of upstream %q can serve the relay: %s; the relay asks again after the backoff, and has not cached %s",
		c.opts.Upstream, strings.Join(each, "; "), what))
}

// giveUnavailable gives the names of typeURL that the cache neither holds
// nor knows not to exist an UNAVAILABLE error saying msg (gRFC A88), unless
// they have one; it returns the errors it gave.
func (c *Client) giveUnavailable(typeURL string, names []string, msg string) []*cache.ResourceError {
	var errs []*cache.ResourceError
	for _, l := range c.opts.Cache.Get(typeURL, names) {
		if l.Resource == nil && !l.Absent && (l.Error == nil || l.Error.Code != int32(codes.Unavailable)) {
			errs = append(errs, xds.NewError(l.Name, codes.Unavailable, msg))
		}
	}
	if len(errs) > 0 {
		c.opts.Cache.Apply(typeURL, cache.Change{Errors: errs})
	}
	return errs
}

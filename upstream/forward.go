package upstream

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/hashicorp/golang-lru/v2/simplelru"
	"google.golang.org/genproto/googleapis/rpc/status"
	grpccodes "google.golang.org/grpc/codes"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Forwarded NACKs (docs/architecture.md, "Forwarded NACKs"): when a first
// client of the group rejects a version of a resource (the cache's
// OnRejected), the control plane is told with a NACK of its own response
// on the group's stream, once per version and at most once per type per
// ForwardInterval, so that its NACK counters and status show what its
// clients behind the relay reject. A forwarded NACK rolls nothing back:
// the relay keeps serving what the control plane sent.
//
// What is sent ("ACK/NACK and resource type instance version"): on delta,
// the type's last response nonce and the error; the delta protocol's
// nonce only correlates ("Incremental xDS": it must not be used to
// reject stale requests), and the message and details name the resource
// and version. On SotW, the request the relay last sent for the type
// (its last accepted version_info, the whole name list, the last nonce)
// with the error added: a server that compares versions finds nothing
// new to send, and the names it holds are the same.

// ForwardInterval is the least time between two forwarded NACKs of one
// type on a group's stream; rejections meanwhile are coalesced into the
// next.
const ForwardInterval = 5 * time.Second

// Bounds of what waits to be forwarded.
const (
	maxInbox     = 256  // rejections told and not yet taken by the session loop
	maxQueued    = 16   // per type, waiting for ForwardInterval: coalesced into one request
	maxForwarded = 4096 // versions remembered as forwarded, for once per version
)

// Rejections is an upstream feed's inbox of the versions its group's
// clients rejected first (cache.Options.OnRejected). Put never blocks:
// it is called where a client's answer is counted.
type Rejections struct {
	ready chan struct{} // read-only after NewRejections; capacity 1

	mu      lockorder.Mutex[rejectionsMu]
	list    []cache.Rejection // guarded by mu; at most maxInbox
	dropped map[string]int    // by type, past maxInbox; guarded by mu
}

// NewRejections returns an empty inbox.
func NewRejections() *Rejections {
	return &Rejections{ready: make(chan struct{}, 1)}
}

// Put adds r, or counts it dropped past maxInbox, and wakes the session.
func (in *Rejections) Put(r cache.Rejection) {
	in.mu.Lock()
	if len(in.list) < maxInbox {
		in.list = append(in.list, r)
	} else {
		if in.dropped == nil {
			in.dropped = map[string]int{}
		}
		in.dropped[r.Type]++
	}
	in.mu.Unlock()
	select {
	case in.ready <- struct{}{}:
	default:
	}
}

// take empties the inbox.
func (in *Rejections) take() ([]cache.Rejection, map[string]int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	list, dropped := in.list, in.dropped
	in.list, in.dropped = nil, nil
	return list, dropped
}

type forwardedKey struct{ typeURL, name, version string }

// forwarding is a client's forwarded NACKs; owned by Run.
type forwarding struct {
	in     *Rejections
	seen   *simplelru.LRU[forwardedKey, struct{}] // versions forwarded (or dropped): once each
	queued map[string][]cache.Rejection           // by type, waiting for the interval or a response to NACK
	next   map[string]time.Time                   // by type: when the next may be sent
	timer  *time.Timer                            // fires at the earliest next of a queued type; nil if none
}

func newForwarding(in *Rejections) forwarding {
	if in == nil {
		in = NewRejections()
	}
	seen, _ := simplelru.NewLRU[forwardedKey, struct{}](maxForwarded, nil)
	return forwarding{in: in, seen: seen, queued: map[string][]cache.Rejection{}, next: map[string]time.Time{}}
}

// due is signalled when a queued type may be sent; nil if none waits.
func (f *forwarding) due() <-chan time.Time {
	if f.timer == nil {
		return nil
	}
	return f.timer.C
}

func (f *forwarding) stop() {
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
}

// Rejected tells the client that a first client of its group rejected a
// version (cache.Options.OnRejected); it never blocks.
func (c *Client) Rejected(r cache.Rejection) {
	if c.opts.ForwardNACKs && c.owns(r.Type, r.Name) {
		c.fwd.in.Put(r)
	}
}

// forward takes what the inbox holds and sends each type's queued
// rejections that may go now, as one NACK; a type with no response yet
// on the stream waits for one.
func (s *session) forward(now time.Time) error {
	c := s.c
	f := &c.fwd
	list, dropped := f.in.take()
	if !c.opts.ForwardNACKs {
		return nil // another upstream of the group forwards its own (a Router's member)
	}
	for typeURL, n := range dropped {
		c.opts.Metrics.ForwardedNACKs.With(xds.ShortName(typeURL), "dropped").Add(int64(n))
	}
	for _, r := range list {
		k := forwardedKey{r.Type, r.Name, r.Version}
		if f.seen.Contains(k) {
			continue // once per version
		}
		f.seen.Add(k, struct{}{})
		if len(f.queued[r.Type]) >= maxQueued {
			c.opts.Metrics.ForwardedNACKs.With(xds.ShortName(r.Type), "dropped").Inc()
			continue
		}
		f.queued[r.Type] = append(f.queued[r.Type], r)
	}
	f.stop()
	var earliest time.Time
	for _, typeURL := range slices.Sorted(maps.Keys(f.queued)) {
		if next := f.next[typeURL]; now.Before(next) {
			if earliest.IsZero() || next.Before(earliest) {
				earliest = next
			}
			continue
		}
		sent, err := s.forwardType(typeURL, f.queued[typeURL])
		if err != nil {
			return err
		}
		if sent {
			f.next[typeURL] = now.Add(c.opts.ForwardInterval)
			delete(f.queued, typeURL)
		}
	}
	if !earliest.IsZero() {
		f.timer = time.NewTimer(earliest.Sub(now))
	}
	return nil
}

// forwardType sends one NACK of typeURL for rs; false if the stream has
// no response of the type to NACK yet.
func (s *session) forwardType(typeURL string, rs []cache.Rejection) (bool, error) {
	short := xds.ShortName(typeURL)
	if s.sotw == nil {
		nonce := s.nonces[typeURL]
		if nonce == "" {
			return false, nil
		}
		detail := s.c.rejectedDetail(typeURL, rs)
		if err := s.send(&discoverypb.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: nonce, ErrorDetail: detail}); err != nil {
			return false, err
		}
	} else {
		sub := s.subs[typeURL]
		if sub == nil || !s.sotw.answered(typeURL) {
			return false, nil
		}
		detail := s.c.rejectedDetail(typeURL, rs)
		if err := s.sotw.forward(typeURL, detail, sub.wildcard, sub.sorted()); err != nil {
			return false, err
		}
	}
	s.c.opts.Metrics.ForwardedNACKs.With(short, "sent").Add(int64(len(rs)))
	s.c.log.Info("told the control plane its clients rejected a version", "type", short,
		"resources", len(rs), "first", xds.Clip(rs[0].Name), "version", xds.Clip(rs[0].Version))
	return true, nil
}

// rejectedDetail is the NACK's error_detail for rs: a message that says,
// for each, how many of the clients that were sent the version rejected
// it and the first error (counted now, for a rejection that waited),
// clipped to xds.MaxText; and an ErrorInfo for each in the details.
func (c *Client) rejectedDetail(typeURL string, rs []cache.Rejection) *status.Status {
	short := xds.ShortName(typeURL)
	parts := make([]string, 0, len(rs))
	st := &status.Status{Code: int32(grpccodes.InvalidArgument)}
	for _, r := range rs {
		rejected, clients, msg := 1, max(r.Clients, 1), r.Error
		for _, rc := range c.opts.Cache.Convergence([]string{typeURL}, []string{r.Name}) {
			for _, v := range rc.Versions {
				if v.Version == r.Version && v.Rejected > 0 {
					rejected, clients, msg = v.Rejected, v.Pending+v.Accepted+v.Rejected, v.FirstError
				}
			}
		}
		parts = append(parts, fmt.Sprintf("%d of %d clients rejected %s %s version %s: %s", rejected, clients, short,
			xds.Clip(r.Name), xds.Clip(r.Version), msg))
		// The details name each version for a relay above (a tier), with
		// its bytes' version: the relay above may version it otherwise.
		anyVersion := ""
		if l := c.opts.Cache.Get(typeURL, []string{r.Name}); l[0].Resource != nil && l[0].Resource.Version == r.Version {
			anyVersion = xds.AnyVersion(l[0].Resource.Any)
		}
		info, err := xds.Rejected{Type: typeURL, Name: r.Name, Version: r.Version, Rejected: rejected, Clients: clients,
			Error: msg, AnyVersion: anyVersion}.Detail()
		if err == nil {
			st.Details = append(st.Details, info)
		}
	}
	st.Message = xds.Clip("xdsrelay: " + strings.Join(parts, "; "))
	return st
}

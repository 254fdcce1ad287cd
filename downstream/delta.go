package downstream

import (
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// deltaType is an incremental stream's state for one resource type, the
// protocol's (under the stream's pump's mu).
//
// Its maps by name hold their first entry inline (inlineMap): most streams
// subscribe to one name of a type, or a few.
type deltaType struct {
	names inlineMap[struct{}] // explicitly subscribed names
	// sent is what the client has: name → version, or absent for a name it
	// was told does not exist.
	sent inlineMap[string]
	// answer holds names that need an answer even if the client seems to
	// have them: re-subscribed names, and the wildcard-plus-name exception.
	answer    inlineMap[struct{}]
	errSent   errorsSent // the per-resource errors the client was sent
	wildcard  bool
	responded bool
	all       bool  // the next flush considers everything subscribed
	globs     int32 // xdstp glob collections among names (LEDS)
}

// named reports whether name is subscribed: by its own name or, for a
// member of an xdstp glob collection, by the collection ("xDS Resource
// Names").
func (t *deltaType) named(name string) bool {
	if t.names.has(name) {
		return true
	}
	return t.globs > 0 && t.names.has(cache.GlobOf(name))
}

// forgetAbsent forgets, of the names of lookups, those the client was told
// do not exist and that are not subscribed by name: among the names a
// flush looked at, not the whole record (work per flush is per change).
func (t *deltaType) forgetAbsent(lookups []cache.Lookup) {
	for _, l := range lookups {
		if v, _ := t.sent.get(l.Name); v == absent && !t.named(l.Name) {
			t.sent.remove(l.Name)
		}
	}
}

// deltaStream is an incremental stream. Its fields are guarded as
// streamBase says: ttl is read-only once the stream is open, types the
// protocol's.
type deltaStream struct {
	streamBase
	ttl bool // the client supports TTLs (xds.config.supports-resource-ttl); read-only
	// The protocol's, under the pump's mu: each type's record.
	types byType[deltaType]
}

func (s *Server) serveDelta(st grpc.BidiStreamingServer[discoverypb.DeltaDiscoveryRequest, discoverypb.DeltaDiscoveryResponse], fixed, variant string) error {
	return serve(s, st, fixed, variant, func(c *cache.Cache, first *discoverypb.DeltaDiscoveryRequest, send func(any) error) protocol[discoverypb.DeltaDiscoveryRequest] {
		return &deltaStream{
			streamBase: s.newStreamBase(send, fixed, variant, c, first.GetNode()),
			ttl:        hasFeature(first.GetNode(), featureResourceTTL),
		}
	})
}

func (ds *deltaStream) handle(req *discoverypb.DeltaDiscoveryRequest) error {
	typeURL, short, err := ds.admit(req.GetTypeUrl(), req.GetNode())
	if err != nil {
		return err
	}
	ds.debugRequest(typeURL, len(req.GetResourceNamesSubscribe())+len(req.GetResourceNamesUnsubscribe()), "", req.GetResponseNonce())
	// "Incremental xDS": the nonce pairs an ACK or NACK with a response, but
	// subscription changes are honoured whatever the nonce.
	ds.answered(typeURL, short, req.GetResponseNonce(), "", req.GetErrorDetail())
	t := ds.types.get(typeURL)
	var fresh []string // names this request asks to be answered
	if t == nil {
		// The first request of a type: initial_resource_versions is what
		// the client already has ("Incremental reconnect example"), and an
		// empty subscribe list is the legacy wildcard ("How the client
		// specifies what resources to return").
		t = &deltaType{all: true}
		for n, v := range req.GetInitialResourceVersions() {
			t.sent.set(n, v)
		}
		ds.types.put(typeURL, t)
		ds.asked.add(typeURL)
		if len(req.GetResourceNamesSubscribe()) == 0 {
			ds.subscribeWildcard(typeURL, t)
		}
		if fresh, err = ds.subscribe(typeURL, t, req.GetResourceNamesSubscribe(), true); err != nil {
			return err
		}
	} else if fresh, err = ds.subscribe(typeURL, t, req.GetResourceNamesSubscribe(), false); err != nil {
		return err
	}
	fresh = append(fresh, ds.unsubscribe(typeURL, t, req.GetResourceNamesUnsubscribe())...)
	// Only what this request changed is looked at: a name still waiting
	// for upstream is looked at again when the cache marks it, so a request
	// costs the same whatever the stream already holds.
	if t.all || len(fresh) > 0 {
		ds.watch.Mark(typeURL, 0, fresh...)
	}
	return nil
}

func (ds *deltaStream) subscribeWildcard(typeURL string, t *deltaType) {
	if !t.wildcard {
		t.wildcard, t.all = true, true
		ds.cache.WatchWildcard(ds.watch, typeURL)
		ds.status.setWildcard(typeURL, true)
	}
}

// subscribe adds names. A name subscribed again is answered even if the
// client seems to have it ("Subscribing to Resources": it may have
// forgotten it), except on the first request, where
// initial_resource_versions says what the client has. Names past a limit
// are refused (see watchNames).
func (ds *deltaStream) subscribe(typeURL string, t *deltaType, names []string, first bool) (fresh []string, err error) {
	var added []string
	for _, n := range names {
		if n == "*" {
			ds.subscribeWildcard(typeURL, t)
			continue
		}
		if !t.names.has(n) {
			t.names.set(n, struct{}{})
			added = append(added, n)
			if cache.IsGlob(n) {
				t.globs++
				t.all = true // the collection's members already cached
			}
		}
		if !first {
			t.sent.remove(n)
			t.errSent.forget(n)
			t.answer.set(n, struct{}{})
			fresh = append(fresh, n)
		}
	}
	if len(added) > 0 {
		if err := ds.watchNames(typeURL, added); err != nil {
			return nil, err
		}
		ds.status.subscribed(typeURL, added)
		for _, n := range added {
			t.answer.set(n, struct{}{})
		}
		fresh = append(fresh, added...)
	}
	return fresh, nil
}

// unsubscribe removes names; names the client was not subscribed to are
// ignored ("Unsubscribing from Resources": phantom unsubscriptions). When a
// wildcard subscriber drops a name, it is told whether the wildcard still
// covers it (the exception in "Unsubscribing from Resources").
func (ds *deltaStream) unsubscribe(typeURL string, t *deltaType, names []string) (fresh []string) {
	var removed []string
	for _, n := range names {
		if n == "*" {
			if t.wildcard {
				t.wildcard = false
				ds.cache.UnwatchWildcard(ds.watch, typeURL)
				ds.status.setWildcard(typeURL, false)
				t.sent.removeFunc(func(n, _ string) bool { return !t.names.has(n) })
				t.errSent.forgetUnless(t.named)
			}
			continue
		}
		if !t.names.has(n) {
			continue
		}
		t.names.remove(n)
		t.sent.remove(n)
		t.errSent.forget(n)
		t.answer.remove(n)
		removed = append(removed, n)
		if cache.IsGlob(n) {
			t.globs--
		}
		if t.wildcard {
			t.answer.set(n, struct{}{})
			fresh = append(fresh, n)
		}
	}
	if len(removed) > 0 {
		ds.unwatchNames(typeURL, removed)
		ds.status.unsubscribed(typeURL, removed)
	}
	return fresh
}

// awaitsAnswer is false: an incremental client is told that a name does
// not exist in removed_resources, which every one reads, and is sent the
// other errors (see onlyErrors).
func (ds *deltaStream) awaitsAnswer() bool { return false }

// awaitsWildcard reports whether the stream's one subscription is a
// wildcard of one type: the stream wildcardUnreachable may end.
func (ds *deltaStream) awaitsWildcard() bool {
	t := ds.types.only()
	return t != nil && t.wildcard && t.names.len() == 0
}

// flush sends what changed (see flushAll).
func (ds *deltaStream) flush() error { return ds.flushAll(ds) }

// flushDirty sends what changed of one type; with hold, its removals are
// returned as later (order.go).
func (ds *deltaStream) flushDirty(d *cache.Dirty, hold bool) (later func() error, err error) {
	t := ds.types.get(d.TypeURL)
	if t == nil {
		return nil, nil
	}
	if err := ds.wildcardUnreachable(d.TypeURL, t.wildcard && t.names.len() == 0 && !t.responded); err != nil {
		return nil, err
	}
	return ds.flushType(d.TypeURL, t, &d.Names, heartbeats(d, ds.ttl), hold)
}

// resendEndpoints sends again, of names, the endpoints the stream holds:
// subscribed (by name, collection or wildcard) and sent, not as absent.
func (ds *deltaStream) resendEndpoints(names []string) error {
	t := ds.types.get(resourcev3.EndpointType)
	if t == nil {
		return nil
	}
	held := func(n string) bool { return holding(&t.sent, n, nil).version() && (t.wildcard || t.named(n)) }
	set := heldNames(names, held, t.sent.remove)
	if set.Len() == 0 {
		return nil
	}
	_, err := ds.flushType(resourcev3.EndpointType, t, set, nil, false)
	return err
}

// candidates are the names a flush looks at, and whether it must look at
// every resource of the type too.
func (ds *deltaStream) candidates(t *deltaType, dirty, hbs *cache.NameSet, names []string) ([]string, bool) {
	if t.all {
		names = t.sent.appendKeys(t.names.appendKeys(names))
	}
	names = hbs.AppendTo(dirty.AppendTo(names))
	// A wildcard looks only at what changed, not the whole type per change;
	// a new glob subscription looks at the whole type once.
	return names, (t.wildcard || t.globs > 0) && t.all
}

// flushType sends, of one type, what changed for the client: resources
// new or changed, removals, heartbeats and errors, in one response read
// from one view of the cache. With hold, the removals of what the client
// has are not in it: they are returned as later, a response of their own
// for flushAll to send after the other types' changes (order.go). It is
// one piece on purpose: each name's decision is made in one pass over one
// read, and a change that reaches many streams runs it for each, where a
// second pass would show (BENCHMARKS.md, the flush benchmarks). The
// records the decisions read and move (what was sent, the errors, the
// status, the warming notes) are the flush core's (flushcore.go), as the
// SotW flushes' are.
func (ds *deltaStream) flushType(typeURL string, t *deltaType, dirty, hbs *cache.NameSet, hold bool) (later func() error, err error) {
	// One read: the response is one upstream version, never part of one.
	// A change is of a name or a few: their names and lookups are kept on
	// the stack while they fit.
	var nameBuf [4]string
	var lookupBuf [4]cache.Lookup
	var v cache.View
	if err := ds.readOrdered(typeURL, func() {
		names, all := ds.candidates(t, dirty, hbs, nameBuf[:0])
		v = ds.cache.ReadInto(ds.watch, typeURL, names, all, lookupBuf[:0])
	}); err != nil {
		return nil, err
	}
	synced := v.Synced
	f := ds.flushOf(typeURL, &t.sent, &t.errSent, false, v.Received)
	var out [][]byte
	var removed, gone []string // gone: removals held back
	for _, l := range v.Lookups {
		fresh, h := f.look(&l)
		l.Absent = l.Absent || l.Name == noName // known not to exist
		named := t.named(l.Name)
		mustAnswer := t.answer.has(l.Name)
		switch {
		case !named && !t.wildcard && !mustAnswer:
			// Not (or no longer) subscribed.
		case fresh:
			out = append(out, ds.field(l.Resource))
			f.sendResource(l.Resource, h)
		case l.Resource != nil:
			if hbs.Has(l.Name) && l.Heartbeat != nil {
				// "TTL": the heartbeat refreshes the client's TTL.
				out = append(out, l.Heartbeat.Wire)
			}
		case h.version() && (l.Absent || t.wildcard && synced || !named):
			// Removed upstream, or gone from the wildcard set.
			if hold {
				gone = append(gone, l.Name)
			} else {
				removed = append(removed, l.Name)
			}
			f.absent(l.Name)
		case h == holdsNothing && named && l.Absent:
			// "Knowing When a Requested Resource Does Not Exist".
			removed = append(removed, l.Name)
			f.absent(l.Name)
		case mustAnswer && !named && h == holdsNothing:
			// Dropped by name and not covered by the wildcard.
			removed = append(removed, l.Name)
		}
		if named || t.wildcard {
			f.keepError(&l)
		}
		if l.Resource != nil || l.Absent || !named {
			t.answer.remove(l.Name)
		}
	}
	f.done()
	t.forgetAbsent(v.Lookups)
	// A wildcard's first answer, even empty, once upstream answered; not
	// empty while a resource of the type waits for what it points at
	// (docs/architecture.md, invariant 18), which would say there is
	// nothing and send the resource right after: its release marks the
	// stream.
	first := !t.responded && t.wildcard && synced && !v.Held
	// Until the wildcard is synced, what the client has cannot be compared
	// with the complete set: look at everything again next time.
	t.all = t.wildcard && !synced
	later = ds.holdRemovals(typeURL, &v, gone)
	if len(out) == 0 && len(removed) == 0 && len(f.errs) == 0 && !first {
		return later, nil
	}
	return later, ds.respond(typeURL, t, &v, f.withErrors(out, true), removed)
}

// respond sends one response of typeURL at v's version: out, the
// resources and errors it carries, and the names removed, as an
// incremental response frames them (system_version_info, type_url, nonce).
func (ds *deltaStream) respond(typeURL string, t *deltaType, v *cache.View, out [][]byte, removed []string) error {
	t.responded = true
	nonce := ds.nonces.next()
	return ds.sendResponse(xds.DeltaFields(v.Version, typeURL, nonce, out, removed), typeURL, nonce, v, len(out), len(removed))
}

// field is how this client is sent a resource: with its TTL only if the
// client supports TTLs ("TTL").
func (ds *deltaStream) field(r *cache.Resource) []byte {
	if !ds.ttl && r.WireNoTTL != nil {
		return r.WireNoTTL
	}
	return r.Wire
}

package downstream

import (
	"slices"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// sotwType is a SotW stream's state for one resource type. Its maps by
// name hold their first entry inline (inlineMap): most streams subscribe to
// one name of a type, or a few.
type sotwType struct {
	names    inlineMap[struct{}] // explicitly subscribed names
	wildcard bool
	// explicit is set once a request named resources: from then on an
	// empty resource_names is not the legacy wildcard.
	explicit bool
	nonce    string            // of the last response
	sent     inlineMap[string] // name → version the client was sent, unless sentState holds it
	// sentState is the shared complete state last sent to a wildcard-only
	// subscription, which then keeps no per-name record (sent is stale).
	sentState *cache.State
	responded bool
	all       bool                            // the next flush considers every subscribed name
	errSent   map[string]*cache.ResourceError // upstream errors passed on
}

// subscription applies the SotW rules of "How the client specifies what
// resources to return" to a request's resource_names: an empty list before
// any name was ever given is the legacy wildcard; "*" is the wildcard.
func (t *sotwType) subscription(names []string) (wildcard bool, named inlineMap[struct{}]) {
	if !t.explicit && len(names) == 0 {
		return true, named
	}
	t.explicit = true
	named = set(names)
	wildcard = named.has("*")
	named.remove("*")
	return wildcard, named
}

// nothing reports whether the subscription names only noName, which never
// exists: it is answered at once with no resources, as go-control-plane
// answers a first request, and the client knows it holds nothing.
func (t *sotwType) nothing() bool {
	return t.names.has(noName) && t.names.len() == 1 && !t.wildcard
}

type sotwStream struct {
	streamBase
	types byType[sotwType]
	// ttl is set for clients that take resources wrapped in a Resource
	// with their TTL: both xds.config.supports-resource-in-sotw and
	// xds.config.supports-resource-ttl ("TTL").
	ttl bool
}

func (s *Server) serveSotW(st grpc.BidiStreamingServer[discoverypb.DiscoveryRequest, discoverypb.DiscoveryResponse], fixed, variant string) error {
	return serve(s, st, fixed, variant, func(c *cache.Cache, first *discoverypb.DiscoveryRequest, send func(any) error) protocol[discoverypb.DiscoveryRequest] {
		return &sotwStream{
			streamBase: s.newStreamBase(send, fixed, variant, c, first.GetNode()),
			ttl:        hasFeature(first.GetNode(), featureResourceInSotW) && hasFeature(first.GetNode(), featureResourceTTL),
		}
	})
}

func (ss *sotwStream) handle(req *discoverypb.DiscoveryRequest) error {
	typeURL, short, err := ss.admit(req.GetTypeUrl(), req.GetNode())
	if err != nil {
		return err
	}
	ss.debugRequest(typeURL, len(req.GetResourceNames()), req.GetVersionInfo(), req.GetResponseNonce())
	t := ss.types.get(typeURL)
	if t == nil {
		t = &sotwType{}
		ss.types.put(typeURL, t)
	}
	// "EDS update race motivates nonces": a request carrying a nonce older
	// than the last response of its type is stale and not answered.
	if t.nonce != "" && req.GetResponseNonce() != t.nonce {
		return nil
	}
	// "ACK/NACK and resource type instance version": error_detail is a NACK.
	// What was NACKed stays recorded as sent, so it is not sent again; the
	// next change is.
	ss.answered(typeURL, short, req.GetResponseNonce(), req.GetVersionInfo(), req.GetErrorDetail())
	return ss.resubscribe(typeURL, t, req.GetResourceNames())
}

// resubscribe moves the type's subscription to what the request names and
// schedules an answer for what it newly asks for: "the server must resend
// any newly requested resources, even if it previously sent those
// resources ... and the resources have not changed". Names past a limit
// are refused (see watchNames).
func (ss *sotwStream) resubscribe(typeURL string, t *sotwType, names []string) error {
	t.materialize()
	wildcard, named := t.subscription(names)
	added, removed := diff(&t.names, &named), diff(&named, &t.names)
	if len(removed) > 0 {
		ss.unwatchNames(typeURL, removed)
		ss.status.unsubscribed(typeURL, removed)
		for _, n := range removed {
			t.sent.remove(n)
		}
	}
	if len(added) > 0 {
		if err := ss.watchNames(typeURL, added); err != nil {
			return err
		}
		ss.status.subscribed(typeURL, watchable(added))
		for _, n := range added {
			t.sent.remove(n)
		}
	}
	switch {
	case wildcard && !t.wildcard:
		ss.cache.WatchWildcard(ss.watch, typeURL)
		t.all = true
		t.sent.clear()
	case !wildcard && t.wildcard:
		ss.cache.UnwatchWildcard(ss.watch, typeURL)
		t.sent.removeFunc(func(n, _ string) bool { return !named.has(n) })
	}
	if wildcard != t.wildcard {
		ss.status.setWildcard(typeURL, wildcard)
	}
	t.names, t.wildcard = named, wildcard
	if t.all || len(added) > 0 {
		ss.watch.Mark(typeURL, 0, added...)
	}
	return nil
}

// flush sends what changed, type by type in the order upstream sent it.
func (ss *sotwStream) flush() error {
	dirty := ss.watch.Take()
	defer ss.watch.Recycle(dirty)
	for _, d := range ordered(dirty) {
		typeURL := d.TypeURL
		t := ss.types.get(typeURL)
		if t == nil {
			continue
		}
		var err error
		hbs := &d.Heartbeats
		if !ss.ttl {
			hbs = nil // heartbeats only refresh TTLs, which this client ignores
		}
		if xds.FullState(typeURL) {
			err = ss.flushFull(typeURL, t, hbs)
		} else {
			err = ss.flushChanged(typeURL, t, &d.Names, hbs)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// flushFull sends the complete state of a Listener or Cluster subscription
// when any part of it differs from what the client has ("Grouping Resources
// into Responses": omission means deletion).
//
// A heartbeat of a resource the client has goes out as the complete state
// with that resource as a heartbeat, so that the response still omits
// nothing ("TTL").
func (ss *sotwStream) flushFull(typeURL string, t *sotwType, hbs *cache.NameSet) error {
	t.all = false
	if t.wildcard && t.names.len() == 0 && !ss.ttl {
		return ss.flushWildcard(typeURL, t)
	}
	t.materialize()
	// One read: the response is one upstream version, never part of one.
	v := ss.cache.ReadFor(ss.watch, typeURL, t.names.appendKeys(nil), t.wildcard)
	want := slices.DeleteFunc(v.Lookups, func(l cache.Lookup) bool { return l.Resource == nil })
	// A wildcard's full state waits for upstream's complete state.
	ready := v.Synced || len(want) > 0 || t.nothing()
	if t.wildcard {
		ready = v.Synced
	}
	if !t.responded && !ready {
		return nil
	}
	changed := !t.responded || len(want) != t.sent.len()
	beat := false
	for _, l := range want {
		if v, ok := t.sent.get(l.Name); !ok || v != l.Resource.Version {
			changed = true
		} else if hbs.Has(l.Name) && l.Heartbeat != nil {
			beat = true
		}
	}
	if !changed && !beat {
		return nil
	}
	t.sent.clear()
	fields := make([][]byte, 0, len(want))
	ts, nonce, now := ss.status.sending(typeURL, true), ss.nonces.peek(), time.Now()
	for _, l := range want {
		t.sent.set(l.Name, l.Resource.Version)
		ts.sent(l.Name, l.Resource.Version, nonce, now)
		fields = append(fields, ss.field(l, hbs.Has(l.Name) && !changed))
	}
	ss.status.done()
	return ss.respond(typeURL, v, t, fields)
}

// field is how this client is sent a resource: wrapped in a Resource with
// its TTL for clients that take TTLs in SotW ("TTL"), as a heartbeat if
// heartbeat, or as the plain Any.
func (ss *sotwStream) field(l cache.Lookup, heartbeat bool) []byte {
	switch {
	case heartbeat && l.Heartbeat != nil:
		return l.Heartbeat.SotW
	case ss.ttl && l.Resource.SotWWrapped != nil:
		return l.Resource.SotWWrapped
	}
	return l.Resource.Any
}

// flushWildcard is flushFull for a wildcard-only subscription, the common
// case of Envoy's LDS and CDS: the complete state is built once per version
// and shared by every such client, so this costs a comparison and a write.
func (ss *sotwStream) flushWildcard(typeURL string, t *sotwType) error {
	st := ss.cache.StateFor(ss.watch, typeURL)
	if !t.responded && !st.Synced {
		return nil
	}
	if t.sentState != nil && t.sentState.Version == st.Version && t.responded {
		return nil
	}
	t.sentState = st
	t.nonce = ss.nonces.next()
	t.responded = true
	ss.status.sentShared(typeURL, st, ss.nonces.peek()-1, time.Now())
	msg := xds.SotWFullState(st.Version, typeURL, t.nonce, st.SotW)
	if err := ss.send(msg); err != nil {
		return err
	}
	ss.sentAs(typeURL, t.nonce, st.Version)
	ss.debugResponse(typeURL, st.Version, t.nonce, len(st.Resources), 0)
	ss.tracePush(st.Trace, typeURL, st.Version, len(st.Resources))
	ss.srv.pushed(typeURL, msg.Size(), st.Received, ss.opened)
	return nil
}

// materialize turns a shared sent state back into the per-name record.
func (t *sotwType) materialize() {
	if t.sentState == nil {
		return
	}
	t.sent.clear()
	for _, r := range t.sentState.Resources {
		t.sent.set(r.Name, r.Version)
	}
	t.sentState = nil
}

// flushChanged sends, for the other types, only the subscribed resources
// whose version differs from what the client was sent.
func (ss *sotwStream) flushChanged(typeURL string, t *sotwType, dirty, hbs *cache.NameSet) error {
	// As the delta flush's: a change's few names and lookups on the stack.
	var nameBuf [4]string
	var lookupBuf [4]cache.Lookup
	names := nameBuf[:0]
	all := false
	if t.all {
		names = t.names.appendKeys(names)
		all, t.all = t.wildcard, false
	}
	for _, set := range []*cache.NameSet{dirty, hbs} {
		for n := range set.All() {
			if t.names.has(n) || t.wildcard {
				names = append(names, n)
			}
		}
	}
	// One read: the response is one upstream version, never part of one.
	v := ss.cache.ReadInto(ss.watch, typeURL, names, all, lookupBuf[:0])
	t.all = all && !v.Synced
	var out [][]byte
	ts, nonce, now := ss.status.sending(typeURL, false), ss.nonces.peek(), time.Now()
	for _, l := range v.Lookups {
		hb := hbs.Has(l.Name)
		switch {
		case l.Resource != nil && t.sent.value(l.Name) != l.Resource.Version:
			out = append(out, ss.field(l, false))
			t.sent.set(l.Name, l.Resource.Version)
			ts.sent(l.Name, l.Resource.Version, nonce, now)
		case l.Resource != nil && hb && l.Heartbeat != nil:
			out = append(out, ss.field(l, true))
		case l.Resource == nil:
			t.sent.remove(l.Name)
			ts.forget(l.Name)
		}
		if l.Error != nil && t.errSent[l.Name] != l.Error {
			if t.errSent == nil {
				t.errSent = make(map[string]*cache.ResourceError)
			}
			t.errSent[l.Name] = l.Error
			out = append(out, l.Error.SotW)
		}
	}
	ss.status.done()
	if len(out) == 0 && (t.responded || !t.nothing()) {
		return nil
	}
	return ss.respond(typeURL, v, t, out)
}

func (ss *sotwStream) respond(typeURL string, v cache.View, t *sotwType, fields [][]byte) error {
	t.nonce = ss.nonces.next()
	t.responded = true
	msg := xds.SotWFields(v.Version, typeURL, t.nonce, fields)
	if err := ss.send(msg); err != nil {
		return err
	}
	ss.sentAs(typeURL, t.nonce, v.Version)
	ss.debugResponse(typeURL, v.Version, t.nonce, len(fields), 0)
	ss.tracePush(v.Trace, typeURL, v.Version, len(fields))
	ss.srv.pushed(typeURL, msg.Size(), v.Received, ss.opened)
	return nil
}

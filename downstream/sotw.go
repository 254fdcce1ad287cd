package downstream

import (
	"slices"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// sotwType is a SotW stream's state for one resource type, the protocol's
// (under the stream's pump's mu). Its maps by name hold their first entry
// inline (inlineMap): most streams subscribe to one name of a type, or a
// few.
type sotwType struct {
	// names are the explicitly subscribed names, each with the stamp of
	// the last request that named it again unchanged (see unchanged).
	names    inlineMap[uint32]
	stamp    uint32 // of the last request unchanged looked at
	wildcard bool
	// explicit is set once a request named resources: from then on an
	// empty resource_names is not the legacy wildcard.
	explicit  bool
	responded bool
	all       bool   // the next flush considers every subscribed name
	nonce     string // of the last response
	// asked is the nonce of the last request that answered a response
	// without a NACK: a request with that nonce again, the same names and
	// no error repeats it (see repeated).
	asked string
	sent  inlineMap[string] // name → version the client was sent, unless sentState holds it
	// sentState is the shared complete state last sent to a wildcard-only
	// subscription, which then keeps no per-name record (sent is stale).
	sentState *cache.State
	errSent   errorsSent // the per-resource errors the client was sent
	// Invariant 21 (held.go): until a state of the type is sent, the names
	// of its first request, which the client may hold; nil otherwise.
	first *firstNames
}

// subscription applies the SotW rules of "How the client specifies what
// resources to return" to a request's resource_names: an empty list before
// any name was ever given is the legacy wildcard; "*" is the wildcard.
func (t *sotwType) subscription(names []string) (wildcard bool, named inlineMap[uint32]) {
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

// sotwStream is a SotW stream. Its fields are guarded as streamBase says:
// ttl is read-only once the stream is open, types the protocol's.
type sotwStream struct {
	streamBase
	// ttl is set for clients that take resources wrapped in a Resource
	// with their TTL: both xds.config.supports-resource-in-sotw and
	// xds.config.supports-resource-ttl ("TTL"). Read-only.
	ttl bool
	// The protocol's, under the pump's mu: each type's record.
	types byType[sotwType]
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
	first := t == nil
	if first {
		t = &sotwType{}
		ss.types.put(typeURL, t)
		ss.asked.add(typeURL)
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
	nonce, ack := req.GetResponseNonce(), req.GetResponseNonce() != "" && req.GetErrorDetail() == nil
	repeat := ack && nonce == t.asked
	if ack {
		t.asked = nonce
	}
	same := !first && t.unchanged(req.GetResourceNames())
	if !same {
		same, err = ss.resubscribe(typeURL, t, req.GetResourceNames())
	}
	if first && err == nil {
		ss.expect(typeURL, t, req.GetVersionInfo())
	}
	if err != nil || !repeat || !same {
		return err
	}
	return ss.repeated(typeURL, t)
}

// repeated answers a request that repeats the last one: the same nonce,
// names and no error. Envoy sends one on its SotW EDS subscription after
// every Cluster update, to be sent the endpoints that finish the Cluster's
// warming ("Resource warming"): they are sent again, unchanged, unless the
// relay warms the stream itself (warming.go) and so sends exactly those
// the Clusters need. Other clients do not repeat a request, and a repeat
// of another type is not answered ("When to send an update").
func (ss *sotwStream) repeated(typeURL string, t *sotwType) error {
	if typeURL != resourcev3.EndpointType || ss.warmsItself() {
		return nil
	}
	names := t.sent.appendKeys(nil)
	for _, n := range names {
		t.sent.remove(n)
	}
	ss.watch.Mark(typeURL, 0, names...)
	return nil
}

// unchanged reports whether names, a request's resource_names, is the
// subscription as it stands: what an ACK names. It looks each name up
// once and allocates nothing, so that an ACK costs no map built and
// compared (resubscribe), and a wildcard's shared sent state stays shared
// (materialize). A name given twice counts as a change, which resubscribe
// sorts out, as does a request while the next flush is to look at every
// name (all), which resubscribe marks.
func (t *sotwType) unchanged(names []string) bool {
	if t.all {
		return false
	}
	if !t.explicit { // the legacy wildcard again, or a first name
		return len(names) == 0 && t.wildcard
	}
	want := t.names.len()
	if t.wildcard {
		want++
	}
	if len(names) != want {
		return false
	}
	// Each name is stamped as it is seen: a stamp already this request's
	// is a name given twice, so that len(names) names cannot cover the
	// subscription. A stamp that wrapped around only sends a request to
	// resubscribe.
	t.stamp++
	star := false
	for _, n := range names {
		if n == "*" {
			if star || !t.wildcard {
				return false
			}
			star = true
			continue
		}
		s, ok := t.names.get(n)
		if !ok || s == t.stamp {
			return false
		}
		t.names.set(n, t.stamp)
	}
	return true
}

// resubscribe moves the type's subscription to what the request names and
// schedules an answer for what it newly asks for: "the server must resend
// any newly requested resources, even if it previously sent those
// resources ... and the resources have not changed". Names past a limit
// are refused (see watchNames). same reports that the subscription did not
// change.
func (ss *sotwStream) resubscribe(typeURL string, t *sotwType, names []string) (same bool, err error) {
	t.materialize()
	wildcard, named := t.subscription(names)
	added, removed := diff(&t.names, &named), diff(&named, &t.names)
	if len(removed) > 0 {
		ss.unwatchNames(typeURL, removed)
		ss.status.unsubscribed(typeURL, removed)
		for _, n := range removed {
			t.sent.remove(n)
			t.errSent.forget(n)
			ss.unexpect(t, n)
		}
	}
	if len(added) > 0 {
		if err := ss.watchNames(typeURL, added); err != nil {
			return false, err
		}
		ss.status.subscribed(typeURL, watchable(added))
		for _, n := range added {
			t.sent.remove(n)
			t.errSent.forget(n)
		}
	}
	switch {
	case wildcard && !t.wildcard:
		ss.cache.WatchWildcard(ss.watch, typeURL)
		t.all = true
		t.sent.clear()
		clear(t.errSent)
	case !wildcard && t.wildcard:
		ss.cache.UnwatchWildcard(ss.watch, typeURL)
		t.sent.removeFunc(func(n, _ string) bool { return !named.has(n) })
		t.errSent.forgetUnless(named.has)
	}
	same = len(added) == 0 && len(removed) == 0 && wildcard == t.wildcard
	if wildcard != t.wildcard {
		ss.status.setWildcard(typeURL, wildcard)
	}
	t.names, t.wildcard = named, wildcard
	if t.all || len(added) > 0 {
		ss.watch.Mark(typeURL, 0, added...)
	}
	return same, nil
}

// awaitsAnswer reports whether the stream names resources of one type and
// nothing else (see protocol): the one stream whose first answer of errors
// alone ends it (see onlyErrors).
func (ss *sotwStream) awaitsAnswer() bool {
	t := ss.types.only()
	return t != nil && !t.wildcard && t.names.len() > 0
}

// errorsWait reports whether errs, about to be a first answer of errors
// alone, wait instead for the resources they are to go out with: until a
// stream has been answered, errors alone are its answer only when every
// name it asked for has an error. A name still coming keeps the stream
// open (an end would fail it too: gRFC A57), and the next flush of the
// type considers every name, so that the errors go out with it.
func (ss *sotwStream) errorsWait(typeURL string, t *sotwType, errs []*cache.ResourceError) bool {
	if ss.spoke || len(errs) == 0 {
		return false
	}
	v := ss.cache.ReadFor(ss.watch, typeURL, t.names.appendKeys(nil), false)
	for _, l := range v.Lookups {
		ss.refusedError(&l)
		if l.Error == nil {
			t.all = true
			return true
		}
	}
	return false
}

// awaitsWildcard reports whether the stream's one subscription is a
// wildcard of one type: the stream wildcardUnreachable may end.
func (ss *sotwStream) awaitsWildcard() bool {
	t := ss.types.only()
	return t != nil && t.wildcard && t.names.len() == 0
}

// flush sends what changed (see flushAll).
func (ss *sotwStream) flush() error { return ss.flushAll(ss) }

// flushDirty sends what changed of one type: a Listener or Cluster
// subscription's complete state, the changed resources of another type.
// With hold, a complete state that only removes is returned as later
// (order.go).
func (ss *sotwStream) flushDirty(d *cache.Dirty, hold bool) (later func() error, err error) {
	t := ss.types.get(d.TypeURL)
	if t == nil {
		return nil, nil
	}
	if err := ss.wildcardUnreachable(d.TypeURL, t.wildcard && t.names.len() == 0 && !t.responded); err != nil {
		return nil, err
	}
	hbs := heartbeats(d, ss.ttl)
	if xds.FullState(d.TypeURL) {
		return ss.flushFull(d.TypeURL, t, hbs, hold)
	}
	return nil, ss.flushChanged(d.TypeURL, t, &d.Names, hbs)
}

// resendEndpoints sends again, of names, the endpoints the stream holds:
// those its EDS subscription names (or the wildcard covers) and that it
// was sent.
func (ss *sotwStream) resendEndpoints(names []string) error {
	t := ss.types.get(resourcev3.EndpointType)
	if t == nil {
		return nil
	}
	held := func(n string) bool { return holding(&t.sent, n, nil).version() && (t.wildcard || t.names.has(n)) }
	set := heldNames(names, held, t.sent.remove)
	if set.Len() == 0 {
		return nil
	}
	return ss.flushChanged(resourcev3.EndpointType, t, set, nil)
}

// warmsItself reports whether the relay sends this stream's endpoints
// after the Clusters they warm: on ADS that carries Clusters, and on a
// per-type EDS stream whose connection has a CDS stream.
func (ss *sotwStream) warmsItself() bool {
	switch ss.fixed {
	case "":
		return ss.types.get(resourcev3.ClusterType) != nil
	case resourcev3.EndpointType:
		return ss.conn.hasCDS()
	}
	return false
}

// holdsEndpoints reports whether a Cluster sent on the stream may have
// endpoints to warm: on ADS, the stream holds some; on a per-type CDS
// stream, its connection has an EDS stream.
func (ss *sotwStream) holdsEndpoints() bool {
	switch ss.fixed {
	case "":
		t := ss.types.get(resourcev3.EndpointType)
		return t != nil && t.sent.len() > 0
	case resourcev3.ClusterType:
		return ss.conn.hasEDS()
	}
	return false
}

// asksHeldTypes reports whether the stream has asked for a type that a new
// Cluster's warming holds back (heldByWarming: Listeners, Routes): without
// one there is nothing to hold, and a wildcard client of Clusters alone
// is not walked for new Clusters at every send of the shared state.
func (ss *sotwStream) asksHeldTypes() bool { return ss.asked&heldTypes != 0 }

// flushFull sends the complete state of a Listener or Cluster subscription
// when any part of it differs from what the client has ("Grouping Resources
// into Responses": omission means deletion).
//
// A heartbeat of a resource the client has goes out as the complete state
// with that resource as a heartbeat, so that the response still omits
// nothing ("TTL"). With hold, a state that only removes is returned as
// later, for flushAll to send after the other types (order.go).
func (ss *sotwStream) flushFull(typeURL string, t *sotwType, hbs *cache.NameSet, hold bool) (later func() error, err error) {
	t.all = false
	if t.wildcard && t.names.len() == 0 && !ss.ttl {
		return ss.flushWildcard(typeURL, t, hold)
	}
	t.materialize()
	// One read: the response is one upstream version, never part of one.
	var v cache.View
	if err := ss.readOrdered(typeURL, func() {
		v = ss.cache.ReadFor(ss.watch, typeURL, t.names.appendKeys(nil), t.wildcard)
	}); err != nil {
		return nil, err
	}
	f := ss.flushOf(typeURL, &t.sent, &t.errSent, true, v.Received)
	beat := false
	var fresh []*cache.Resource // new or changed for the client
	for _, l := range v.Lookups {
		switch isFresh, _ := f.look(&l); {
		case isFresh:
			fresh = append(fresh, l.Resource)
		case l.Resource != nil && hbs.Has(l.Name) && l.Heartbeat != nil:
			beat = true
		}
		f.keepError(&l)
	}
	// Invariant 21 (held.go): no state leaves out a name the client may
	// hold that the relay merely lacks ("Deleting Resources").
	held, made := ss.unsettled(t, v.Lookups)
	if held {
		return nil, nil
	}
	want := slices.DeleteFunc(v.Lookups, func(l cache.Lookup) bool { return l.Resource == nil })
	if !t.responded && !t.firstReady(&v, len(want), len(f.errs)) {
		return nil, nil
	}
	if len(want) == 0 && ss.awaitsAnswer() {
		if ss.errorsWait(typeURL, t, f.errs) {
			return nil, nil
		}
		if err := ss.onlyErrors(xds.ShortName(typeURL), f.errs); err != nil {
			return nil, err
		}
	}
	f.errs = append(f.errs, made...) // with a state that goes out anyway: never one of its own
	changed := !t.responded || len(want) != t.sent.len() || len(fresh) > 0 || len(f.errs) > 0
	if !changed && !beat {
		return nil, nil
	}
	full := fullState{ss: ss, t: t, f: f, v: v, want: want, hbs: hbs, changed: changed}
	if hold && len(fresh) == 0 && len(f.errs) == 0 && t.responded && len(want) < t.sent.len() {
		return full.send, nil // it only removes
	}
	for _, r := range fresh {
		ss.warmedAs(r, t.sent.has(r.Name))
	}
	return nil, full.send()
}

// firstReady reports whether the first complete state of a Listener or
// Cluster subscription may go, with want resources present and errs
// errors: a wildcard's waits for upstream's complete state, and is not
// sent empty while a resource of the type waits for what it points at
// (docs/architecture.md, invariant 18; its release marks the stream); one
// by name goes once anything of it is known, an error being an answer.
func (t *sotwType) firstReady(v *cache.View, want, errs int) bool {
	if t.wildcard {
		return v.Synced && (want > 0 || !v.Held)
	}
	return v.Synced || want > 0 || t.nothing() || errs > 0
}

// fullState is a complete state flushFull decided to send.
type fullState struct {
	ss      *sotwStream
	t       *sotwType
	f       typeFlush // with the errors that go out with the state
	v       cache.View
	want    []cache.Lookup // present resources, sorted by name
	hbs     *cache.NameSet
	changed bool // else only heartbeats: no record moves
}

func (s fullState) send() error {
	ss, t, f := s.ss, s.t, &s.f
	fields := make([][]byte, 0, len(s.want)+len(f.errs))
	if s.changed {
		// The records of what the state omits move too, even if it holds
		// nothing: the client no longer has it.
		f.status()
		t.sent.clear()
	}
	for _, l := range s.want {
		if s.changed {
			f.record(l.Resource)
		}
		fields = append(fields, ss.field(l, s.hbs.Has(l.Name) && !s.changed))
	}
	f.done()
	ss.settled(t)
	// The errors go with the complete state: no client deletes what the
	// response still holds.
	return ss.respond(f.typeURL, &s.v, t, f.withErrors(fields, false))
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
func (ss *sotwStream) flushWildcard(typeURL string, t *sotwType, hold bool) (later func() error, err error) {
	var st *cache.State
	if err := ss.readOrdered(typeURL, func() { st = ss.cache.StateFor(ss.watch, typeURL) }); err != nil {
		return nil, err
	}
	if !t.responded && (!st.Synced || len(st.Resources) == 0 && ss.cache.Held(typeURL)) {
		return nil, nil // no empty first answer while a resource waits (flushFull)
	}
	if t.sentState != nil && t.sentState.Version == st.Version && t.responded {
		return nil, nil
	}
	if hold && t.removesOnly(st) {
		shared := sharedState{ss: ss, typeURL: typeURL, t: t, st: st}
		return shared.send, nil // after the other types (order.go)
	}
	return nil, ss.sendShared(typeURL, t, st)
}

// sharedState is a wildcard's complete state flushWildcard decided to
// send.
type sharedState struct {
	ss      *sotwStream
	typeURL string
	t       *sotwType
	st      *cache.State
}

func (s sharedState) send() error { return s.ss.sendShared(s.typeURL, s.t, s.st) }

// sendShared sends st, the shared complete state, to a wildcard-only
// subscription.
func (ss *sotwStream) sendShared(typeURL string, t *sotwType, st *cache.State) error {
	if ss.holdsEndpoints() || ss.fixed == "" && ss.asksHeldTypes() { // on ADS, a new Cluster may hold Routes back (warmorder.go)
		ss.warmState(t, st)
	}
	t.sentState = st
	t.nonce = ss.nonces.next()
	t.responded = true
	ss.settled(t)
	ss.status.sentShared(typeURL, st, ss.nonces.peek()-1, time.Now())
	v := cache.View{Version: st.Version, Received: st.Received, Trace: st.Trace}
	return ss.sendResponse(xds.SotWFullState(st.Version, typeURL, t.nonce, st.SotW), typeURL, t.nonce, &v, len(st.Resources), 0)
}

// warmState notes the resources of st that are new or changed for the
// client: against the shared state it was sent last (both are sorted by
// name, and an unchanged resource is the same *Resource), or its per-name
// record.
func (ss *sotwStream) warmState(t *sotwType, st *cache.State) {
	prev := t.sentState
	if prev == nil {
		for _, r := range st.Resources {
			if r.Warm == "" {
				continue
			}
			if h := holding(&t.sent, r.Name, r); h != holdsCurrent {
				ss.warmedAs(r, h.version())
			}
		}
		return
	}
	i := 0
	for _, r := range st.Resources {
		for i < len(prev.Resources) && prev.Resources[i].Name < r.Name {
			i++
		}
		switch {
		case r.Warm == "":
		case i == len(prev.Resources) || prev.Resources[i].Name != r.Name:
			ss.warmedNew(r)
		case prev.Resources[i] != r:
			ss.warmed(r)
		}
	}
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
	subscribed, all := t.all, t.all && t.wildcard
	t.all = false
	// One read: the response is one upstream version, never part of one.
	var v cache.View
	if err := ss.readOrdered(typeURL, func() {
		names := nameBuf[:0]
		if subscribed {
			names = t.names.appendKeys(names)
		}
		for _, set := range []*cache.NameSet{dirty, hbs} {
			for n := range set.All() {
				if t.names.has(n) || t.wildcard {
					names = append(names, n)
				}
			}
		}
		v = ss.cache.ReadInto(ss.watch, typeURL, names, all, lookupBuf[:0])
	}); err != nil {
		return err
	}
	t.all = all && !v.Synced
	f := ss.flushOf(typeURL, &t.sent, &t.errSent, false, v.Received)
	var out [][]byte
	for _, l := range v.Lookups {
		switch fresh, h := f.look(&l); {
		case fresh:
			out = append(out, ss.field(l, false))
			f.sendResource(l.Resource, h)
		case l.Resource != nil && hbs.Has(l.Name) && l.Heartbeat != nil:
			out = append(out, ss.field(l, true))
		case l.Resource == nil:
			f.forget(l.Name)
		}
		f.keepError(&l)
	}
	f.done()
	if len(out) == 0 && len(f.errs) == 0 && (t.responded || !t.nothing()) {
		return nil
	}
	if len(out) == 0 && ss.awaitsAnswer() {
		if ss.errorsWait(typeURL, t, f.errs) {
			return nil
		}
		if err := ss.onlyErrors(xds.ShortName(typeURL), f.errs); err != nil {
			return err
		}
	}
	return ss.respond(typeURL, &v, t, f.withErrors(out, false))
}

// respond sends one response of typeURL at v's version: fields, the
// resources and errors it carries, after the header SotW frames them with
// (version_info, type_url, nonce).
func (ss *sotwStream) respond(typeURL string, v *cache.View, t *sotwType, fields [][]byte) error {
	t.nonce = ss.nonces.next()
	t.responded = true
	return ss.sendResponse(xds.SotWFields(v.Version, typeURL, t.nonce, fields), typeURL, t.nonce, v, len(fields), 0)
}

package downstream

import (
	"strconv"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Make before break across a new Cluster's warming ("Eventual consistency
// considerations": EDS updates must arrive after CDS updates for the
// respective clusters, LDS after the corresponding CDS/EDS updates, RDS
// after CDS/EDS/LDS; docs/architecture.md, invariant 18 "Make before
// break, whatever the order upstream"). Envoy warms a new Cluster until
// its ClusterLoadAssignment arrives ("Resource warming") and applies a
// Route as it arrives: a Route to a Cluster still warming sends nothing
// there. The cache releases a Route only once its Cluster and that
// Cluster's endpoints are cached, but a stream sends the endpoints of a
// Cluster new to it only once the client asks for them, which Envoy does
// after it reads the Clusters, and a flush sends Clusters and Routes back
// to back.
//
// So on ADS, after a response that carries a Cluster new to the stream
// whose endpoints the stream does not hold (an EDS Cluster:
// cache.Resource.Warm), the flushes keep back the Listeners and Routes
// (LDS, RDS, SRDS, VHDS) until the client answers that response on CDS,
// ACK or NACK. Envoy sends its EDS subscription for the new Clusters
// before that answer, on the same stream, so the relay has sent the
// endpoints by then and the Routes follow them. The hold ends on that
// answer, on the stream's end, or after warmHoldMax, never later. Marks of
// the kept types stay pending and coalesce as usual (parked), and the
// flush after the hold sends their latest state. A flush that sends no
// such Cluster costs a nil check per type. A client that asks for Clusters
// after Routes (gRPC) waits at most one round trip more for Listeners and
// Routes behind a new Cluster, which is the order the spec asks for.
// Per-type streams order nothing across streams and keep nothing back.

// warmHoldMax bounds how long an ADS stream keeps Listeners and Routes
// back behind the Clusters it sent, waiting for the client's answer on
// CDS (invariant 9 "Every bound is explicit").
const warmHoldMax = 2 * time.Second

// warmHold is an ADS stream's hold of the types that reference Clusters
// behind the new Clusters it sent. It belongs to the stream's protocol,
// under the pump's mu; the timer's function only wakes the watch.
type warmHold struct {
	cold   []string       // endpoints of the Clusters the flush just sent new
	on     bool           // Listeners and Routes are kept back
	nonce  uint64         // the Cluster response whose answer ends the hold
	until  time.Time      // when the hold ends anyway
	timer  *time.Timer    // wakes the stream at until
	parked []*cache.Dirty // the marks kept back, one per type
}

// endpointHolder is a stream that can tell whether it holds the endpoints
// named name: subscribed and sent.
type endpointHolder interface {
	hasEndpoints(name string) bool
}

// warmedNew notes that Cluster r goes out new to the stream: besides
// warming (warmed), on ADS its endpoints, unless the stream holds them,
// hold the Listeners and Routes back (holdCold). A stream that has asked
// for none of them has nothing to hold and keeps no hold: no record, no
// timer, nothing to look at when the client answers (a client asks for
// Listeners before it answers the Clusters, or is answered after them
// anyway).
func (b *streamBase) warmedNew(r *cache.Resource) {
	b.warmed(r)
	if r.Warm == "" || b.fixed != "" || b.asked&heldTypes == 0 {
		return
	}
	if b.hold == nil {
		b.hold = &warmHold{}
	}
	b.hold.cold = append(b.hold.cold, r.Warm)
}

// holdCold starts, or extends to the response just sent, the hold of
// Listeners and Routes if a Cluster that response carried new has
// endpoints the stream does not hold. Called after each type's flush
// (flushWarm), so b.nonces is the last response's.
func (b *streamBase) holdCold(f flusher) {
	h := b.hold
	if h == nil || len(h.cold) == 0 {
		return
	}
	hf, _ := f.(endpointHolder)
	cold := false
	for _, n := range h.cold {
		if hf == nil || !hf.hasEndpoints(n) {
			cold = true
			break
		}
	}
	h.cold = h.cold[:0]
	if !cold {
		return
	}
	h.nonce = uint64(b.nonces)
	if h.on {
		return // the bound runs from the hold's start: Clusters that keep coming hold nothing forever
	}
	h.on = true
	h.until = time.Now().Add(warmHoldMax)
	if h.timer == nil {
		h.timer = time.AfterFunc(warmHoldMax, b.watch.Wake)
	} else {
		h.timer.Reset(warmHoldMax)
	}
}

// heldByWarming reports whether typeURL waits behind a Cluster that warms:
// the types whose resources point at Clusters, ranked after endpoints.
func heldByWarming(typeURL string) bool {
	r := xds.Rank(typeURL)
	return r >= xds.Rank(resourcev3.ListenerType) && r <= xds.Rank(resourcev3.VirtualHostType)
}

// heldBack reports whether the flush keeps d back behind a Cluster that
// warms; if so its marks are parked, for the flush after the hold.
func (b *streamBase) heldBack(d *cache.Dirty) bool {
	h := b.hold
	if h == nil || !h.on || !heldByWarming(d.TypeURL) {
		return false
	}
	if !time.Now().Before(h.until) {
		h.on = false // the timer has woken, or wakes, the flush that sends what is parked
		return false
	}
	var p *cache.Dirty
	for _, x := range h.parked {
		if x.TypeURL == d.TypeURL {
			p = x
		}
	}
	if p == nil {
		p = &cache.Dirty{TypeURL: d.TypeURL, Seq: d.Seq}
		h.parked = append(h.parked, p)
	}
	merge(p, d)
	return true
}

// merge adds what src marks to dst, as marks coalesce on a watch.
func merge(dst, src *cache.Dirty) {
	dst.Seq = min(dst.Seq, src.Seq)
	for n := range src.Names.All() {
		dst.Names.Add(n)
	}
	for n := range src.Heartbeats.All() {
		dst.Heartbeats.Add(n)
	}
}

// unheld returns dirty with what the hold kept back, once it has ended:
// the client answered, or warmHoldMax passed.
func (b *streamBase) unheld(dirty cache.DirtySet) cache.DirtySet {
	h := b.hold
	if h == nil || len(h.parked) == 0 {
		return dirty
	}
	if h.on {
		if time.Now().Before(h.until) {
			return dirty
		}
		h.on = false
	}
	for i, p := range h.parked {
		if d := dirty.Of(p.TypeURL); d != nil {
			merge(d, p)
		} else {
			dirty = append(dirty, p) // the watch recycles it with the rest
		}
		h.parked[i] = nil
	}
	h.parked = h.parked[:0]
	return dirty
}

// answeredClusters is told of a client's answer on CDS on an ADS stream:
// an ACK or NACK of the response that started or last extended the hold
// ends it, and wakes the stream to send what it kept back.
func (b *streamBase) answeredClusters(nonce string) {
	h := b.hold
	if h == nil || !h.on {
		return
	}
	n, err := strconv.ParseUint(nonce, 10, 64)
	if err != nil || n < h.nonce {
		return // an older response's answer: the client has not read the new Clusters yet
	}
	h.on = false
	h.timer.Stop()
	if len(h.parked) > 0 {
		b.watch.Wake()
	}
}

// endHold stops the hold's timer when the stream ends: nothing is sent any
// more. Called once no flush runs (after pump.end).
func (b *streamBase) endHold() {
	if h := b.hold; h != nil && h.timer != nil {
		h.timer.Stop()
	}
}

// hasEndpoints reports whether the stream holds the endpoints name: its
// EDS subscription names them (or the wildcard covers them) and it was
// sent them.
func (ss *sotwStream) hasEndpoints(name string) bool {
	t := ss.types.get(resourcev3.EndpointType)
	return t != nil && holding(&t.sent, name, nil).version() && (t.wildcard || t.names.has(name))
}

// hasEndpoints reports whether the stream holds the endpoints name:
// subscribed (by name, collection or wildcard) and sent, not as absent.
func (ds *deltaStream) hasEndpoints(name string) bool {
	t := ds.types.get(resourcev3.EndpointType)
	return t != nil && holding(&t.sent, name, nil).version() && (t.wildcard || t.named(name))
}

package downstream

import (
	"slices"
	"strconv"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/lockorder"
)

// Warming ("Resource warming"; docs/architecture.md, invariant 13): Envoy
// finishes warming a new or changed Cluster only when its ClusterLoadAssignment is sent again, even
// unchanged, and asks for nothing that would make a server send it (SotW
// repeats its last EDS request, delta sends nothing). A control plane's
// forced re-push would reach the relay as "same content, nothing to send",
// so the rule is kept here, per stream, from what the stream holds: a
// Cluster sent new or changed is followed, in the same flush and before
// any later type, by the endpoints it is warmed with (cache.Resource.Warm)
// if the stream holds them. It costs one resend per changed cluster per
// stream that holds its endpoints; a Cluster whose endpoints the stream
// does not hold sends nothing more (the client asks for them, and gets
// them as any new subscription).
//
// On ADS the endpoints go out on the same stream, right behind the
// Cluster, which orders them. A client that takes CDS and EDS on per-type
// streams of one connection gets them on its EDS stream once it has ACKed
// the Clusters on its CDS stream: two streams order nothing, and endpoints
// that arrive before the Cluster would warm nothing (see sendConn.warmEDS).
// A SotW EDS request that repeats the stream's last one is answered with
// the endpoints it names when nothing on the client's connection warms the
// stream (see sotwStream.repeated).

// warmed notes that a Cluster goes out new or changed on the stream: the
// endpoints it is warmed with follow it (flushWarm). Called by the Cluster
// flushes, under the stream's pump.
func (b *streamBase) warmed(r *cache.Resource) {
	if r.Warm != "" {
		b.warming = append(b.warming, r.Warm)
	}
}

// warmedAs notes that Cluster r goes out changed for the client (had: it
// held a version of it) or new to it (warmedNew).
func (b *streamBase) warmedAs(r *cache.Resource, had bool) {
	if had {
		b.warmed(r)
	} else {
		b.warmedNew(r)
	}
}

// flushWarm sends the endpoints of the Clusters just sent: on this stream
// for ADS (f's resendEndpoints), on the connection's EDS streams for a
// per-type CDS stream.
func (b *streamBase) flushWarm(f flusher) error {
	if len(b.warming) == 0 {
		return nil
	}
	// names shares its array with b.warming: each resendEndpoints makes
	// its set of names before it reads, and a Cluster a read sends first
	// (order.go) notes its own in that array.
	names := b.warming
	b.warming = b.warming[:0]
	if cap(names) > 64 {
		b.warming = nil // a whole state's worth is not kept per stream
	}
	switch b.fixed {
	case "":
		if err := f.resendEndpoints(names); err != nil {
			return err
		}
		b.holdCold(f) // warmorder.go
	case resourcev3.ClusterType:
		if b.warmOnAck == nil {
			b.warmOnAck = new(cache.NameSet)
		}
		for _, n := range names { // each once: a client may answer late
			b.warmOnAck.Add(n)
		}
		b.warmNonce = uint64(b.nonces)
	}
	return nil
}

// ackedClusters is told of a client's answer on a per-type CDS stream: an
// ACK of the last response that carried Clusters to warm sends their
// endpoints on the connection's EDS streams. A NACK applied nothing, and
// nothing warms.
func (b *streamBase) ackedClusters(nonce string, nack bool) {
	if b.warmOnAck.Len() == 0 {
		return
	}
	n, err := strconv.ParseUint(nonce, 10, 64)
	if err != nil || n < b.warmNonce {
		return // an older response's answer: the client has not seen them yet
	}
	names := b.warmOnAck.AppendTo(nil)
	b.warmOnAck = nil
	if !nack {
		b.conn.warmEDS(b.cache, names)
	}
}

// warmInbox is the names that a per-type CDS stream on the same connection
// asks an EDS stream to send again. Written by that stream's flush, taken
// by this one's.
type warmInbox struct {
	mu    lockorder.Mutex[warmInboxMu]
	names []string // guarded by mu
}

func (in *warmInbox) put(names []string) {
	in.mu.Lock()
	in.names = append(in.names, names...)
	in.mu.Unlock()
}

// take returns the names put since the last take; nil for a nil inbox.
func (in *warmInbox) take() []string {
	if in == nil {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	names := in.names
	in.names = nil
	return names
}

// linkConn ties the stream to its client connection's queue: a per-type EDS
// stream is registered there so that the connection's CDS stream can warm
// it. It returns the function that undoes it.
func (b *streamBase) linkConn(c *sendConn) (unlink func()) {
	b.conn = c
	switch {
	case c.addr == nil:
		return func() {}
	case b.fixed == resourcev3.ClusterType:
		c.warmMu.Lock()
		c.cds++
		c.warmMu.Unlock()
		return func() {
			c.warmMu.Lock()
			c.cds--
			c.warmMu.Unlock()
		}
	case b.fixed == resourcev3.EndpointType:
		b.inbox = &warmInbox{}
		c.warmMu.Lock()
		c.eds = append(c.eds, b)
		c.warmMu.Unlock()
		return func() {
			c.warmMu.Lock()
			c.eds = slices.DeleteFunc(c.eds, func(x *streamBase) bool { return x == b })
			c.warmMu.Unlock()
		}
	}
	return func() {}
}

// hasCDS reports whether the connection has a per-type CDS stream, which
// warms its EDS streams.
func (c *sendConn) hasCDS() bool {
	if c == nil {
		return false
	}
	c.warmMu.Lock()
	defer c.warmMu.Unlock()
	return c.cds > 0
}

// warmEDS asks the connection's per-type EDS streams of the same group to
// send names again, if they hold them.
func (c *sendConn) warmEDS(group *cache.Cache, names []string) {
	if c == nil {
		return
	}
	c.warmMu.Lock()
	targets := make([]*streamBase, 0, len(c.eds))
	for _, b := range c.eds {
		if b.cache == group {
			targets = append(targets, b)
		}
	}
	c.warmMu.Unlock()
	for _, b := range targets {
		b.inbox.put(names)
		b.watch.Mark(resourcev3.EndpointType, 0) // wakes its flush, which takes the inbox
	}
}

// heldNames keeps, of names, those the stream holds (held), each once, in
// a NameSet for the type's flush, after letting each be sent again (resend).
func heldNames(names []string, held func(string) bool, resend func(string)) *cache.NameSet {
	var set cache.NameSet
	for _, n := range names {
		if !set.Has(n) && held(n) {
			resend(n)
			set.Add(n)
		}
	}
	return &set
}

// hasEDS reports whether the connection has a per-type EDS stream.
func (c *sendConn) hasEDS() bool {
	if c == nil {
		return false
	}
	c.warmMu.Lock()
	defer c.warmMu.Unlock()
	return len(c.eds) > 0
}

package downstream

import (
	"fmt"
	"time"

	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Forwarded NACKs from a relay below (docs/architecture.md, "Forwarded
// NACKs"). A lower relay is a client of this one; when its own clients
// reject a version, it NACKs this relay's last response of the type, the
// details naming each version rejected (xds.Forwarded). That response
// was ACKed long ago, so the NACK's nonce moves nothing: the stream's
// record of each named resource it holds at that version is marked
// rejected instead, with the error from below, so that the rejection
// counts here as one by the lower relay's node, and, a first rejection
// of the version here, goes on to this relay's control plane. Nothing is
// sent again: a NACK never makes the relay resend (the spec's "ACK/NACK
// and resource type instance version": the client keeps its last valid
// version). A SotW client that shares a complete state (wildcard) keeps no
// record per name: its forwarded NACK is counted and logged only.

// maxForwardedPerNACK bounds the details read from one forwarded NACK,
// those that name a version and those that do not (the relay below sends
// at most 16 a request): a client's NACK costs at most that many decodes.
const maxForwardedPerNACK = 64

// forwarded marks what a forwarded NACK of typeURL names as rejected by
// the client.
func (b *streamBase) forwarded(typeURL string, d *rpcstatus.Status) {
	if ds := d.GetDetails(); len(ds) > maxForwardedPerNACK {
		d = &rpcstatus.Status{Details: ds[:maxForwardedPerNACK]}
	}
	if rs := xds.Forwarded(d, maxForwardedPerNACK); len(rs) > 0 {
		b.asServed(typeURL, rs)
		b.status.rejectedBelow(typeURL, rs, time.Now())
	}
}

// asServed turns each version of rs that a relay below named by its own
// version (it speaks SotW to this one, whose responses carry no version
// per resource, and versions them itself: invariant 16 "The control
// plane's dialect stays upstream") into the version this relay serves, if
// the bytes it names (Rejected.AnyVersion) are those this relay holds.
func (b *streamBase) asServed(typeURL string, rs []xds.Rejected) {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Name
	}
	for i, l := range b.cache.Get(typeURL, names) {
		if res := l.Resource; res != nil && res.Version != rs[i].Version && rs[i].AnyVersion != "" && len(res.Any) > 0 &&
			xds.AnyVersion(res.Any) == rs[i].AnyVersion {
			rs[i].Version = res.Version
		}
	}
}

// rejectedBelow marks the named resources of typeURL that the client
// holds at the versions rs name as NACKed; the others are left alone (a
// version since replaced, a name not held).
func (s *streamStatus) rejectedBelow(typeURL string, rs []xds.Rejected, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.types.get(typeURL)
	if t == nil {
		return
	}
	mv := s.mover(typeURL, t)
	for _, r := range rs {
		res, ok := t.res.get(r.Name)
		if r.Type != typeURL || !ok || res.version != r.Version || res.state == Nacked {
			continue
		}
		msg := xds.Clip("clients behind rejected it: " + r.Error)
		if r.Rejected > 0 && r.Clients >= r.Rejected { // the client's counts, said only when they make sense
			msg = xds.Clip(fmt.Sprintf("%d of %d clients behind rejected it: %s", r.Rejected, r.Clients, r.Error))
		}
		was := res
		// nonce 0: an answer to a later response does not take it back.
		res.state, res.nonce, res.nack = Nacked, 0, &nackNote{msg: msg, at: now}
		t.res.set(r.Name, res)
		mv.move(r.Name, was, res, time.Time{}, now)
	}
}

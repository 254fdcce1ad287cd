package downstream

import (
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The flush core: what a type's flush does for each name it looks at,
// whichever protocol the stream speaks. The SotW flushes (sotw.go:
// flushFull, flushChanged) and the incremental one (delta.go: flushType)
// each read one view of the cache and decide what goes out in their own
// framing (a SotW response's whole state or changed resources and its
// version_info; an incremental response's resources, removed_resources
// and system_version_info); the records behind those decisions are kept
// here, once:
//   - what changed since it was sent: a lookup against the type's record
//     of what the client was sent (look);
//   - the error records: an error goes out once, and again only when it
//     changes or the client asks anew; a new version makes the client drop
//     the one it remembers (errors.go);
//   - the status records: what each name's client holds and what waits
//     for its answer (status.go), opened only when a name's record moves,
//     so that a flush that moves no version (heartbeats alone, a mark of
//     what the client already has) takes no lock and reads no clock;
//   - the warming notes: a Cluster sent new or changed, and whether the
//     client had it (warming.go, warmorder.go);
//   - the response's own records once it is sent (sendResponse).

// holds is what a type's record says the client holds of a name.
type holds uint8

const (
	holdsNothing holds = iota // no record of the name
	holdsAbsent               // told it does not exist (incremental only)
	holdsOther                // a version, not the lookup's resource's
	holdsCurrent              // the lookup's resource, at its version
)

// version reports whether the client holds a version of the name.
func (h holds) version() bool { return h >= holdsOther }

// holding is what sent, a type's record of what the client was sent, says
// it holds of name, against r, the name's resource now (nil if none): what
// changed since it was sent.
func holding(sent *inlineMap[string], name string, r *cache.Resource) holds {
	have, ok := sent.get(name)
	switch {
	case !ok:
		return holdsNothing
	case have == absent:
		return holdsAbsent
	case r != nil && have == r.Version:
		return holdsCurrent
	}
	return holdsOther
}

// typeFlush is one type's flush under way: the type's records, and the
// status record the flush has opened, if any. It lives on the flush's
// stack.
type typeFlush struct {
	b       *streamBase
	typeURL string
	sent    *inlineMap[string] // the type's record: name → version the client was sent, or absent
	errSent *errorsSent        // and the errors it was sent
	// full says the response is the type's complete state: once the status
	// record opens, what the response omits the client no longer has.
	full     bool
	received int64 // when the view's latest change arrived, in Unix nanoseconds
	// The status record, opened by status at the first name whose record
	// moves, with mu held until done; nonce and now are the response's.
	rec   sendRec
	open  bool
	nonce uint64
	now   time.Time
	// errs are the errors looked at that the client was not sent, to go out
	// with the response (withErrors).
	errs []*cache.ResourceError
}

// flushOf starts a flush of typeURL over the type's records sent and
// errSent, of a view whose latest change arrived at received.
func (b *streamBase) flushOf(typeURL string, sent *inlineMap[string], errSent *errorsSent, full bool, received time.Time) typeFlush {
	return typeFlush{b: b, typeURL: typeURL, sent: sent, errSent: errSent, full: full, received: unixNano(received)}
}

// look compares l with what the client was sent: fresh if l's resource is
// new or changed for the client, and what the client holds of the name. A
// name the client's grant refuses carries its error (refusedError); a new
// version going out drops the error the client was sent of the name (it
// forgets the error it remembers: gRFC A88).
func (f *typeFlush) look(l *cache.Lookup) (fresh bool, h holds) {
	f.b.refusedError(l)
	h = holding(f.sent, l.Name, l.Resource)
	fresh = l.Resource != nil && h != holdsCurrent
	if fresh {
		f.errSent.forget(l.Name)
	}
	return fresh, h
}

// keepError keeps l's error for the response if the client was not sent
// it.
func (f *typeFlush) keepError(l *cache.Lookup) {
	if f.errSent.fresh(*l) {
		f.errs = append(f.errs, l.Error) // recorded once sent (withErrors)
	}
}

// status returns the response's status record, opening it (and taking the
// stream status's mu) at the first call.
func (f *typeFlush) status() sendRec {
	if !f.open {
		f.rec = f.b.status.sendingFrom(f.typeURL, f.full, f.received)
		f.nonce, f.now, f.open = f.b.nonces.peek(), time.Now(), true
	}
	return f.rec
}

// done closes the status record, if the flush opened one.
func (f *typeFlush) done() {
	if f.open {
		f.open = false
		f.b.status.done()
	}
}

// record notes that r goes out in the response: the client is sent it at
// its version, pending its answer.
func (f *typeFlush) record(r *cache.Resource) {
	f.sent.set(r.Name, r.Version)
	rec := f.status() // before f.nonce and f.now are read: it sets them
	rec.sent(r.Name, r.Version, f.nonce, f.now)
}

// sendResource notes that r goes out new or changed (fresh, by look), of a
// name the client held h of: its records, and its warming note.
func (f *typeFlush) sendResource(r *cache.Resource, h holds) {
	f.record(r)
	f.b.warmedAs(r, h.version())
}

// forget notes that the client no longer has name: it is not sent a
// resource that is no longer there.
func (f *typeFlush) forget(name string) {
	f.sent.remove(name)
	f.status().forget(name)
}

// absent notes that the client is told name does not exist.
func (f *typeFlush) absent(name string) {
	f.sent.set(name, absent)
	rec := f.status() // before f.now is read: it sets it
	rec.absent(name, f.now)
}

// withErrors appends the fields of the errors kept for the response (as
// an incremental response carries them if delta, else as SotW's), records
// them as sent and counts them (xdsrelay_resource_errors_total).
func (f *typeFlush) withErrors(fields [][]byte, delta bool) [][]byte {
	if len(f.errs) == 0 {
		return fields
	}
	short := xds.ShortName(f.typeURL)
	for _, e := range f.errs {
		if delta {
			fields = append(fields, e.Delta)
		} else {
			fields = append(fields, e.SotW)
		}
		f.errSent.record(e)
		f.b.sentError(short, e)
	}
	return fields
}

// sendResponse sends msg, a response of typeURL with nonce, of v's
// version, with resources and removed names, and notes it: the stream has
// spoken (errors.go), the rollout's verdict waits on it (rollout.go), and
// the debug log, the push trace and the push metrics see it.
func (b *streamBase) sendResponse(msg *xds.Message, typeURL, nonce string, v *cache.View, resources, removed int) error {
	size := msg.Size() // msg is gRPC's once sent, and used again once written
	if err := b.send(msg); err != nil {
		return err
	}
	b.spoke = true
	b.sentAs(typeURL, nonce, v.Version)
	b.debugResponse(typeURL, v.Version, nonce, resources, removed)
	b.tracePush(v.Trace, typeURL, v.Version, resources)
	b.srv.pushed(typeURL, size, v.Received, b.opened)
	return nil
}

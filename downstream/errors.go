package downstream

import (
	"maps"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Per-resource errors (xDS TP3, gRFC A88): the control plane's, and those
// the relay makes where it knows the answer (see cache.ResourceError). A
// client is sent an error once, and again only when it changes or when it
// asks for the name anew: it remembers the error until the resource or
// another error arrives, or it drops the name. A SotW
// Listener or Cluster response that carries an error still carries the
// type's complete state (flushFull), so that no client deletes what it has.

// errorsSent is what one type of a stream was sent of errors, by name.
type errorsSent map[string]*cache.ResourceError

// fresh reports whether l's error is one the client was not sent.
func (m *errorsSent) fresh(l cache.Lookup) bool {
	return l.Error != nil && (*m)[l.Name] != l.Error
}

// record notes e as sent.
func (m *errorsSent) record(e *cache.ResourceError) {
	if *m == nil {
		*m = make(errorsSent)
	}
	(*m)[e.Name] = e
}

// forget drops the record of name, once its resource went out or it is
// subscribed anew or no longer: a later error is new to the client, which
// forgets an error with the subscription (gRFC A88).
func (m errorsSent) forget(name string) {
	if m != nil {
		delete(m, name)
	}
}

// forgetUnless drops the records of the names keep does not keep: those a
// wildcard covered, once it is dropped.
func (m errorsSent) forgetUnless(keep func(name string) bool) {
	maps.DeleteFunc(m, func(n string, _ *cache.ResourceError) bool { return !keep(n) })
}

// sentError counts an error sent to the client
// (xdsrelay_resource_errors_total).
func (b *streamBase) sentError(short string, e *cache.ResourceError) {
	b.srv.resourceErrors.With(short, xds.CodeName(e.Code)).Inc()
}

// wildcardUnreachable is the end of a stream, SotW or incremental, in place
// of its first response when its one subscription is a wildcard of a type
// that the cache holds no complete state of and whose control plane
// cannot be reached (cache.WildcardUnavailable): a wildcard has no name
// for an error to carry, so the stream ends with UNAVAILABLE, and the
// client retries, on another replica if it has one, as it does when a
// relay cannot be reached. The flushes ask it of each type they flush;
// only a wildcard-only type not yet answered (waiting) may end the
// stream, and as with onlyErrors only while the handler waits for the
// first answer (see pump.awaitFirst). nil if the stream goes on waiting.
func (b *streamBase) wildcardUnreachable(typeURL string, waiting bool) error {
	if !waiting || b.spoke || !b.endable {
		return nil
	}
	why := b.cache.WildcardUnavailable(typeURL)
	if why == "" {
		return nil
	}
	return status.Errorf(codes.Unavailable, "xdsrelay: %s (wildcard): %s", xds.ShortName(typeURL), why)
}

// onlyErrors is the end of a SotW stream in place of its first response
// when that response would carry nothing but errors, every name the client
// asked for has one (a name still coming holds the errors back for the
// response that carries it: see sotwStream.errorsWait), and the client
// names resources of that one type and nothing else (the flushes ask
// awaitsAnswer, as run does before it waits): the client is told as if the
// control plane were out of its reach, which clients that do not read
// resource_errors (gRPC before A88) understand at once (gRFC A57: a stream
// that fails before its first response fails the resources it waits for),
// where they would otherwise wait for their does-not-exist timer. SotW has
// no other way to say that a name does not exist; incremental clients get
// removed_resources. A client that has been answered is sent the errors
// in a response, as is one whose handler already reads its next request
// (the handler alone can end a stream: see pump.awaitFirst), and so one
// that asks for another type. nil if the response is to be sent.
func (b *streamBase) onlyErrors(short string, errs []*cache.ResourceError) error {
	if b.spoke || !b.endable || len(errs) == 0 {
		return nil
	}
	for _, e := range errs {
		b.sentError(short, e)
	}
	e := errs[0]
	code := codes.Code(e.Code)
	if code == codes.OK {
		code = codes.Unknown
	}
	return status.Errorf(code, "xdsrelay: %s %q: %s", short, xds.Clip(e.Name), xds.Clip(e.Message))
}

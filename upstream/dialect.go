package upstream

import (
	"context"
	"fmt"
	"time"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Asking a server its dialect before any group has a stream
// (docs/architecture.md, invariant 20 "A refusal is an answer"): a relay
// that is ready only once it has something to serve (admin.ready_after_sync)
// cannot wait for a group's first answer, since groups start only when
// clients come, and clients come only to a ready relay. A connection that
// is up says nothing of the protocol: a server that does not speak it
// says so on the first stream, at once, before any request (UNIMPLEMENTED
// for a service it lacks; go-control-plane <= v0.9.8 and Gloo answer every
// delta method UNKNOWN "not implemented" as the call begins). So the
// relay opens a stream in the protocol it would speak, sends nothing, and
// reads how it ends within a window: a refusal is learned as a group's
// stream learns it (found), and a stream still open then, or ended
// otherwise, says nothing against the protocol.

// DialectWindow is how long a stream opened to ask a server its dialect
// is given to refuse it: a refusal comes in one round trip on a
// connection that is up.
const DialectWindow = time.Second

// Dialect asks server i of the control plane whether it speaks the
// protocol the relay would speak to it (with auto, each in turn, as a
// group's stream would try them), before any group has a stream; window
// bounds each try (DialectWindow if 0). It returns the server's name and
// what it refused when nothing is left to try, in the words a group's
// status gives (Status.Refused); "" when nothing was refused, or nothing
// can be known before a group asks: the per-type services refuse a type,
// not the protocol.
func (a *ADS) Dialect(ctx context.Context, i int, window time.Duration) (server, refusedAll string) {
	if window <= 0 {
		window = DialectWindow
	}
	s, f := a.opts.Servers[i], a.opts.found
	for {
		p := f.of(s.Name)
		if p == ProtocolSotWPerType {
			return s.Name, ""
		}
		err := askDialect(ctx, s.Conn, p, window)
		if err == nil || !refused(err) {
			return s.Name, ""
		}
		w := words(err)
		if f.refusedBy(s.Name, p, w) == "" {
			return s.Name, refusedWords(f.configured, p, w)
		}
	}
}

// askDialect opens a stream to conn in p, sends nothing, and returns the
// error it ends with within window; nil if it is still open then.
func askDialect(ctx context.Context, conn grpc.ClientConnInterface, p Protocol, window time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	method := discoverypb.AggregatedDiscoveryService_DeltaAggregatedResources_FullMethodName
	if p == ProtocolSotW {
		method = discoverypb.AggregatedDiscoveryService_StreamAggregatedResources_FullMethodName
	}
	st, err := conn.NewStream(ctx, sotwDesc, method, grpc.ForceCodecV2(xds.Codec{}))
	if err == nil {
		var r xds.Received
		err = st.RecvMsg(&r)
	}
	if ctx.Err() != nil {
		return nil // the window passed, or the relay stops: nothing refused
	}
	return err
}

// refusedWords says that a server refused p, in w, and that nothing is
// left to try: the configured protocol, or every one auto tries.
func refusedWords(configured, p Protocol, w string) string {
	if configured != ProtocolAuto {
		return fmt.Sprintf("refused %s with %s (upstream.protocol: %s; auto would try the others)", p, w, p)
	}
	return fmt.Sprintf("refused every protocol the relay speaks (delta, sotw and sotw-per-type; the last with %s)", w)
}

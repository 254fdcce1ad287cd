package downstream

import (
	"context"
	"log/slog"
	"strconv"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Debug logs: one line per request and per response on every stream, only
// when the logger is at debug. Nothing is built at other levels: these run
// for every message.

// debugRequest logs a client's request: its type, how many names it
// carries, its version (SotW) and nonce.
func (b *streamBase) debugRequest(typeURL string, names int, version, nonce string) {
	if !b.srv.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	b.srv.log.Debug("request from client", "node", xds.Clip(b.node.GetId()), "variant", b.variant,
		"type", xds.ShortName(typeURL), "names", names, "version", xds.Clip(version), "nonce", xds.Clip(nonce))
}

// debugResponse logs a response sent to the client: its type, version,
// nonce, and how many resources it carries and removes.
func (b *streamBase) debugResponse(typeURL string, version uint64, nonce string, resources, removed int) {
	if !b.srv.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	b.srv.log.Debug("response to client", "node", xds.Clip(b.node.GetId()), "variant", b.variant,
		"type", xds.ShortName(typeURL), "version", strconv.FormatUint(version, 10), "nonce", nonce,
		"resources", resources, "removed", removed)
}

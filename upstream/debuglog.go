package upstream

import (
	"context"
	"log/slog"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Debug logs: one line per request sent and per response received on the
// group's stream, only when the logger is at debug; nothing is built at
// other levels.

func (c *Client) debugRequest(r *discoverypb.DeltaDiscoveryRequest) {
	if !c.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	c.log.Debug("request to control plane", "node", xds.Clip(c.opts.Node.GetId()), "type", xds.ShortName(r.GetTypeUrl()),
		"subscribe", len(r.GetResourceNamesSubscribe()), "unsubscribe", len(r.GetResourceNamesUnsubscribe()),
		"resume", len(r.GetInitialResourceVersions()), "nonce", xds.Clip(r.GetResponseNonce()), "nack", r.GetErrorDetail() != nil)
}

func (c *Client) debugSotWRequest(r *discoverypb.DiscoveryRequest) {
	if !c.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	c.log.Debug("request to control plane (state of the world)", "node", xds.Clip(c.opts.Node.GetId()), "type", xds.ShortName(r.GetTypeUrl()),
		"names", len(r.GetResourceNames()), "version", xds.Clip(r.GetVersionInfo()), "nonce", xds.Clip(r.GetResponseNonce()),
		"nack", r.GetErrorDetail() != nil)
}

func (c *Client) debugResponse(r *xds.Received) {
	if !c.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	c.log.Debug("response from control plane", "type", xds.ShortName(r.TypeURL), "resources", len(r.Resources),
		"removed", len(r.RemovedResources), "version", xds.Clip(r.SystemVersionInfo), "nonce", xds.Clip(r.Nonce))
}

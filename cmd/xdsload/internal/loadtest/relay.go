package loadtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/xdsrelay/xdsrelay/relay"
)

// relayShutdown bounds the in-process relay's shutdown.
const relayShutdown = 10 * time.Second

// startRelay starts xdsrelay in this process in front of the control plane
// at upstream: downstream on a free loopback port, no admin endpoint,
// clients grouped by node.cluster, no admission limits and no bound on the
// streams of a connection. Its warnings go to progress.
func startRelay(upstream string, progress io.Writer) (*relay.Relay, error) {
	cfg := relay.Default()
	cfg.Upstream.Address = upstream
	cfg.Upstream.GroupBy = []string{"cluster"}
	cfg.Downstream.Address = "127.0.0.1:0"
	cfg.Admin.Address = ""
	// A load test admits streams as fast as the clients open them and holds
	// as many as they ask for: the relay's admission limits protect a
	// production relay, and would measure the limits here, not the relay.
	cfg.Limits.StreamRate, cfg.Limits.MaxStreams, cfg.Limits.MaxGroups = 0, 0, 0
	// --streams-per-conn multiplexes clients onto connections: the
	// default of 100 streams per connection would hold the rest back.
	cfg.Limits.MaxStreamsPerConnection = 0
	if progress == nil {
		progress = io.Discard
	}
	logger := slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := relay.New(cfg, logger)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if err := r.Start(); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), relayShutdown)
		defer cancel()
		_ = r.Shutdown(ctx)
		return nil, fmt.Errorf("relay: %w", err)
	}
	return r, nil
}

func stopRelay(r *relay.Relay) {
	ctx, cancel := context.WithTimeout(context.Background(), relayShutdown)
	defer cancel()
	_ = r.Shutdown(ctx)
}

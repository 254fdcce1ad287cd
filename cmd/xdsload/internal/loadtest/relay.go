package loadtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/xdsrelay/xdsrelay/relay"
)

// relayShutdown bounds the in-process relay's shutdown.
const relayShutdown = 10 * time.Second

// relayPersistEvery is the relay's cache.persist_interval with
// Config.RelayPersist: short, so that a short run saves.
const relayPersistEvery = time.Second

// relayStreamsPerConn is the relay's default
// limits.max_streams_per_connection, kept by Config.RelayLimits.
var relayStreamsPerConn = relay.Default().Limits.MaxStreamsPerConnection

// startRelay starts xdsrelay in this process in front of the control plane
// at upstream: downstream on a free loopback port, clients grouped by
// node.cluster, no admission limits and no bound on the streams of a
// connection unless cfg.RelayLimits, the cache saved in cfg.RelayPersist if
// set, and an admin endpoint on a free loopback port only for a soak (which
// reads the open streams from its /metrics). Its warnings go to
// cfg.Progress.
func startRelay(upstream string, cfg *Config) (*relay.Relay, error) {
	rc, err := relayConfig(upstream, cfg)
	if err != nil {
		return nil, err
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	logger := slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := relay.New(rc, logger)
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

// relayConfig is the relay's configuration for cfg (see startRelay).
func relayConfig(upstream string, cfg *Config) (relay.Config, error) {
	rc := relay.Default()
	rc.Upstream.Address = upstream
	rc.Upstream.GroupBy = []string{"cluster"}
	if len(cfg.RelayGroupBy) > 0 {
		rc.Upstream.GroupBy = cfg.RelayGroupBy
	}
	rc.Downstream.Address = "127.0.0.1:0"
	rc.Admin.Address = ""
	if cfg.Soak.Duration > 0 {
		rc.Admin.Address = "127.0.0.1:0"
	}
	if !cfg.RelayLimits {
		// A load test admits streams as fast as the clients open them and
		// holds as many as they ask for: the relay's admission limits
		// protect a production relay, and would measure the limits here,
		// not the relay.
		rc.Limits.StreamRate, rc.Limits.MaxStreams, rc.Limits.MaxGroups = 0, 0, 0
		// --streams-per-conn multiplexes clients onto connections: the
		// default of 100 streams per connection would hold the rest back.
		rc.Limits.MaxStreamsPerConnection = 0
	}
	if dir := cfg.RelayPersist; dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return rc, fmt.Errorf("relay: cache.persist_dir: %w", err)
		}
		rc.Cache.PersistDir, rc.Cache.PersistInterval = dir, relayPersistEvery
	}
	if cfg.RelayConsistencyOff {
		rc.Consistency.MaxWait = 0
	}
	if cfg.LRS {
		rc.LRS.Interval = cfg.LRSInterval // lrs.min_interval follows it below 1s
	}
	if cfg.Soak.Faults {
		// A silent link is found dead, a connection attempt through it
		// given up, and a name asked judged, within the soak's bounds.
		u := &rc.Upstream.UpstreamConfig
		u.KeepaliveTime, u.KeepaliveTimeout, u.ConnectTimeout = soakKeepalive, soakKeepaliveTimeout, soakConnectTimeout
		rc.Cache.NotFoundTimeout = soakNotFoundTimeout
	}
	if cfg.relayTune != nil {
		cfg.relayTune(&rc)
	}
	return rc, nil
}

func stopRelay(r *relay.Relay) {
	ctx, cancel := context.WithTimeout(context.Background(), relayShutdown)
	defer cancel()
	_ = r.Shutdown(ctx)
}

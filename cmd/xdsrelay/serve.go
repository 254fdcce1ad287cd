package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/xdsrelay/xdsrelay/relay"
)

// serve runs the relay until ctx is done, then drains it. A signal on hup
// (SIGHUP) is logged and otherwise ignored.
func serve(ctx context.Context, opts Options, logger *slog.Logger, hup <-chan os.Signal) error {
	if opts.Tracing.Endpoint != "" {
		stop, err := setupTracing(ctx, opts.Tracing)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := stop(sctx); err != nil {
				logger.Warn("flushing traces", "error", err)
			}
		}()
	}
	opts.Relay.Upstream.Node.UserAgentVersion = currentVersion().Version
	opts.Relay.Build = currentVersion().relayBuild()
	r, err := relay.New(opts.Relay, logger)
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	waitForStop(ctx, hup, logger)
	logger.Info("shutting down", "timeout", opts.Relay.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), opts.Relay.ShutdownTimeout)
	defer cancel()
	return r.Shutdown(sctx)
}

// waitForStop returns when ctx is done. SIGHUP, which would end the process
// by default, only logs: the configuration is read once, at start.
func waitForStop(ctx context.Context, hup <-chan os.Signal, logger *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			logger.Info("SIGHUP ignored: the configuration is not reloaded; restart to apply changes")
		}
	}
}

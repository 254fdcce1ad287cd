package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/xdsrelay/xdsrelay/relay"
)

// serve runs the relay until ctx is done, then drains it.
func serve(ctx context.Context, opts Options, logger *slog.Logger) error {
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
	r, err := relay.New(opts.Relay, logger)
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	logger.Info("shutting down", "timeout", opts.Relay.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), opts.Relay.ShutdownTimeout)
	defer cancel()
	return r.Shutdown(sctx)
}

package main

import (
	"context"
	"log/slog"

	"github.com/xdsrelay/xdsrelay/relay"
)

// serve runs the relay until ctx is done, then drains it.
func serve(ctx context.Context, opts Options, logger *slog.Logger) error {
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

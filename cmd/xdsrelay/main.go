// Command xdsrelay runs the xDS aggregating relay.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// run is the command line. It returns the exit code: 0, 1 when the command
// fails, 2 for a usage or configuration error. The relay runs until ctx ends
// or SIGINT or SIGTERM arrives.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	root := newRootCmd(environ)
	root.SetArgs(legacyFlags(args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	return exitCode(root.ExecuteContext(ctx), stderr)
}

// newLogger writes to w in format (text or json) at level, which the
// admin endpoint's /debug/loglevel changes at run time.
func newLogger(format string, w io.Writer, level slog.Leveler) *slog.Logger {
	ho := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, ho))
	}
	return slog.New(slog.NewTextHandler(w, ho))
}

// runRelay loads the configuration and serves until ctx ends or SIGINT or
// SIGTERM arrives.
func runRelay(ctx context.Context, configFile string, environ []string, stderr io.Writer) int {
	opts, unknownEnv, err := loadConfig(configFile, environ)
	if err != nil {
		printErrors(stderr, err)
		return 2
	}
	level := new(slog.LevelVar)
	level.Set(opts.LogLevel)
	opts.Relay.LogLevel = level
	logger := newLogger(opts.LogFormat, stderr, level)
	defer useGRPCLogger(logger)()
	for _, name := range unknownEnv {
		attrs := []any{"name", name}
		if near := nearestEnv(name); near != "" {
			attrs = append(attrs, "did_you_mean", near)
		}
		logger.Warn("unknown environment variable ignored", attrs...)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := serve(ctx, opts, logger, hup); err != nil {
		fmt.Fprintln(stderr, "xdsrelay:", err)
		return 1
	}
	return 0
}

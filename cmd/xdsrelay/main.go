// Command xdsrelay runs the xDS aggregating relay.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("xdsrelay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", "", "configuration file (YAML); every key can also be set as XDSRELAY_<KEY>")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "xdsrelay", versionString())
		return 0
	}
	opts, unknownEnv, err := loadConfig(*configFile, os.Environ())
	if err != nil {
		fmt.Fprintln(stderr, "xdsrelay:", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: opts.LogLevel}))
	for _, name := range unknownEnv {
		logger.Warn("unknown environment variable ignored", "name", name)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, opts, logger); err != nil {
		fmt.Fprintln(stderr, "xdsrelay:", err)
		return 1
	}
	return 0
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

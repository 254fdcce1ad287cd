// Command xdsrelay runs the xDS aggregating relay.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// run is the command line. It returns the exit code: 0, 1 when the relay
// fails, 2 for a usage or configuration error. The relay runs until ctx ends
// or SIGINT or SIGTERM arrives.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	fl, err := parseFlags(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage(stdout)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "xdsrelay: %v (see xdsrelay --help)\n", err)
		return 2
	case fl.version:
		fmt.Fprintln(stdout, "xdsrelay", currentVersion())
		return 0
	}
	return runRelay(ctx, fl.config, environ, stderr)
}

// cliFlags are the command line's flags.
type cliFlags struct {
	config  string
	version bool
}

func newFlagSet(fl *cliFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("xdsrelay", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run reports errors and prints the usage
	fs.Usage = func() {}
	fs.StringVar(&fl.config, "config", "", "read the configuration from `FILE` (YAML); without it, defaults and the environment only")
	fs.BoolVar(&fl.version, "version", false, "print the version and exit")
	return fs
}

// parseFlags parses args; flag.ErrHelp for -h or --help. There are no
// positional arguments: the configuration file is named with --config.
func parseFlags(args []string) (cliFlags, error) {
	var fl cliFlags
	fs := newFlagSet(&fl)
	if err := fs.Parse(args); err != nil {
		return fl, err
	}
	if fs.NArg() > 0 {
		return fl, fmt.Errorf("unexpected argument %q: name the configuration file with --config FILE", fs.Arg(0))
	}
	return fl, nil
}

// usage prints the flags and every configuration key.
func usage(w io.Writer) {
	fmt.Fprint(w, `Usage: xdsrelay [--config FILE]

Runs the xDS relay until SIGINT or SIGTERM, then drains it. SIGHUP does not
reload the configuration; restart to apply changes.

Flags:
`)
	newFlagSet(new(cliFlags)).VisitAll(func(f *flag.Flag) {
		name, doc := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s\n        %s\n", strings.TrimSpace(f.Name+" "+name), doc)
	})
	fmt.Fprintf(w, "  -h, --help\n        print this help and exit\n\n")
	fmt.Fprintf(w, "Configuration keys, in the file or the environment as %s<KEY> (%s...):\n", envPrefix, envName("upstream.address"))
	def := defaultOptions()
	for _, s := range settings(&def) {
		fmt.Fprintf(w, "  %s (%s, default %s)\n        %s\n", s.key, s.kind, formatValue(s), s.doc)
	}
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
		fmt.Fprintln(stderr, "xdsrelay:", err)
		return 2
	}
	level := new(slog.LevelVar)
	level.Set(opts.LogLevel)
	opts.Relay.LogLevel = level
	logger := newLogger(opts.LogFormat, stderr, level)
	for _, name := range unknownEnv {
		logger.Warn("unknown environment variable ignored", "name", name)
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

package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// exitStatus ends the command with a code once the reason has been printed.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// usageError is a command line the command does not accept: exit 2.
type usageError struct {
	cmd *cobra.Command
	err error
}

func (e usageError) Error() string { return e.err.Error() }

// configError is a configuration that does not load: exit 2.
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }

// exitCode prints err (one line) and returns the exit code for it.
func exitCode(err error, stderr io.Writer) int {
	var (
		st    exitStatus
		use   usageError
		cfg   configError
		files filesError
	)
	switch {
	case err == nil:
		return 0
	case errors.As(err, &st):
		return int(st)
	case errors.As(err, &use):
		fmt.Fprintf(stderr, "xdsrelay: %v (see %s --help)\n", use.err, use.cmd.CommandPath())
		return 2
	case errors.As(err, &cfg):
		printErrors(stderr, cfg.err)
		return 2
	case errors.As(err, &files):
		printErrors(stderr, files.err)
		return 1
	default:
		fmt.Fprintln(stderr, "xdsrelay:", err)
		return 1
	}
}

// legacyFlags accepts the single-dash long flags of the command line before
// subcommands (-config FILE, -version, -help) in their double-dash form.
func legacyFlags(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && (name == "config" || name == "version" || name == "help") {
			a = "-" + a
		}
		out = append(out, a)
	}
	return out
}

// noArgs refuses positional arguments: the configuration file is named with
// --config, so that a file is never silently ignored.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return usageError{cmd, fmt.Errorf("unexpected argument %q: name the configuration file with --config FILE", args[0])}
}

// unknownCommand refuses a word that names none of cmd's commands: a usage
// error (exit 2) that says "unknown command" and suggests the nearest
// command, or lists them.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	cmd.SuggestionsMinimumDistance = suggestDistance
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		return usageError{cmd, fmt.Errorf("%s; did you mean %q?", msg, s[0])}
	}
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	msg += "; the commands are " + strings.Join(names, ", ")
	if !cmd.HasParent() {
		msg += " (a configuration file is named with --config FILE)"
	}
	return usageError{cmd, errors.New(msg)}
}

// suggestDistance is how many edits (Levenshtein) away a command may be
// from a mistyped word to be suggested: stauts is status, validat validate.
const suggestDistance = 2

// groupCmd makes cmd a group of the commands subs: alone it prints its
// help; with a word that names none of them, it is a usage error.
func groupCmd(cmd *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	cmd.Args = unknownCommand
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	cmd.AddCommand(subs...)
	return cmd
}

// flagError is a flag the command does not take: a usage error. When the
// command groups others and a word before the flag names none of them, the
// word is the mistake (xdsrelay stauts --server ADDR), not the flag that
// only its intended command takes.
func flagError(cmd *cobra.Command, err error) error {
	if args := cmd.Flags().Args(); cmd.HasAvailableSubCommands() && len(args) > 0 {
		if found, _, ferr := cmd.Find(args[:1]); ferr == nil && found == cmd {
			return unknownCommand(cmd, args)
		}
	}
	return usageError{cmd, err}
}

// usageArgs makes check's refusal a usage error.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{cmd, err}
		}
		return nil
	}
}

// newRootCmd is the command tree. Without a subcommand, xdsrelay serves.
func newRootCmd(environ []string) *cobra.Command {
	var (
		config      string
		showVersion bool
	)
	root := &cobra.Command{
		Use:           "xdsrelay",
		Short:         "An xDS aggregating relay",
		Args:          unknownCommand,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if showVersion {
				fmt.Fprintln(cmd.OutOrStdout(), "xdsrelay", currentVersion())
				return nil
			}
			return serveCmd(cmd, config, environ)
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.Flags().StringVar(&config, "config", "", "read the configuration from `FILE` (YAML); without it, defaults and the environment only")
	root.Flags().BoolVar(&showVersion, "version", false, "print the version and exit")
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(newServeCmd(environ), newValidateCmd(environ), newStatusCmd(), newWatchCmd(), newGroupsCmd(), newPersistCmd(), newGuardCmd(),
		newRolloutCmd(), newWaitCmd(), newConfigDumpCmd(), newAdminCmd(), newVersionCmd(), newDocsCmd())
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		if cmd == root || cmd.Name() == "serve" {
			usage(cmd.OutOrStdout(), root)
			return
		}
		defaultHelp(cmd, args)
	})
	return root
}

func newServeCmd(environ []string) *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:   "serve [--config FILE]",
		Short: "Run the relay (the default without a subcommand)",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return serveCmd(cmd, config, environ) },
	}
	cmd.Flags().StringVar(&config, "config", "", "read the configuration from `FILE` (YAML); without it, defaults and the environment only")
	return cmd
}

// serveCmd runs the relay until the command's context ends or SIGINT or
// SIGTERM arrives.
func serveCmd(cmd *cobra.Command, config string, environ []string) error {
	if code := runRelay(cmd.Context(), config, environ, cmd.ErrOrStderr()); code != 0 {
		return exitStatus(code)
	}
	return nil
}

// usage prints the commands, the flags and every configuration key.
func usage(w io.Writer, root *cobra.Command) {
	fmt.Fprint(w, `Usage: xdsrelay [serve] [--config FILE]
       xdsrelay COMMAND [flags]

Runs the xDS relay until SIGINT or SIGTERM, then drains it. SIGHUP does not
reload the configuration; restart to apply changes.

Commands:
`)
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			fmt.Fprintf(w, "  %-12s %s\n", c.Name(), c.Short)
		}
	}
	fmt.Fprint(w, "\nRun xdsrelay COMMAND --help for a command's flags.\n\nFlags:\n")
	root.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		name, doc := pflag.UnquoteUsage(f)
		if name == "bool" {
			name = ""
		}
		fmt.Fprintf(w, "  --%s\n        %s\n", strings.TrimSpace(f.Name+" "+name), doc)
	})
	fmt.Fprintf(w, "  -h, --help\n        print this help and exit\n\n")
	fmt.Fprintf(w, "Configuration keys, in the file or the environment as %s<KEY> (%s...):\n", envPrefix, envName("upstream.address"))
	def := defaultOptions()
	for _, s := range settings(&def) {
		fmt.Fprintf(w, "  %s (%s, default %s)\n        %s\n", s.key, s.kind, formatValue(s), s.doc)
	}
}

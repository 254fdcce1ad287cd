package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/relay"
	"github.com/xdsrelay/xdsrelay/upstream"
)

func newValidateCmd(environ []string) *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:   "validate [--config FILE]",
		Short: "Check the configuration and, for a file:// upstream, the resource files",
		Long: `Loads the configuration as serve does (file, then XDSRELAY_ environment
variables) and checks it; for a file:// upstream.address, also loads and
validates every resource file. An XDSRELAY_ variable that names no key is an
error here (serve warns and ignores it). Exits 0 when all is well, 2 for a
configuration error, 1 for resource files that do not load.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			msg, err := validate(config, environ)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), msg)
			return nil
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "check the configuration in `FILE` (YAML); without it, defaults and the environment only")
	return cmd
}

// validate checks the configuration and the resource files it names, and
// says what it checked.
func validate(config string, environ []string) (string, error) {
	opts, unknownEnv, err := loadConfig(config, environ)
	if err != nil {
		return "", configError{err}
	}
	if len(unknownEnv) > 0 {
		return "", configError{unknownEnvError(unknownEnv)}
	}
	dir, ok := strings.CutPrefix(opts.Relay.Upstream.Address, relay.FilePrefix)
	if !ok {
		return "configuration OK", nil
	}
	f, err := upstream.NewFile(dir, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		return "", fmt.Errorf("upstream.address: %w", err)
	}
	return fmt.Sprintf("configuration OK; %d resources in %s", f.Count(), dir), nil
}

// unknownEnvError names the XDSRELAY_ variables that name no key, with the
// nearest key's variable for each that has one.
func unknownEnvError(names []string) error {
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n
		if near := nearestEnv(n); near != "" {
			parts[i] += " (did you mean " + near + "?)"
		}
	}
	return fmt.Errorf("%s %s: no configuration key has %s name (serve ignores %s with a warning)",
		plural(len(names), "unknown environment variable", "unknown environment variables"), strings.Join(parts, ", "),
		plural(len(names), "that", "their"), plural(len(names), "it", "them"))
}

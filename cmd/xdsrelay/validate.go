package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/relay"
)

func newValidateCmd(environ []string) *cobra.Command {
	var (
		config   string
		keysOnly bool
	)
	cmd := &cobra.Command{
		Use:   "validate [--config FILE]",
		Short: "Check the configuration and what it names, as serve does at start, without listening",
		Long: `Loads the configuration as serve does (file, then XDSRELAY_ environment
variables) and makes every check serve makes at start, without listening
or connecting: every key's value, the TLS certificates, keys and CA
bundles of each side, the authorization rules, and for a file://
upstream.address every resource file. It reports every error, one a line,
each naming its key (and for a resource file, the file, the resource and
the line and column in the file). An XDSRELAY_ variable that names no key
is an error here (serve warns and ignores it). Exits 0 when all is well, 2
for a configuration error, 1 for resource files that do not load.

--keys-only checks the keys' values and not the files they name (TLS
files, resource files): to check a configuration away from where it runs,
a rendered manifest in CI say, whose certificates are mounted in the pod.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			msg, warnings, err := validate(config, environ, keysOnly)
			for _, w := range warnings {
				fmt.Fprintf(cmd.ErrOrStderr(), "xdsrelay: warning: %v\n", w)
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), msg)
			return nil
		},
	}
	cmd.Flags().StringVar(&config, "config", "", "check the configuration in `FILE` (YAML); without it, defaults and the environment only")
	cmd.Flags().BoolVar(&keysOnly, "keys-only", false, "check the keys' values, not the files they name (TLS files, resource files)")
	return cmd
}

// validate makes serve's checks of the configuration and of what it names,
// and says what it checked: every error, joined, as a configError (exit 2)
// if any is the configuration's, else as the resource files' (exit 1);
// and the warnings: what does not load that this configuration names and
// does not use (relay.Checked.Warnings).
func validate(config string, environ []string, keysOnly bool) (_ string, warnings []error, _ error) {
	opts, unknownEnv, err := loadConfig(config, environ)
	var cfgErrs []error
	if err != nil {
		eachError(err, func(e error) { cfgErrs = append(cfgErrs, e) })
	}
	if len(unknownEnv) > 0 {
		cfgErrs = append(cfgErrs, unknownEnvError(unknownEnv))
	}
	var checked relay.Checked
	if !keysOnly {
		checked = relay.CheckStart(opts.Relay) // what a key that did not load names is its default's
	}
	cfgErrs = append(cfgErrs, checked.TLS...)
	warnings = checked.Warnings
	switch {
	case len(cfgErrs) > 0:
		return "", warnings, configError{errors.Join(append(cfgErrs, checked.Files...)...)}
	case len(checked.Files) > 0:
		return "", warnings, filesError{errors.Join(checked.Files...)}
	}
	msg := "configuration OK"
	if checked.Dir != "" {
		msg = fmt.Sprintf("configuration OK; %d resources in %s", checked.Resources, checked.Dir)
	}
	if len(warnings) > 0 {
		msg += fmt.Sprintf(" (and %d %s)", len(warnings), plural(len(warnings), "warning", "warnings"))
	}
	return msg, warnings, nil
}

// filesError is resource files that do not load: exit 1, each on a line.
type filesError struct{ err error }

func (e filesError) Error() string { return e.err.Error() }

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

package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"

	"github.com/spf13/viper"

	"github.com/xdsrelay/xdsrelay/relay"
)

// Options are what the configuration gives the binary: the relay's own
// configuration and how to log.
type Options struct {
	Relay     relay.Config
	LogLevel  slog.Level
	LogFormat string // text or json
	Tracing   TracingOptions
}

// loadConfig reads the file (if any) and environ (KEY=value entries, as from
// os.Environ); the environment overrides the file. The error holds every
// error found (errors.Join), each one line naming its key; the options are
// then what loaded, a key that did not at its default. unknownEnv lists
// the XDSRELAY_ variables that set no key, for the caller to warn about.
func loadConfig(file string, environ []string) (o Options, unknownEnv []string, err error) {
	fileVals, errs, unknown := readFile(file)
	env, unknownEnv := splitEnv(environ)
	o = defaultOptions()
	failed := map[string]bool{} // keys left at their defaults: what is said of their values would mislead
	for _, k := range unknown {
		if near := nearestKey(k); near != "" {
			failed[near] = true // a misspelling
		}
	}
	for _, s := range settings(&o) {
		if err := apply(s, fileVals, env); err != nil {
			errs = append(errs, err)
			failed[s.key] = true
		}
	}
	for _, e := range finish(&o) {
		if !aboutKeys(e, failed) {
			errs = append(errs, e)
		}
	}
	return o, unknownEnv, errors.Join(errs...)
}

// aboutKeys reports whether err is about one of keys: its text begins with
// the key.
func aboutKeys(err error, keys map[string]bool) bool {
	msg := err.Error()
	for k := range keys {
		if rest, ok := strings.CutPrefix(msg, k); ok && rest != "" && strings.ContainsRune(":.[ ", rune(rest[0])) {
			return true
		}
	}
	return false
}

// eachError calls f with each error that err joins (errors.Join), or err.
func eachError(err error, f func(error)) {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			eachError(e, f)
		}
		return
	}
	f(err)
}

// printErrors writes each error err joins on a line of its own.
func printErrors(w io.Writer, err error) {
	eachError(err, func(e error) { fmt.Fprintln(w, "xdsrelay:", e) })
}

// apply sets s from the environment, else from the file, else leaves the
// default.
func apply(s setting, fileVals map[string]any, env map[string]string) error {
	if val, ok := env[envName(s.key)]; ok {
		if err := s.set(val, true); err != nil {
			key, err := keyOf(s, err)
			return fmt.Errorf("%s (from %s): %w", key, envName(s.key), err)
		}
		return nil
	}
	if raw, ok := fileVals[s.key]; ok {
		if err := s.set(raw, false); err != nil {
			key, err := keyOf(s, err)
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	return nil
}

// keyOf returns the key an error of s.set names: s.key, or for an error in
// one entry of a list, that entry's key (upstreams[1].tls.ca_file).
func keyOf(s setting, err error) (string, error) {
	if e, ok := errors.AsType[*entryError](err); ok {
		return s.key + e.path, e.err
	}
	return s.key, err
}

// finish checks what spans keys and validates the relay's configuration:
// every error.
func finish(o *Options) []error {
	var errs []error
	if o.LogFormat != "text" && o.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("log.format: %q is not text or json", o.LogFormat))
	}
	if o.Tracing.Endpoint != "" {
		if _, _, err := net.SplitHostPort(o.Tracing.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("tracing.otlp_endpoint: %q is not host:port", o.Tracing.Endpoint))
		}
		o.Relay.Tracing = true
	}
	return append(errs, o.Relay.Problems()...)
}

// readFile returns the file's values by key, without the keys it does not
// know (unknown); nothing when file is "". A key the relay does not know
// is an error, each one: a typo must not silently leave a default in
// place.
func readFile(file string) (vals map[string]any, errs []error, unknown []string) {
	if file == "" {
		return nil, nil, nil
	}
	if err := sameKeysInCase(file); err != nil {
		return nil, []error{err}, nil
	}
	v := viper.New()
	v.SetConfigFile(file)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		return nil, []error{fmt.Errorf("config %s: %w", file, err)}, nil
	}
	known := settingsByKey(new(Options))
	vals = flatten("", v.AllSettings(), known)
	for _, k := range slices.Sorted(maps.Keys(vals)) {
		if _, ok := known[k]; !ok {
			hint := ""
			if near := nearestKey(k); near != "" {
				hint = " (did you mean " + near + "?)"
			}
			errs = append(errs, fmt.Errorf("config %s: unknown key %q%s", file, k, hint))
			unknown = append(unknown, k)
			delete(vals, k)
		}
	}
	if err := keepCase(file, vals, known); err != nil {
		errs = append(errs, err)
	}
	return vals, errs, unknown
}

// flatten turns nested sections into dotted keys, stopping at known keys
// (upstream.headers is a key whose value is a map). Names are lower-cased, as
// viper does; a known key's value is left as it is.
func flatten(prefix string, m map[string]any, known map[string]setting) map[string]any {
	out := map[string]any{}
	for k, val := range m {
		k = strings.ToLower(k)
		if _, isKey := known[prefix+k]; isKey {
			out[prefix+k] = val
			continue
		}
		if sub, ok := val.(map[string]any); ok && len(sub) > 0 {
			maps.Copy(out, flatten(prefix+k+".", sub, known))
			continue
		}
		out[prefix+k] = val
	}
	return out
}

// splitEnv returns the environment variables that set keys, by name, and the
// names of the other XDSRELAY_ variables.
func splitEnv(environ []string) (env map[string]string, unknown []string) {
	keys := map[string]bool{}
	for _, s := range settings(new(Options)) {
		keys[envName(s.key)] = true
	}
	env = map[string]string{}
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		switch {
		case keys[name]:
			env[name] = val
		case strings.HasPrefix(name, envPrefix) && !serviceLink(name):
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	return env, slices.Compact(unknown)
}

// serviceLink reports whether name is one of the variables Kubernetes sets in
// every pod for a Service named xdsrelay (XDSRELAY_SERVICE_HOST,
// XDSRELAY_PORT_18001_TCP, ...): not a misspelt key, so not worth a warning.
func serviceLink(name string) bool {
	rest := strings.TrimPrefix(name, envPrefix)
	return rest == "PORT" || strings.HasPrefix(rest, "PORT_") || strings.HasPrefix(rest, "SERVICE_")
}

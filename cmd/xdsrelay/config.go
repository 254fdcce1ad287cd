package main

import (
	"errors"
	"fmt"
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
// os.Environ); the environment overrides the file. An error is one line
// naming the key. unknownEnv lists the XDSRELAY_ variables that set no key,
// for the caller to warn about.
func loadConfig(file string, environ []string) (o Options, unknownEnv []string, err error) {
	fileVals, err := readFile(file)
	if err != nil {
		return Options{}, nil, err
	}
	env, unknownEnv := splitEnv(environ)
	o = defaultOptions()
	for _, s := range settings(&o) {
		if err := apply(s, fileVals, env); err != nil {
			return Options{}, nil, err
		}
	}
	if err := finish(&o); err != nil {
		return Options{}, nil, err
	}
	return o, unknownEnv, nil
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

// finish checks what spans keys and validates the relay's configuration.
func finish(o *Options) error {
	if o.LogFormat != "text" && o.LogFormat != "json" {
		return fmt.Errorf("log.format: %q is not text or json", o.LogFormat)
	}
	if o.Tracing.Endpoint != "" {
		if _, _, err := net.SplitHostPort(o.Tracing.Endpoint); err != nil {
			return fmt.Errorf("tracing.otlp_endpoint: %q is not host:port", o.Tracing.Endpoint)
		}
		o.Relay.Tracing = true
	}
	return o.Relay.Validate()
}

// readFile returns the file's values by key; nothing when file is "". A key
// the relay does not know is an error: a typo must not silently leave a
// default in place.
func readFile(file string) (map[string]any, error) {
	if file == "" {
		return nil, nil
	}
	if err := sameKeysInCase(file); err != nil {
		return nil, err
	}
	v := viper.New()
	v.SetConfigFile(file)
	v.SetConfigType("yaml")
	if err := v.ReadInConfig(); err != nil {
		return nil, fmt.Errorf("config %s: %w", file, err)
	}
	known := settingsByKey(new(Options))
	vals := flatten("", v.AllSettings(), known)
	for _, k := range slices.Sorted(maps.Keys(vals)) {
		if _, ok := known[k]; !ok {
			return nil, fmt.Errorf("config %s: unknown key %q", file, k)
		}
	}
	if err := keepCase(file, vals, known); err != nil {
		return nil, err
	}
	return vals, nil
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

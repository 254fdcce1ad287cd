package main

import (
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/viper"

	"github.com/xdsrelay/xdsrelay/relay"
)

// Options are what the configuration gives the binary: the relay's own
// configuration and how to log.
type Options struct {
	Relay    relay.Config
	LogLevel slog.Level
	Tracing  TracingOptions
}

// keys are every configuration key, with its default. Each can be set in
// the file or by XDSRELAY_<KEY> (dots become underscores).
var keys = func() map[string]any {
	d := relay.Default()
	return map[string]any{
		"upstream.address":                  d.Upstream.Address,
		"upstream.group_by":                 d.Upstream.GroupBy,
		"upstream.addresses":                []string{},
		"upstream.reconnect.base_delay":     d.Upstream.ReconnectBaseDelay.String(),
		"upstream.reconnect.max_delay":      d.Upstream.ReconnectMaxDelay.String(),
		"upstream.max_message_bytes":        d.Upstream.MaxMessageBytes,
		"upstream.keepalive.time":           d.Upstream.KeepaliveTime.String(),
		"upstream.keepalive.timeout":        d.Upstream.KeepaliveTimeout.String(),
		"upstream.tls.enabled":              false,
		"upstream.tls.cert_file":            "",
		"upstream.tls.key_file":             "",
		"upstream.tls.ca_file":              "",
		"upstream.tls.server_name":          "",
		"upstream.tls.insecure_skip_verify": false,
		"upstream.headers":                  map[string]any{},
		"downstream.tls.cert_file":          "",
		"downstream.tls.key_file":           "",
		"downstream.tls.client_ca_file":     "",
		"downstream.address":                d.Downstream.Address,
		"downstream.rest_address":           d.Downstream.RESTAddress,
		"downstream.poll_timeout":           d.Downstream.PollTimeout.String(),
		"downstream.send_timeout":           d.Downstream.SendTimeout.String(),
		"downstream.max_request_bytes":      d.Downstream.MaxRequestBytes,
		"admin.address":                     d.Admin.Address,
		"cache.retention":                   d.Cache.Retention.String(),
		"cache.max_resources":               d.Cache.MaxResources,
		"cache.persist_dir":                 d.Cache.PersistDir,
		"cache.persist_interval":            d.Cache.PersistInterval.String(),
		"shutdown_timeout":                  d.ShutdownTimeout.String(),
		"log.level":                         "info",
		"tracing.otlp_endpoint":             "",
		"tracing.insecure":                  false,
		"tracing.sample_ratio":              0.01,
	}
}()

// loadConfig reads the file (if any) and the environment. An error names the
// key at fault.
func loadConfig(file string, env func(string) (string, bool)) (Options, error) {
	v := viper.New()
	v.SetEnvPrefix("XDSRELAY")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	for k, d := range keys {
		v.SetDefault(k, d)
		envName := "XDSRELAY_" + strings.ToUpper(strings.ReplaceAll(k, ".", "_"))
		if val, ok := env(envName); ok {
			v.Set(k, val)
		}
	}
	if file != "" {
		v.SetConfigFile(file)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return Options{}, fmt.Errorf("config %s: %w", file, err)
		}
		if err := checkKeys(file, v); err != nil {
			return Options{}, err
		}
	}
	var o Options
	o.Relay = relay.Default()
	var errs []error
	str := func(key string, dst *string) {
		s, err := getString(v, key)
		errs = append(errs, err)
		*dst = s
	}
	dur := func(key string, dst *time.Duration) {
		s, err := getString(v, key)
		if err == nil {
			*dst, err = time.ParseDuration(s)
			if err != nil {
				err = fmt.Errorf("%s: %q is not a duration (e.g. 30s, 5m)", key, s)
			}
		}
		errs = append(errs, err)
	}
	boolean := func(key string, dst *bool) {
		b, err := getBool(v, key)
		errs = append(errs, err)
		*dst = b
	}
	var err error
	integer := func(key string, dst *int) {
		n, err := getInt(v, key)
		errs = append(errs, err)
		*dst = n
	}
	str("upstream.address", &o.Relay.Upstream.Address)
	o.Relay.Upstream.GroupBy, errs = getList(v, "upstream.group_by"), append(errs, nil)
	o.Relay.Upstream.Addresses = getList(v, "upstream.addresses")
	dur("upstream.reconnect.base_delay", &o.Relay.Upstream.ReconnectBaseDelay)
	dur("upstream.reconnect.max_delay", &o.Relay.Upstream.ReconnectMaxDelay)
	integer("upstream.max_message_bytes", &o.Relay.Upstream.MaxMessageBytes)
	dur("upstream.keepalive.time", &o.Relay.Upstream.KeepaliveTime)
	dur("upstream.keepalive.timeout", &o.Relay.Upstream.KeepaliveTimeout)
	boolean("upstream.tls.enabled", &o.Relay.Upstream.TLSEnabled)
	str("upstream.tls.cert_file", &o.Relay.Upstream.TLS.CertFile)
	str("upstream.tls.key_file", &o.Relay.Upstream.TLS.KeyFile)
	str("upstream.tls.ca_file", &o.Relay.Upstream.TLS.CAFile)
	str("upstream.tls.server_name", &o.Relay.Upstream.TLS.ServerName)
	boolean("upstream.tls.insecure_skip_verify", &o.Relay.Upstream.TLS.Insecure)
	o.Relay.Upstream.Headers, err = getMap(v, "upstream.headers")
	errs = append(errs, err)
	str("downstream.tls.cert_file", &o.Relay.Downstream.TLS.CertFile)
	str("downstream.tls.key_file", &o.Relay.Downstream.TLS.KeyFile)
	str("downstream.tls.client_ca_file", &o.Relay.Downstream.TLS.CAFile)
	str("downstream.address", &o.Relay.Downstream.Address)
	str("downstream.rest_address", &o.Relay.Downstream.RESTAddress)
	dur("downstream.poll_timeout", &o.Relay.Downstream.PollTimeout)
	dur("downstream.send_timeout", &o.Relay.Downstream.SendTimeout)
	integer("downstream.max_request_bytes", &o.Relay.Downstream.MaxRequestBytes)
	str("admin.address", &o.Relay.Admin.Address)
	dur("cache.retention", &o.Relay.Cache.Retention)
	integer("cache.max_resources", &o.Relay.Cache.MaxResources)
	str("cache.persist_dir", &o.Relay.Cache.PersistDir)
	dur("cache.persist_interval", &o.Relay.Cache.PersistInterval)
	dur("shutdown_timeout", &o.Relay.ShutdownTimeout)
	var level string
	str("log.level", &level)
	str("tracing.otlp_endpoint", &o.Tracing.Endpoint)
	boolean("tracing.insecure", &o.Tracing.Insecure)
	o.Tracing.SampleRatio, err = getRatio(v, "tracing.sample_ratio")
	errs = append(errs, err)
	for _, err := range errs {
		if err != nil {
			return Options{}, err // one clear line: the first key at fault
		}
	}
	if err := o.LogLevel.UnmarshalText([]byte(level)); err != nil {
		return Options{}, fmt.Errorf("log.level: %q is not one of debug, info, warn, error", level)
	}
	if o.Tracing.Endpoint != "" {
		if _, _, err := net.SplitHostPort(o.Tracing.Endpoint); err != nil {
			return Options{}, fmt.Errorf("tracing.otlp_endpoint: %q is not host:port", o.Tracing.Endpoint)
		}
		o.Relay.Tracing = true
	}
	if err := o.Relay.Validate(); err != nil {
		return Options{}, err
	}
	return o, nil
}

// checkKeys rejects keys the relay does not know: a typo must not silently
// leave a default in place.
func checkKeys(file string, v *viper.Viper) error {
	for _, k := range slices.Sorted(maps.Keys(flatten("", v.AllSettings()))) {
		if _, ok := keys[k]; !ok {
			return fmt.Errorf("config %s: unknown key %q", file, k)
		}
	}
	return nil
}

func flatten(prefix string, m map[string]any) map[string]any {
	out := map[string]any{}
	for k, val := range m {
		if _, isKey := keys[prefix+k]; isKey {
			out[prefix+k] = val // a key whose value is a map (upstream.headers)
			continue
		}
		if sub, ok := val.(map[string]any); ok && len(sub) > 0 {
			maps.Copy(out, flatten(prefix+k+".", sub))
			continue
		}
		out[prefix+k] = val
	}
	return out
}

// known panics on a key missing from keys: a programming error that the
// tests catch, since such a key could not be set from the environment.
func known(key string) {
	if _, ok := keys[key]; !ok {
		panic("config: key " + key + " is not registered")
	}
}

func getString(v *viper.Viper, key string) (string, error) {
	known(key)
	switch val := v.Get(key).(type) {
	case string:
		return val, nil
	case nil:
		return "", nil
	case int:
		if val == 0 {
			return "0s", nil // a bare 0 is the one duration that needs no unit
		}
		return "", fmt.Errorf("%s: want a string, got %v (durations need a unit, e.g. %ds)", key, val, val)
	default:
		return "", fmt.Errorf("%s: want a string, got %v", key, val)
	}
}

// getList reads a list from YAML, or a comma-separated string from the
// environment.
func getList(v *viper.Viper, key string) []string {
	known(key)
	switch val := v.Get(key).(type) {
	case string:
		var out []string
		for _, s := range strings.Split(val, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out
	case []string:
		return val
	case []any:
		out := make([]string, 0, len(val))
		for _, s := range val {
			out = append(out, fmt.Sprint(s))
		}
		return out
	}
	return nil
}

func getInt(v *viper.Viper, key string) (int, error) {
	known(key)
	switch val := v.Get(key).(type) {
	case int:
		return val, nil
	case string: // from the environment
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil {
			return 0, fmt.Errorf("%s: %q is not a whole number", key, val)
		}
		return n, nil
	default:
		return 0, fmt.Errorf("%s: want a whole number, got %v", key, val)
	}
}

func getBool(v *viper.Viper, key string) (bool, error) {
	known(key)
	switch val := v.Get(key).(type) {
	case bool:
		return val, nil
	case string: // from the environment
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return false, fmt.Errorf("%s: %q is not true or false", key, val)
		}
		return b, nil
	default:
		return false, fmt.Errorf("%s: want true or false, got %v", key, val)
	}
}

// getMap reads a map of strings from YAML, or name=value pairs separated by
// commas from the environment.
func getMap(v *viper.Viper, key string) (map[string]string, error) {
	known(key)
	out := map[string]string{}
	switch val := v.Get(key).(type) {
	case map[string]any:
		for k, x := range val {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("%s.%s: want a string, got %v", key, k, x)
			}
			out[k] = s
		}
	case string:
		for _, kv := range strings.Split(val, ",") {
			if kv = strings.TrimSpace(kv); kv == "" {
				continue
			}
			k, x, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("%s: %q is not name=value", key, kv)
			}
			out[strings.TrimSpace(k)] = strings.TrimSpace(x)
		}
	case nil:
	default:
		return nil, fmt.Errorf("%s: want a map of names to values, got %v", key, val)
	}
	return out, nil
}

func getRatio(v *viper.Viper, key string) (float64, error) {
	known(key)
	var f float64
	switch val := v.Get(key).(type) {
	case float64:
		f = val
	case int:
		f = float64(val)
	case string: // from the environment
		var err error
		if f, err = strconv.ParseFloat(strings.TrimSpace(val), 64); err != nil {
			return 0, fmt.Errorf("%s: %q is not a number", key, val)
		}
	default:
		return 0, fmt.Errorf("%s: want a number from 0 to 1, got %v", key, val)
	}
	if f < 0 || f > 1 {
		return 0, fmt.Errorf("%s: %v is not between 0 and 1", key, f)
	}
	return f, nil
}

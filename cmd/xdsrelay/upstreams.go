package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/xdsrelay/xdsrelay/relay"
)

// upstreamEntrySettings are the keys of one entry of upstreams: name and
// types, and those of upstream.* (less group_by), declared once by
// upstreamSettings. The fields point into u.
func upstreamEntrySettings(u *relay.UpstreamConfig) []setting {
	return append([]setting{
		{"name", kindString, &u.Name, "[a-z0-9-]+, unique: the upstream in logs, metrics and /debug."},
		{"types", kindList, &u.Types, "Types the upstream serves, by any of their names: REST short names (clusters, secrets, ...), message names (Cluster), xDS abbreviations (cds) or type URLs."},
	}, upstreamSettings("", u)...)
}

// decodeUpstreams reads upstreams: a YAML list of maps, each with name,
// types and the keys of upstream.* but group_by, nested as they are there;
// from the environment, the same list in JSON. Each entry starts from
// relay.DefaultUpstream, not from upstream.*. Names, types and what each
// claims are checked by relay.Config.Validate.
func decodeUpstreams(raw any, fromEnv bool, dst *[]relay.UpstreamConfig) error {
	if s, ok := raw.(string); ok && fromEnv {
		if strings.TrimSpace(s) == "" {
			*dst = nil
			return nil
		}
		var err error
		if raw, err = decodeJSON(s); err != nil {
			return fmt.Errorf(`want a JSON list such as [{"name": "secrets", "address": "secrets:18000", "types": ["secrets"]}]: %v`, err)
		}
	}
	list, ok := raw.([]any)
	if !ok {
		return fmt.Errorf("want a list of upstreams, each a map with name and upstream keys ([] for none), got %v", raw)
	}
	out := make([]relay.UpstreamConfig, len(list))
	for i, e := range list {
		if key, err := decodeUpstream(e, &out[i]); err != nil {
			return &entryError{path: fmt.Sprintf("[%d]%s", i, key), err: err}
		}
	}
	*dst = out
	return nil
}

// decodeUpstream reads one entry of upstreams into u. key is where in the
// entry the error lies (".tls.ca_file"; "" for the entry as a whole). Names
// are matched without regard to case, as viper does for the file's keys.
func decodeUpstream(raw any, u *relay.UpstreamConfig) (key string, err error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return "", fmt.Errorf("want a map with name and upstream keys, got %v", raw)
	}
	*u = relay.DefaultUpstream()
	u.Name = "" // required: the default's name is not an entry's
	known := map[string]setting{}
	for _, s := range upstreamEntrySettings(u) {
		known[s.key] = s
	}
	vals := flatten("", m, known)
	for _, k := range slices.Sorted(maps.Keys(vals)) {
		s, ok := known[k]
		switch {
		case k == "group_by" || strings.HasPrefix(k, "group_by."):
			return ".group_by", errors.New("group_by is one setting for the whole relay (upstream.group_by), not one per upstream")
		case !ok:
			return "", fmt.Errorf("unknown key %q", k)
		}
		if err := s.set(vals[k], false); err != nil {
			return "." + k, err
		}
	}
	if u.Name == "" {
		return ".name", errors.New("required")
	}
	return "", nil
}

// An entryError is an error in one entry of a key whose value is a list;
// apply names it as the key followed by path: upstreams[1].tls.ca_file.
type entryError struct {
	path string // [1].tls.ca_file, or [0] for the entry as a whole
	err  error
}

func (e *entryError) Error() string { return e.path + ": " + e.err.Error() }
func (e *entryError) Unwrap() error { return e.err }

// decodeJSON decodes s, a single JSON value, as YAML would: whole numbers as
// int, other numbers as float64.
func decodeJSON(s string) (any, error) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("more after the JSON value")
	}
	return yamlNumbers(v), nil
}

// yamlNumbers replaces, in place, the json.Numbers in v by ints where they
// are whole and float64s where not.
func yamlNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return int(n)
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = yamlNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = yamlNumbers(e)
		}
	}
	return v
}

// formatUpstreams writes the upstreams' names: [] for none.
func formatUpstreams(us []relay.UpstreamConfig) string {
	names := make([]string, len(us))
	for i, u := range us {
		names[i] = u.Name
	}
	return "[" + strings.Join(names, ", ") + "]"
}

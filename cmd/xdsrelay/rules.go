package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/xdsrelay/xdsrelay/relay"
)

// decodeRules reads downstream.authorization.rules: a YAML list of maps,
// each with identity (a string) and node (a map of node field to pattern);
// from the environment, the same list in JSON. The rules' patterns are
// checked by relay.Config.Validate.
func decodeRules(raw any, fromEnv bool, dst *[]relay.AuthorizationRule) error {
	if s, ok := raw.(string); ok && fromEnv {
		if strings.TrimSpace(s) == "" {
			*dst = nil
			return nil
		}
		if err := json.Unmarshal([]byte(s), &raw); err != nil {
			return fmt.Errorf(`want a JSON list such as [{"identity": "spiffe://example.org/tenant/{tenant}", "node": {"cluster": "{tenant}"}}]: %v`, err)
		}
	}
	list, ok := raw.([]any)
	if !ok {
		return fmt.Errorf("want a list of rules, each with identity and node ([] for none), got %v", raw)
	}
	out := make([]relay.AuthorizationRule, 0, len(list))
	for i, e := range list {
		r, err := decodeRule(e)
		if err != nil {
			return fmt.Errorf("[%d]: %w", i, err)
		}
		out = append(out, r)
	}
	*dst = out
	return nil
}

func decodeRule(raw any) (relay.AuthorizationRule, error) {
	var r relay.AuthorizationRule
	m, ok := raw.(map[string]any)
	if !ok {
		return r, fmt.Errorf("want a map with identity and node, got %v", raw)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		var err error
		switch k {
		case "identity":
			err = decodeString(m[k], &r.Identity)
		case "node":
			err = decodeMap(m[k], false, &r.Node)
		case "authorities":
			err = decodeList(m[k], false, &r.Authorities)
		default:
			err = fmt.Errorf("unknown key (a rule has identity, node and authorities)")
		}
		if err != nil {
			return r, fmt.Errorf("%s: %w", k, err)
		}
	}
	return r, nil
}

// formatRules writes rules as the environment takes them: "[]" for none.
func formatRules(rules []relay.AuthorizationRule) string {
	if len(rules) == 0 {
		return "[]"
	}
	out := make([]map[string]any, len(rules))
	for i, r := range rules {
		out[i] = map[string]any{"identity": r.Identity, "node": r.Node}
		if len(r.Authorities) > 0 {
			out[i]["authorities"] = r.Authorities
		}
	}
	js, _ := json.Marshal(out)
	return string(js)
}

// keepCase puts back, in vals, the file's own values of the keys whose
// values are lists of maps (rules, upstreams): viper lowers the case of every
// map key it reads, and a node field such as metadata.NAMESPACE, or an
// upstream's node.metadata key, must keep its case. Sections are matched
// without regard to case, as viper does.
func keepCase(file string, vals map[string]any, known map[string]setting) error {
	var doc map[string]any
	for key := range vals {
		if k := known[key].kind; k != kindRules && k != kindUpstreams {
			continue
		}
		if doc == nil {
			b, err := os.ReadFile(file)
			if err != nil {
				return fmt.Errorf("config %s: %w", file, err)
			}
			if err := yaml.Unmarshal(b, &doc); err != nil {
				return fmt.Errorf("config %s: %w", file, err)
			}
		}
		if v, ok := lookupFold(doc, strings.Split(key, ".")); ok {
			vals[key] = v
		}
	}
	return nil
}

// lookupFold returns the value at path in nested maps, comparing names
// without regard to case.
func lookupFold(m map[string]any, path []string) (any, bool) {
	for k, v := range m {
		if !strings.EqualFold(k, path[0]) {
			continue
		}
		if len(path) == 1 {
			return v, true
		}
		if sub, ok := v.(map[string]any); ok {
			return lookupFold(sub, path[1:])
		}
	}
	return nil, false
}

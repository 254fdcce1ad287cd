package main

import (
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// sameKeysInCase refuses a file in which two keys of one map differ only
// in case (upstream: and UPSTREAM:): keys are read without regard to case,
// so one would silently override the other. The error names both, with
// their lines.
func sameKeysInCase(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("config %s: %w", file, err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("config %s: %w", file, err)
	}
	if err := caseClash("", &doc); err != nil {
		return fmt.Errorf("config %s: %w", file, err)
	}
	return nil
}

// caseClash walks n, whose dotted path is path, for a map with two keys
// equal but for case.
func caseClash(path string, n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			p := path
			if n.Kind == yaml.SequenceNode {
				p = fmt.Sprintf("%s[%d]", path, i)
			}
			if err := caseClash(p, c); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		seen := map[string]*yaml.Node{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if prev := seen[strings.ToLower(k.Value)]; prev != nil && prev.Value != k.Value {
				return fmt.Errorf("keys %q (line %d) and %q (line %d) differ only in case: keys are read without regard to case, keep one",
					join(path, prev.Value), prev.Line, join(path, k.Value), k.Line)
			}
			seen[strings.ToLower(k.Value)] = k
			if err := caseClash(join(path, k.Value), n.Content[i+1]); err != nil {
				return err
			}
		}
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

package upstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// yamlJSON writes a resource file's YAML as the JSON that protojson reads,
// and keeps where in the YAML each key and value of the JSON begins: an
// error protojson places in the JSON ("line 1:64") is then placed in the
// file as written.
type yamlJSON struct {
	b     []byte
	runes int       // runes written: protojson counts columns in runes
	at    []yamlPos // in the order written
	max   int       // bytes the JSON may take: aliases can expand a small file
}

// yamlPos is where a key or value that begins at a rune of the JSON is in
// the YAML.
type yamlPos struct{ rune, line, column int }

// errTooLarge bounds the JSON of a resource whose aliases expand it.
var errTooLarge = errors.New("its aliases expand it past the bound of 64 times the file")

func (j *yamlJSON) write(b []byte) error {
	if len(j.b)+len(b) > j.max {
		return errTooLarge
	}
	j.b = append(j.b, b...)
	j.runes += utf8.RuneCount(b)
	return nil
}

func (j *yamlJSON) mark(n *yaml.Node) { j.at = append(j.at, yamlPos{j.runes, n.Line, n.Column}) }

// node writes n: mappings as objects (their keys as strings), sequences as
// arrays, scalars as yaml decodes them into an interface (numbers, booleans,
// null, strings), aliases as what they name.
func (j *yamlJSON) node(n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return j.write([]byte("null"))
		}
		return j.node(n.Content[0])
	case yaml.AliasNode:
		return j.node(n.Alias)
	case yaml.SequenceNode:
		j.mark(n)
		return j.list(n.Content, '[', ']', false)
	case yaml.MappingNode:
		j.mark(n)
		return j.list(merged(n), '{', '}', true)
	}
	j.mark(n)
	var v any
	if err := n.Decode(&v); err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("line %d:%d: %w", n.Line, n.Column, err)
	}
	return j.write(b)
}

// list writes the nodes of a sequence, or the keys and values of a mapping.
func (j *yamlJSON) list(content []*yaml.Node, open, end byte, mapping bool) error {
	if err := j.write([]byte{open}); err != nil {
		return err
	}
	step := 1
	if mapping {
		step = 2
	}
	for i := 0; i+step <= len(content); i += step {
		if i > 0 {
			if err := j.write([]byte{','}); err != nil {
				return err
			}
		}
		if mapping {
			k := content[i]
			j.mark(k)
			key, _ := json.Marshal(k.Value)
			if err := j.write(append(key, ':')); err != nil {
				return err
			}
		}
		if err := j.node(content[i+step-1]); err != nil {
			return err
		}
	}
	return j.write([]byte{end})
}

// merged is a mapping's keys and values with its merge keys (<<: *other)
// resolved as yaml does: its own keys first, then those of the maps it
// merges that it does not have, the first map's first.
func merged(n *yaml.Node) []*yaml.Node {
	var out, merges []*yaml.Node
	own := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Tag == "!!merge" {
			merges = append(merges, v)
			continue
		}
		out = append(out, k, v)
		own[k.Value] = true
	}
	for _, m := range merges {
		m = unalias(m)
		maps := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			maps = m.Content
		}
		for _, mm := range maps {
			if mm = unalias(mm); mm.Kind != yaml.MappingNode {
				continue
			}
			kv := merged(mm)
			for i := 0; i+1 < len(kv); i += 2 {
				if !own[kv[i].Value] {
					own[kv[i].Value] = true
					out = append(out, kv[i], kv[i+1])
				}
			}
		}
	}
	return out
}

func unalias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// jsonPlace is how protojson places an error in its input; its spaces are
// now and then no-break spaces, on purpose.
var jsonPlace = regexp.MustCompile(`^proto:[ \x{00a0}]\(line (\d+):(\d+)\):[ \x{00a0}]`)

// placed is err with the place protojson gives it in the JSON replaced by
// the line and column in the YAML of the key or value that begins there,
// or else the last one before it.
func (j *yamlJSON) placed(err error) error {
	m := jsonPlace.FindStringSubmatch(err.Error())
	if m == nil || m[1] != "1" {
		return err
	}
	col, _ := strconv.Atoi(m[2])
	var at *yamlPos
	for i := range j.at {
		if j.at[i].rune > col-1 {
			break
		}
		at = &j.at[i]
	}
	if at == nil {
		return err
	}
	return fmt.Errorf("line %d:%d: %s", at.line, at.column, err.Error()[len(m[0]):])
}

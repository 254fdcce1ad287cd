package authz

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A pattern is a configured identity or node pattern: literal text, "*" (any
// run of characters without '/', possibly empty) and "{name}" (in an identity:
// captures a non-empty run of characters without '/'; in a node pattern:
// stands for the captured value).
type pattern []part

type part struct {
	kind partKind
	text string // the literal text, or the capture's name
}

type partKind int

const (
	literal partKind = iota
	star
	capture
)

// segment is what "*" and a capture match: never across a '/'.
const segment = `[^/]`

var captureName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parsePattern splits s into its parts; braces must pair around a name.
func parsePattern(s string) (pattern, error) {
	var p pattern
	for s != "" {
		i := strings.IndexAny(s, "{}*")
		switch {
		case i < 0:
			return append(p, part{literal, s}), nil
		case i > 0:
			p = append(p, part{literal, s[:i]})
		}
		s = s[i:]
		switch s[0] {
		case '*':
			p, s = append(p, part{kind: star}), s[1:]
		case '}':
			return nil, errors.New(`unbalanced braces: "}" without "{"`)
		case '{':
			end := strings.IndexAny(s[1:], "{}")
			if end < 0 || s[1+end] != '}' {
				return nil, errors.New(`unbalanced braces: "{" without "}"`)
			}
			name := s[1 : 1+end]
			if !captureName.MatchString(name) {
				return nil, fmt.Errorf("{%s}: a capture is named with letters, digits and '_'", name)
			}
			p, s = append(p, part{capture, name}), s[2+end:]
		}
	}
	return p, nil
}

// captures returns the names of p's captures, in order.
func (p pattern) captures() []string {
	var out []string
	for _, x := range p {
		if x.kind == capture {
			out = append(out, x.text)
		}
	}
	return out
}

// identityRegexp compiles an identity pattern; each capture is a group, in
// the order of p.captures(). A name captured twice is an error: the one
// value it stands for would be ambiguous.
func (p pattern) identityRegexp() (*regexp.Regexp, error) {
	seen := map[string]bool{}
	for _, name := range p.captures() {
		if seen[name] {
			return nil, fmt.Errorf("{%s} is captured twice", name)
		}
		seen[name] = true
	}
	return regexp.Compile("^" + p.source() + "$")
}

// source is p as an RE2 expression: literals quoted, "*" any run without
// '/', a capture a group of a non-empty run without '/'.
func (p pattern) source() string {
	var b strings.Builder
	for _, x := range p {
		switch x.kind {
		case literal:
			b.WriteString(regexp.QuoteMeta(x.text))
		case star:
			b.WriteString(segment + "*")
		case capture:
			b.WriteString("(" + segment + "+)")
		}
	}
	return b.String()
}

// expand returns p with each capture replaced by its value: what a node
// field must match, "*" left as it is.
func (p pattern) expand(values map[string]string) pattern {
	out := make(pattern, 0, len(p))
	for _, x := range p {
		if x.kind == capture {
			x = part{literal, values[x.text]}
		}
		out = append(out, x)
	}
	return out
}

// String writes p as configured (an expanded pattern with its values).
func (p pattern) String() string {
	var b strings.Builder
	for _, x := range p {
		switch x.kind {
		case literal:
			b.WriteString(x.text)
		case star:
			b.WriteString("*")
		case capture:
			b.WriteString("{" + x.text + "}")
		}
	}
	return b.String()
}

// match reports whether s matches the expanded pattern p (no captures left),
// in time linear in s: a plain comparison without "*", else an RE2 regexp.
func (p pattern) match(s string) bool {
	if !slices.ContainsFunc(p, func(x part) bool { return x.kind == star }) {
		return p.String() == s
	}
	re, err := regexp.Compile("^" + p.source() + "$")
	return err == nil && re.MatchString(s)
}

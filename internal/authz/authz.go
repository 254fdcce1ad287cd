package authz

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Rule is one configured rule: a client with an identity that matches
// Identity may claim a node whose fields (id, cluster, locality.region,
// locality.zone, locality.sub_zone, metadata.<key>) match the patterns in
// Node. Node patterns may use the captures of Identity.
type Rule struct {
	Identity string
	Node     map[string]string // node field → pattern
	// Authorities, if set, are the xdstp authorities (patterns, which may
	// use the captures of Identity) whose names the clients the rule
	// admits may ask for; an xdstp name of another authority is refused
	// (PERMISSION_DENIED, for that name alone). Other names are not
	// restricted. Empty: every authority.
	Authorities []string
}

// Authorizer checks clients against compiled rules. It is immutable and safe
// for concurrent use.
type Authorizer struct {
	rules []rule
}

type rule struct {
	index       int
	identity    *regexp.Regexp
	names       []string    // the identity's captures, by group
	node        []nodeMatch // by field name
	authorities []pattern   // nil: every authority
}

type nodeMatch struct {
	field string
	want  pattern
}

// New compiles rules. An error names the rule and field at fault, as
// rules[i].identity or rules[i].node.<field>.
func New(rules []Rule) (*Authorizer, error) {
	a := &Authorizer{}
	for i, r := range rules {
		cr, err := compile(i, r)
		if err != nil {
			return nil, err
		}
		a.rules = append(a.rules, cr)
	}
	return a, nil
}

func compile(i int, r Rule) (rule, error) {
	key := fmt.Sprintf("rules[%d]", i)
	if r.Identity == "" {
		return rule{}, fmt.Errorf("%s.identity: empty", key)
	}
	id, err := parsePattern(r.Identity)
	if err == nil {
		var re *regexp.Regexp
		if re, err = id.identityRegexp(); err == nil {
			cr := rule{index: i, identity: re, names: id.captures()}
			if err := cr.compileNode(key, r.Node); err != nil {
				return rule{}, err
			}
			return cr, cr.compileAuthorities(key, r.Authorities)
		}
	}
	return rule{}, fmt.Errorf("%s.identity: %q: %w", key, r.Identity, err)
}

func (cr *rule) compileNode(key string, node map[string]string) error {
	for _, f := range slices.Sorted(maps.Keys(node)) {
		fkey := key + ".node." + f
		if err := xds.CheckNodeField(f); err != nil {
			return fmt.Errorf("%s: %w", fkey, err)
		}
		if node[f] == "" {
			return fmt.Errorf(`%s: empty pattern (a node that leaves the field unset would match)`, fkey)
		}
		p, err := parsePattern(node[f])
		if err != nil {
			return fmt.Errorf("%s: %q: %w", fkey, node[f], err)
		}
		for _, name := range p.captures() {
			if !slices.Contains(cr.names, name) {
				return fmt.Errorf("%s: %q uses {%s}, which the identity does not capture", fkey, node[f], name)
			}
		}
		cr.node = append(cr.node, nodeMatch{field: f, want: p})
	}
	return nil
}

// compileAuthorities compiles a rule's authority patterns, whose
// captures must be the identity's.
func (cr *rule) compileAuthorities(key string, auths []string) error {
	for j, a := range auths {
		akey := fmt.Sprintf("%s.authorities[%d]", key, j)
		if a == "" || strings.ContainsAny(a, "/?#") {
			return fmt.Errorf("%s: %q is not an xdstp authority pattern", akey, a)
		}
		p, err := parsePattern(a)
		if err != nil {
			return fmt.Errorf("%s: %q: %w", akey, a, err)
		}
		for _, name := range p.captures() {
			if !slices.Contains(cr.names, name) {
				return fmt.Errorf("%s: %q uses {%s}, which the identity does not capture", akey, a, name)
			}
		}
		cr.authorities = append(cr.authorities, p)
	}
	return nil
}

// Reasons a client is denied, for a metric label.
const (
	ReasonIdentity = "identity" // no rule matches any of its identities
	ReasonNode     = "node"     // a rule matches an identity, not the node
)

// Denied is the error Check returns for a client that may not claim its
// node; its message names the identity and, when a rule matched the
// identity, the field that did not match.
type Denied struct {
	Reason string // ReasonIdentity or ReasonNode
	msg    string
}

func (d *Denied) Error() string { return d.msg }

// Check admits a client with identities (see Identities) that claims node
// when some rule matches one of the identities and all that rule's node
// patterns match the node; otherwise it returns a *Denied. When rules match
// an identity but not the node, the first such rule is the one reported.
func (a *Authorizer) Check(identities []string, node *corepb.Node) error {
	_, err := a.Grant(identities, node)
	return err
}

// Grant is Check that also returns what the admitted client may ask for:
// the authorities of every rule that admits it (see Rule.Authorities).
func (a *Authorizer) Grant(identities []string, node *corepb.Node) (*Grant, error) {
	if len(identities) == 0 {
		return nil, &Denied{ReasonIdentity, "the client certificate has no identity (URI SAN, DNS SAN or subject CN)"}
	}
	var first error
	var g *Grant
	for _, r := range a.rules {
		for _, id := range identities {
			values, err := r.check(id, node)
			switch {
			case values != nil && err == nil:
				g = g.add(&r, values)
			case values != nil && first == nil:
				first = err
			}
		}
	}
	if g != nil {
		return g, nil
	}
	if first != nil {
		return nil, first
	}
	return nil, &Denied{ReasonIdentity, "no rule matches " + describe(identities)}
}

// check reports, if id matches the rule's identity, its captures (nil if
// it does not match) and the first node field that does not match its
// pattern.
func (r *rule) check(id string, node *corepb.Node) (values map[string]string, err error) {
	m := r.identity.FindStringSubmatch(id)
	if m == nil {
		return nil, nil
	}
	values = make(map[string]string, len(r.names))
	for i, name := range r.names {
		values[name] = m[i+1]
	}
	for _, nm := range r.node {
		want := nm.want.expand(values)
		if got := xds.NodeField(node, nm.field); !want.match(got) {
			return values, &Denied{ReasonNode, fmt.Sprintf("identity %s may not claim node %s %s (rules[%d] wants %s)",
				quote(id), nm.field, quote(got), r.index, quote(want.String()))}
		}
	}
	return values, nil
}

// Grant is what an admitted client may ask for: the xdstp authorities of
// the rules that admit it, expanded with their captures. A nil Grant, or
// one of a rule without authorities, allows every name.
type Grant struct {
	all         bool
	authorities []pattern
}

// add returns g with what rule r admits, its captures values.
func (g *Grant) add(r *rule, values map[string]string) *Grant {
	if g == nil {
		g = &Grant{}
	}
	if r.authorities == nil {
		g.all = true
		return g
	}
	for _, p := range r.authorities {
		g.authorities = append(g.authorities, p.expand(values))
	}
	return g
}

// Allows reports whether the client may ask for name: any name but an
// xdstp one of an authority its rules do not list.
func (g *Grant) Allows(name string) bool {
	if g == nil || g.all {
		return true
	}
	auth, ok := xds.Authority(name)
	if !ok {
		return true
	}
	for _, p := range g.authorities {
		if p.match(auth) {
			return true
		}
	}
	return false
}

// maxQuoted bounds a client-provided text quoted in a denial, so that a
// node id of megabytes does not become a status message of megabytes.
const maxQuoted = 256

func quote(s string) string {
	if len(s) <= maxQuoted {
		return fmt.Sprintf("%q", s)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q…(%d bytes)", s[:cut], len(s))
}

// maxListed bounds the identities a denial lists.
const maxListed = 4

func describe(ids []string) string {
	if len(ids) == 1 {
		return "identity " + quote(ids[0])
	}
	var q []string
	for _, id := range ids[:min(len(ids), maxListed)] {
		q = append(q, quote(id))
	}
	s := "identities " + strings.Join(q, ", ")
	if len(ids) > maxListed {
		s += fmt.Sprintf(" and %d more", len(ids)-maxListed)
	}
	return s
}

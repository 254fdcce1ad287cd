package upstream

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// DefaultUpstream names the default control plane (upstream.*) in logs,
// metrics, /debug and saved caches.
const DefaultUpstream = "default"

// Unroutable is what Routes.Of returns for an xdstp name whose authority
// no upstream lists: a name that does not exist.
const Unroutable = -1

// Claim is what one upstream serves: the authorities and types it lists.
type Claim struct {
	Name        string   // [a-z0-9-]+; DefaultUpstream for the default
	Types       []string // type URLs (never for the default)
	Authorities []string
}

// Routes decide which upstream serves a name (docs/architecture.md,
// invariant 11 "Each name has one control plane"): a pure function of the
// name and its type. Upstream 0 is the default. Read-only after NewRoutes.
type Routes struct {
	names       []string
	byType      map[string]int
	byAuthority map[string]int
}

var validName = regexp.MustCompile(`^[a-z0-9-]+$`)

// NewRoutes checks the claims and indexes them. claims[0] is the default
// upstream; it may list authorities but no types. A type or an authority
// claimed twice is an error, as is a name used twice or not [a-z0-9-]+.
func NewRoutes(claims []Claim) (*Routes, error) {
	if len(claims) == 0 || claims[0].Name != DefaultUpstream || len(claims[0].Types) > 0 {
		return nil, errors.New("upstream: the first claim is the default upstream's, without types")
	}
	r := &Routes{byType: map[string]int{}, byAuthority: map[string]int{}}
	for i, c := range claims {
		if i > 0 && (!validName.MatchString(c.Name) || c.Name == DefaultUpstream) {
			return nil, fmt.Errorf("upstream %q: a name is [a-z0-9-]+ and not %q", c.Name, DefaultUpstream)
		}
		if slices.Contains(r.names, c.Name) {
			return nil, fmt.Errorf("upstream %q: the name is used twice", c.Name)
		}
		r.names = append(r.names, c.Name)
		for _, t := range c.Types {
			if j, ok := r.byType[t]; ok {
				return nil, fmt.Errorf("upstream %q: type %s is claimed by %q too", c.Name, t, r.names[j])
			}
			r.byType[t] = i
		}
		for _, a := range c.Authorities {
			if a == "" || strings.ContainsAny(a, "/?#") {
				return nil, fmt.Errorf("upstream %q: %q is not an xdstp authority", c.Name, a)
			}
			if j, ok := r.byAuthority[a]; ok {
				return nil, fmt.Errorf("upstream %q: authority %q is claimed by %q too", c.Name, a, r.names[j])
			}
			r.byAuthority[a] = i
		}
	}
	return r, nil
}

// Of returns the index of the upstream that serves name of typeURL, or
// Unroutable ("xDS Resource Names"; gRFC A47):
//  1. an xdstp name goes to the upstream listing its authority; with
//     authorities listed but not this one, it is Unroutable. When no upstream
//     lists any authority, xdstp names are routed as other names are;
//  2. any other name, and the wildcard ("*"), goes to the upstream listing
//     the type, else to the default.
func (r *Routes) Of(typeURL, name string) int {
	if len(r.byAuthority) > 0 {
		if auth, ok := xds.Authority(name); ok {
			if i, ok := r.byAuthority[auth]; ok {
				return i
			}
			return Unroutable
		}
	}
	return r.byType[typeURL] // 0, the default, when no one lists the type
}

// Len is the number of upstreams, the default included.
func (r *Routes) Len() int { return len(r.names) }

// Name is upstream i's name.
func (r *Routes) Name(i int) string { return r.names[i] }

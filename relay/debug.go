package relay

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// The /debug/ paths of the admin endpoint: per-client status, groups and
// cache contents, as JSON. They reveal the tenants, so they are served only
// to the callers the access rule lets see the views, and the releases only
// to those it lets change the process (see adminListener.access); others
// get 403.
//
// Every admin body is bounded whatever clients put in their nodes: a group
// is shown by its id (GroupID, at most IDMax bytes), and its whole key only
// in /debug/groups, clipped; the paths that take a group accept its id or
// its key; node ids and peers' texts are clipped (xds.Clip).

// clipList is a client-chosen list as an admin body shows it: as many
// entries as fit in xds.MaxText bytes, then how many more there are.
func clipList(list []string) []string {
	out := make([]string, 0, len(list))
	left := xds.MaxText
	for i, e := range list {
		if len(e) > left {
			return append(out, fmt.Sprintf("…(%d more)", len(list)-i))
		}
		out = append(out, e)
		left -= len(e)
	}
	return out
}

// groupNamed is the group that name names (matchesGroup: its id or its
// key); nil if there is none.
func (r *Relay) groupNamed(name string) *group {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g := r.groups[name]; g != nil {
		return g
	}
	for _, g := range r.groups {
		if matchesGroup(name, g.key, g.id) {
			return g
		}
	}
	return nil
}

func (r *Relay) debugRoutes(mux *http.ServeMux, l adminListener) {
	mux.HandleFunc("GET /debug/clients", gate(l, accessViews, r.debugClients))
	mux.HandleFunc("GET /debug/groups", gate(l, accessViews, r.debugGroups))
	mux.HandleFunc("GET /debug/cache", gate(l, accessViews, r.debugCache))
	mux.HandleFunc("GET /debug/convergence", gate(l, accessViews, r.debugConvergence))
	mux.HandleFunc("GET /debug/references", gate(l, accessViews, r.debugReferences))
	mux.HandleFunc("GET /debug/fleet", gate(l, accessViews, r.debugFleet))
	mux.HandleFunc("GET /debug/config_dump", gate(l, accessViews, r.debugConfigDump))
	mux.HandleFunc("GET /debug/guard/holds", gate(l, accessViews, r.debugGuardHolds))
	mux.HandleFunc("GET /debug/rollout/changes", gate(l, accessViews, r.debugRolloutChanges))
	mux.HandleFunc("POST /debug/guard/release", gate(l, accessAll, r.guardRelease))
	mux.HandleFunc("POST /debug/rollout/release", gate(l, accessAll, r.rolloutRelease))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		http.Error(w, "xdsrelay: "+err.Error(), http.StatusInternalServerError)
	}
}

type debugType struct {
	Type        string     `json:"type"`
	Subscribed  int        `json:"subscribed"` // names subscribed by name
	Wildcard    bool       `json:"wildcard"`
	Resources   int        `json:"resources"` // names with a status (sent, absent or requested)
	AckVersion  string     `json:"last_ack_version,omitempty"`
	NackVersion string     `json:"last_nack_version,omitempty"`
	NackError   string     `json:"last_nack_error,omitempty"`
	NackAt      *time.Time `json:"last_nack_time,omitempty"`
}

type debugClient struct {
	Node    string      `json:"node"`
	Group   string      `json:"group"`
	Variant string      `json:"variant"`
	Types   []debugType `json:"types"`
}

// debugClients lists every live xDS stream, from the streams' status.
func (r *Relay) debugClients(w http.ResponseWriter, _ *http.Request) {
	keys := map[*cache.Cache]string{}
	for _, g := range r.snapshotGroups() {
		keys[g.cache] = g.id
	}
	out := []debugClient{}
	for _, c := range r.down.Clients(nil) {
		dc := debugClient{Node: xds.Clip(c.Node.GetId()), Group: keys[c.Cache], Variant: c.Variant, Types: []debugType{}}
		for _, t := range c.Types {
			dt := debugType{Type: t.TypeURL, Subscribed: t.Named, Wildcard: t.Wildcard, Resources: len(t.Resources),
				AckVersion: xds.Clip(t.AckVersion), NackVersion: xds.Clip(t.NackVersion), NackError: xds.Clip(t.NackError)}
			if !t.NackAt.IsZero() {
				dt.NackAt = &t.NackAt
			}
			dc.Types = append(dc.Types, dt)
		}
		out = append(out, dc)
	}
	writeJSON(w, out)
}

type debugGroupType struct {
	Type     string `json:"type"`
	Wildcard bool   `json:"wildcard"`
	Names    int    `json:"names"` // subscribed upstream by name
}

// debugUpstream is one upstream a group has a stream to.
type debugUpstream struct {
	Name         string     `json:"name"`
	Server       string     `json:"server,omitempty"`   // the server in use (gRFC A71), or the file:// address of resource files
	Protocol     string     `json:"protocol,omitempty"` // what the server answered in (upstream.protocol)
	Connected    bool       `json:"connected"`
	LastError    string     `json:"last_error,omitempty"`
	Refused      string     `json:"refused,omitempty"`  // what the server refused on the last stream, and what is tried next
	Unserved     []string   `json:"unserved,omitempty"` // the types the server does not serve, not asked of it
	LastResponse *time.Time `json:"last_response,omitempty"`
}

type debugGroup struct {
	ID  string `json:"id"`  // GroupID: the group's name everywhere else
	Key string `json:"key"` // the whole group key, clipped (xds.Clip)
	// The kind the group's clients share, as its upstream node presents
	// it: the user agent (name/version) and the client features.
	UserAgent      string           `json:"user_agent"`
	ClientFeatures []string         `json:"client_features"`
	Upstreams      []debugUpstream  `json:"upstreams"`
	Holds          []debugHold      `json:"guard_holds"` // removals held by the guard
	Rollouts       []debugRollout   `json:"rollouts"`    // changes waiting for the canaries
	Connected      bool             `json:"upstream_connected"`
	LastError      string           `json:"upstream_last_error,omitempty"`
	Invalid        string           `json:"invalid,omitempty"`
	LastResponse   *time.Time       `json:"last_response,omitempty"`
	Resources      int              `json:"resources"`
	Clients        int              `json:"clients"`
	Types          []debugGroupType `json:"types"`
	Loads          *debugLoads      `json:"load_reports"` // null: no client has reported load (loads.go)
}

// shownUserAgent is the user agent a group's clients share: as its key
// has it under user_agent (a pre-release whole, where its upstream node
// presents it cut), with its whole version under user_agent_patch, else
// the one its upstream node presents.
func (r *Relay) shownUserAgent(g *group) string {
	switch gb := r.cfg.Upstream.GroupBy; {
	case slices.Contains(gb, xds.FieldUserAgentPatch):
		return xds.UserAgentPatch(g.nodes[0])
	case slices.Contains(gb, xds.FieldUserAgent):
		return xds.UserAgent(g.fields)
	}
	return xds.UserAgent(g.nodes[0])
}

// debugGroups lists the groups: upstream state and what each subscribes.
func (r *Relay) debugGroups(w http.ResponseWriter, _ *http.Request) {
	out := []debugGroup{}
	for _, g := range r.snapshotGroups() {
		s := g.feed.Status()
		dg := debugGroup{ID: g.id, Key: xds.Clip(g.key), UserAgent: xds.Clip(r.shownUserAgent(g)), ClientFeatures: clipList(g.nodes[0].GetClientFeatures()),

			Connected: s.Connected, LastError: xds.Clip(s.LastError), Invalid: xds.Clip(s.Invalid),
			Resources: g.cache.Len(), Clients: r.groupClients(g), Types: []debugGroupType{}}
		if !s.LastResponse.IsZero() {
			dg.LastResponse = &s.LastResponse
		}
		dg.Holds = holdsOf(g.cache)
		dg.Rollouts = rolloutsOf(g.cache)
		dg.Loads = r.loadsOf(g)
		dg.Upstreams = []debugUpstream{}
		for _, u := range upstreamsOf(s) {
			du := debugUpstream{Name: u.Upstream, Server: r.filesOr(u), Protocol: u.Protocol, Connected: u.Connected, LastError: xds.Clip(u.LastError),
				Refused: xds.Clip(u.Refused), Unserved: u.Unserved}
			if !u.LastResponse.IsZero() {
				du.LastResponse = &u.LastResponse
			}
			dg.Upstreams = append(dg.Upstreams, du)
		}
		for typeURL, in := range g.cache.Interest() {
			dg.Types = append(dg.Types, debugGroupType{Type: typeURL, Wildcard: in.Wildcard, Names: len(in.Names)})
		}
		slices.SortFunc(dg.Types, func(a, b debugGroupType) int { return strings.Compare(a.Type, b.Type) })
		out = append(out, dg)
	}
	writeJSON(w, out)
}

// filesOr is the server an upstream's stream uses, or for resource files,
// which have none, their file:// address.
func (r *Relay) filesOr(u upstream.Status) string {
	if s := r.serverOf(u); u.Server == "" && strings.HasPrefix(s, "files ") {
		return strings.TrimPrefix(s, "files ")
	}
	return u.Server
}

func (r *Relay) groupClients(g *group) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return g.clients
}

type debugResource struct {
	Name     string          `json:"name"`
	Version  string          `json:"version"`
	Resource json.RawMessage `json:"resource,omitempty"`
}

// debugCache lists the resources of one type in one group's cache, with
// their bodies as protojson if bodies=true (but a Secret's: the admin
// endpoint never shows a private key); without a type, the groups
// and their types (debugCacheList).
func (r *Relay) debugCache(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	key, bodies := q.Get("group"), q.Get("bodies") == "true"
	if q.Get("type") == "" {
		r.debugCacheList(w, key)
		return
	}
	typeURL, err := xds.ParseType(q.Get("type"))
	if err != nil {
		http.Error(w, "xdsrelay: type: "+err.Error(), http.StatusBadRequest)
		return
	}
	if key == "" {
		http.Error(w, "xdsrelay: group: required with type (GET /debug/cache lists the groups and their types)", http.StatusBadRequest)
		return
	}
	g := r.groupNamed(key)
	if g == nil {
		http.Error(w, fmt.Sprintf("xdsrelay: no group %q (see /debug/cache)", xds.Clip(key)), http.StatusNotFound)
		return
	}
	out := []debugResource{}
	for _, res := range g.cache.State(typeURL).Resources {
		dr := debugResource{Name: res.Name, Version: res.Version}
		if bodies && typeURL != resourcev3.SecretType { // a private key is never shown
			b, err := resourceJSON(res)
			if err != nil {
				http.Error(w, fmt.Sprintf("xdsrelay: resource %q: %v", res.Name, err), http.StatusInternalServerError)
				return
			}
			dr.Resource = b
		}
		out = append(out, dr)
	}
	writeJSON(w, out)
}

// resourceJSON is a resource as protojson, as clients get it.
func resourceJSON(r *cache.Resource) (json.RawMessage, error) {
	a, err := xds.DecodeAny(r)
	if err != nil {
		return nil, err
	}
	b, err := xds.MarshalJSON(a)
	if err != nil {
		return nil, fmt.Errorf("protojson: %w", err)
	}
	return b, nil
}

// upstreamsOf lists the upstreams of a group's status: each one's for a
// group served by several, else the status itself.
func upstreamsOf(s upstream.Status) []upstream.Status {
	if len(s.Upstreams) > 0 {
		return s.Upstreams
	}
	if s.Upstream == "" {
		s.Upstream = upstream.DefaultUpstream
	}
	return []upstream.Status{s}
}

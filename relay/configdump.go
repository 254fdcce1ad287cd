package relay

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The admin endpoint's views of everything: one client's config dump
// (GET /debug/config_dump), the groups and types the caches hold (GET
// /debug/cache without a type), and the guard's holds and the rollout's
// changes (GET /debug/guard/holds, GET /debug/rollout/changes). Each reads
// what the streams and the caches already keep.

// maxDumpStreams bounds the streams one config dump shows: a node id is
// the client's to choose, and many clients may share one.
const maxDumpStreams = 100

// DebugConfigDump is the answer of GET /debug/config_dump.
type DebugConfigDump struct {
	Node    string            `json:"node"`
	Streams []DebugDumpStream `json:"streams"`
	// More counts the node's streams past maxDumpStreams, not shown.
	More int `json:"more,omitempty"`
}

// DebugDumpStream is what the client of one stream holds: its group and
// variant, and its config dump in the JSON form of Envoy's /config_dump
// (downstream.ConfigDump).
type DebugDumpStream struct {
	Group      string          `json:"group"`
	Variant    string          `json:"variant"`
	ConfigDump json.RawMessage `json:"config_dump"`
}

// debugConfigDump serves GET /debug/config_dump?node=ID[&type=T]: what
// every live stream of node ID holds, per type, with versions and its
// group, read from the streams' status records (as CSDS) and the groups'
// caches.
func (r *Relay) debugConfigDump(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	id := q.Get("node")
	if id == "" {
		http.Error(w, "xdsrelay: node: required, the node id of a client (see /debug/clients)", http.StatusBadRequest)
		return
	}
	var typeURL string
	if t := q.Get("type"); t != "" {
		var err error
		if typeURL, err = xds.ParseType(t); err != nil {
			http.Error(w, "xdsrelay: type: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	streams := r.down.Clients(func(n *corepb.Node) bool { return n.GetId() == id })
	if len(streams) == 0 {
		http.Error(w, fmt.Sprintf("xdsrelay: no client with node id %q is connected (see /debug/clients)", xds.Clip(id)), http.StatusNotFound)
		return
	}
	groups := r.groupNames()
	out := DebugConfigDump{Node: xds.Clip(id), Streams: []DebugDumpStream{}}
	if len(streams) > maxDumpStreams {
		out.More = len(streams) - maxDumpStreams
		streams = streams[:maxDumpStreams]
	}
	for _, c := range streams {
		dump, err := downstream.ConfigDump(c, typeURL)
		if err == nil {
			var b []byte
			if b, err = xds.MarshalEnvoyJSON(dump); err == nil {
				out.Streams = append(out.Streams, DebugDumpStream{Group: groups[c.Cache], Variant: c.Variant, ConfigDump: b})
			}
		}
		if err != nil {
			http.Error(w, "xdsrelay: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	writeJSON(w, out)
}

// groupNames maps each group's cache to its key as the admin endpoint
// shows it.
func (r *Relay) groupNames() map[*cache.Cache]string {
	keys := map[*cache.Cache]string{}
	for _, g := range r.snapshotGroups() {
		keys[g.cache] = g.id
	}
	return keys
}

// DebugCacheGroup is one group in the list GET /debug/cache answers
// without a type: its types and how many resources of each it holds.
type DebugCacheGroup struct {
	Group     string           `json:"group"`
	Resources int              `json:"resources"`
	Types     []DebugCacheType `json:"types"`
}

// DebugCacheType is one type of a group's cache.
type DebugCacheType struct {
	Type      string `json:"type"`
	Resources int    `json:"resources"`
	Version   uint64 `json:"version"` // the cache's version of the type: it changes whenever a resource of it does
}

// debugCacheList serves GET /debug/cache[?group=G] without a type: the
// groups (or group G) and, for each, the types its cache holds or wants
// and their sizes. It costs one step per type: the counts are kept as
// resources come and go.
func (r *Relay) debugCacheList(w http.ResponseWriter, shown string) {
	groups := r.snapshotGroups()
	if shown != "" {
		g := r.groupNamed(shown)
		if g == nil {
			http.Error(w, fmt.Sprintf("xdsrelay: no group %q (see /debug/cache)", xds.Clip(shown)), http.StatusNotFound)
			return
		}
		groups = []*group{g}
	}
	out := []DebugCacheGroup{}
	for _, g := range groups {
		dg := DebugCacheGroup{Group: g.id, Types: []DebugCacheType{}}
		for _, s := range g.cache.Sizes() {
			dg.Types = append(dg.Types, DebugCacheType{Type: s.TypeURL, Resources: s.Resources, Version: s.Version})
			dg.Resources += s.Resources
		}
		out = append(out, dg)
	}
	writeJSON(w, out)
}

// debugGuardHolds serves GET /debug/guard/holds[?group=G][&type=T]: the
// guard's holds, of one group or all, of one type or all; what
// POST /debug/guard/release would end.
func (r *Relay) debugGuardHolds(w http.ResponseWriter, req *http.Request) {
	list(r, w, req, func(g *group, typeURL string) (out []debugHold) {
		for _, h := range holdsOf(g.cache) {
			if typeURL == "" || h.Type == typeURL {
				h.Group = g.id
				out = append(out, h)
			}
		}
		return out
	})
}

// debugRolloutChanges serves GET /debug/rollout/changes[?group=G][&type=T]:
// the changes waiting for the canaries, held or not, of one group or all,
// changing one type or any.
func (r *Relay) debugRolloutChanges(w http.ResponseWriter, req *http.Request) {
	list(r, w, req, func(g *group, typeURL string) (out []debugRollout) {
		for _, d := range rolloutsOf(g.cache) {
			if typeURL == "" || slices.Contains(d.Types, typeURL) {
				d.Group = g.id
				out = append(out, d)
			}
		}
		return out
	})
}

// list answers the guard's or the rollout's list (see collect).
func list[T any](r *Relay, w http.ResponseWriter, req *http.Request, each func(g *group, typeURL string) []T) {
	if out, ok := collect(r, w, req, each); ok {
		writeJSON(w, out)
	}
}

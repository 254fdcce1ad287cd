package upstream

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// Protocol is the dialect a control plane's server is spoken to in
// (docs/architecture.md, invariant 16; spec "Variants of the xDS Transport
// Protocol"): incremental ADS, state-of-the-world ADS, or the per-type
// state-of-the-world services, one stream per type.
type Protocol string

// The protocols, as upstream.protocol names them.
const (
	ProtocolAuto        Protocol = "auto" // delta, then sotw, then sotw-per-type: the first the server does not refuse
	ProtocolDelta       Protocol = "delta"
	ProtocolSotW        Protocol = "sotw"
	ProtocolSotWPerType Protocol = "sotw-per-type"
)

// Protocols are the values of upstream.protocol, auto first.
var Protocols = []Protocol{ProtocolAuto, ProtocolDelta, ProtocolSotW, ProtocolSotWPerType}

// ParseProtocol reads upstream.protocol; "" is auto.
func ParseProtocol(s string) (Protocol, error) {
	if s == "" {
		return ProtocolAuto, nil
	}
	for _, p := range Protocols {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown protocol %q: want auto, delta, sotw or sotw-per-type", s)
}

// sotw reports whether p is a state-of-the-world dialect.
func (p Protocol) sotw() bool { return p == ProtocolSotW || p == ProtocolSotWPerType }

// next is what auto tries after a server refused p (refused); "" after
// the last.
func (p Protocol) next() Protocol {
	switch p {
	case ProtocolDelta:
		return ProtocolSotW
	case ProtocolSotW:
		return ProtocolSotWPerType
	}
	return ""
}

// found is what each server of a control plane was found to speak, shared
// by the groups' clients of one source, so that each server is found once
// (and found again when it changes: see forget). Safe for concurrent use.
type found struct {
	configured Protocol     // read-only; auto if the protocol is found
	upstream   string       // read-only: the metric's label
	peers      bool         // read-only: the servers are fleet members (Options.Peers)
	servers    []string     // read-only: the metric's series
	metrics    *Metrics     // read-only
	log        *slog.Logger // read-only

	mu    lockorder.Mutex[foundMu]
	found map[string]Protocol // by server name: to speak; guarded by mu
	shown map[string]Protocol // by server name: answered in, metric set; guarded by mu
	// unserved: by server, the types it refused (a per-type service, or a
	// stream ended in the server's words: refusal.go), with its words;
	// guarded by mu.
	unserved map[string]map[string]string
}

// newFound starts with nothing found of servers: the metrics show 0 for
// each of their protocols and types.
func newFound(p Protocol, upstream string, peers bool, servers []string, m *Metrics, log *slog.Logger) *found {
	if p == "" {
		p = ProtocolAuto
	}
	f := &found{configured: p, metrics: m, log: log, upstream: upstream, peers: peers, servers: servers,
		found: map[string]Protocol{}, shown: map[string]Protocol{}}
	for _, s := range servers {
		for _, q := range Protocols[1:] {
			m.Protocol.With(upstream, s, string(q)).Set(0)
		}
		for _, t := range xds.TypeLabels() {
			m.UnservedTypes.With(upstream, s, t).Set(0)
		}
	}
	return f
}

// of is the protocol to speak to server: the configured one, or what was
// found of it (delta, auto's first try, until something is found).
func (f *found) of(server string) Protocol {
	if f.configured != ProtocolAuto {
		return f.configured
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.found[server]; ok {
		return p
	}
	return ProtocolDelta
}

// refusedBy records that server refused p, in words; it returns the
// protocol to try next, or "" if there is none (the configured protocol
// was refused, or auto has tried them all: it starts again from delta
// after the backoff).
func (f *found) refusedBy(server string, p Protocol, words string) Protocol {
	next := p.next()
	if f.configured != ProtocolAuto || next == "" {
		f.forget(server)
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := f.found[server]; ok && cur != p {
		return cur // another group's client moved on first
	}
	f.found[server] = next
	f.log.Info("control plane server refused the protocol; trying the next (upstream.protocol: auto)",
		"upstream", f.upstream, "server", server, "refused", p, "error", words, "next", next)
	return next
}

// answered records that server answered in p: it is what the server
// speaks, shown in the metric and logged once.
func (f *found) answered(server string, p Protocol) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.found[server] = p
	if f.shown[server] == p {
		return
	}
	f.shown[server] = p
	for _, q := range Protocols[1:] {
		v := int64(0)
		if q == p {
			v = 1
		}
		f.metrics.Protocol.With(f.upstream, server, string(q)).Set(v)
	}
	if f.peers {
		f.log.Debug("fleet peer answers in "+string(p), "peer", server)
		return
	}
	f.log.Info("control plane server speaks "+string(p), "upstream", f.upstream, "server", server, "upstream.protocol", f.configured)
}

// forget drops what was found of server: it failed without answering, and
// may be another server when it is reached again (a new address, a new
// version), so auto starts from delta, and every type is asked of it
// again.
func (f *found) forget(server string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for typeURL := range f.unserved[server] {
		f.metrics.UnservedTypes.With(f.upstream, server, xds.ShortName(typeURL)).Set(0)
	}
	delete(f.unserved, server)
	if f.configured == ProtocolAuto {
		delete(f.found, server)
	}
}

// unserve records that server refused typeURL, in words, while it serves
// others: the type is asked of it no more (its names get UNAVAILABLE),
// until the server is found again. The first time, it is logged and shown
// in the metric; it reports whether it was.
func (f *found) unserve(server, typeURL, words string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unserved == nil {
		f.unserved = map[string]map[string]string{}
	}
	if f.unserved[server] == nil {
		f.unserved[server] = map[string]string{}
	}
	if _, ok := f.unserved[server][typeURL]; ok {
		return false
	}
	f.unserved[server][typeURL] = words
	f.metrics.UnservedTypes.With(f.upstream, server, xds.ShortName(typeURL)).Set(1)
	f.log.Warn("control plane server does not serve a type; not asked of it again",
		"upstream", f.upstream, "server", server, "type", xds.ShortName(typeURL), "error", words,
		"until", "a stream to the server fails without an answer (it restarted, or moved)",
		"clients", "names of the type that clients ask for get UNAVAILABLE; names resources point at are not fetched")
	return true
}

// isUnserved reports whether server refused typeURL, and in what words.
func (f *found) isUnserved(server, typeURL string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, ok := f.unserved[server][typeURL]
	return w, ok
}

// unservedOf is the types server refused, by short name, sorted; nil if
// none.
func (f *found) unservedOf(server string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, t := range slices.Sorted(maps.Keys(f.unserved[server])) {
		out = append(out, xds.ShortName(t))
	}
	return out
}

// retire deletes the metric's series (the source closes).
func (f *found) retire() {
	for _, s := range f.servers {
		for _, q := range Protocols[1:] {
			f.metrics.Protocol.Delete(f.upstream, s, string(q))
		}
		for _, t := range xds.TypeLabels() {
			f.metrics.UnservedTypes.Delete(f.upstream, s, t)
		}
	}
}

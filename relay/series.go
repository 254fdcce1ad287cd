package relay

import (
	"strings"

	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// Series born at 0. A counter whose series appears only at its first event
// shows Prometheus no increase for that event, and an alert on increase()
// misses it; a dashboard reads "no data" instead of 0. So every counter
// family whose labels take a finite set of values has all its series from
// the start, at 0; a group's series are born with the group. The families
// registered here are created elsewhere (upstream.NewMetrics, guard.go,
// rollout.go); the downstream's are zeroed where they are registered.

// zeroUpstreamSeries creates the upstream families' series, whatever the
// upstreams are (control planes, resource files, several): responses,
// NACKs and apply times of every type, fallbacks and stalls of every
// configured upstream (resource files never fall back nor stall), and the
// families only a router or resource files set (unroutable names, invalid
// resources).
// Every family of docs/metrics.md is then on /metrics from the start,
// but a group's, born with the group, and the certificates' expiry, one
// series per configured certificate (TestEveryFamilyFromTheStart).
func (r *Relay) zeroUpstreamSeries() {
	types := xds.TypeLabels()
	r.upm.Responses.ZeroEach(types...)
	r.upm.NACKs.ZeroEach(types...)
	for _, t := range types {
		r.upm.Apply.With(t)
	}
	for _, u := range append([]UpstreamConfig{r.cfg.Upstream.UpstreamConfig}, r.cfg.Upstreams...) {
		r.upm.Fallbacks.ZeroEach(u.Name)
		r.upm.Stalls.ZeroEach(u.Name)
		if strings.HasPrefix(u.Address, FilePrefix) {
			// A directory speaks no protocol and refuses no type: 0 for
			// each (a control plane's servers are set by its source,
			// upstream.NewADS).
			for _, p := range upstream.Protocols[1:] {
				r.upm.Protocol.With(u.Name, u.Address, string(p)).Set(0)
			}
			for _, t := range types {
				r.upm.UnservedTypes.With(u.Name, u.Address, t).Set(0)
			}
		}
	}
	upstream.RouterMetrics(r.metrics)
	upstream.FileMetrics(r.metrics)
}

// zeroGroupSeries creates a new group's counters, which end with it: the
// reconnects of its control-plane streams, which delete them as they end.
// Resource files have no stream: their groups' series (0 reconnects, always
// connected) are set, and deleted with the group, by registerGroupMetrics.
func (r *Relay) zeroGroupSeries(id string) {
	if !r.files() {
		r.upm.Reconnects.ZeroEach(id)
	}
}

// files reports whether the upstream is resource files alone.
func (r *Relay) files() bool {
	_, files := r.source.(*upstream.File)
	return files
}

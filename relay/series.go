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

// zeroUpstreamSeries creates the upstream families' series: responses and
// NACKs of every type, and fallbacks of every configured control plane.
func (r *Relay) zeroUpstreamSeries() {
	types := xds.TypeLabels()
	r.upm.Responses.ZeroEach(types...)
	r.upm.NACKs.ZeroEach(types...)
	for _, u := range append([]UpstreamConfig{r.cfg.Upstream.UpstreamConfig}, r.cfg.Upstreams...) {
		if !strings.HasPrefix(u.Address, FilePrefix) {
			r.upm.Fallbacks.ZeroEach(u.Name)
		}
	}
}

// zeroGroupSeries creates a new group's counters, which end with it: the
// reconnects of its control-plane streams, which delete them as they end.
// Resource files have no stream, and no reconnects.
func (r *Relay) zeroGroupSeries(key string) {
	if _, files := r.source.(*upstream.File); !files {
		r.upm.Reconnects.ZeroEach(key)
	}
}

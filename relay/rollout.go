package relay

import (
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The canary rollout's side in the relay ("Protecting the fleet" in the
// README): the caches gate the changes (cache.Rollout) and the streams
// pass their verdicts on; the relay logs and counts each step and shows
// what waits on /debug/groups.

type rolloutMetrics struct {
	halts    *metrics.Vec // by type
	releases *metrics.Vec // by type, how
}

func newRolloutMetrics(reg *metrics.Registry) rolloutMetrics {
	return rolloutMetrics{
		halts:    reg.Counter("xdsrelay_rollout_halts_total", "Changes from the control plane a canary client NACKed: held from the rest of the group (rollout.canary).", "type"),
		releases: reg.Counter("xdsrelay_rollout_releases_total", "Changes released to the whole group after the canaries: acked (every canary sent it ACKed) or baked (rollout.bake passed without a NACK).", "type", "how"),
	}
}

// rolloutEvent logs and counts a rollout step in group key.
func (r *Relay) rolloutEvent(key string, ev cache.RolloutEvent) {
	types := make([]string, len(ev.Types))
	for i, t := range ev.Types {
		types[i] = xds.ShortName(t)
	}
	attrs := []any{"group", xds.Clip(key), "types", strings.Join(types, ","), "resources", ev.Names, "canaries", ev.Canaries}
	switch ev.Kind {
	case cache.RolloutHalted:
		for _, t := range types {
			r.rolloutM.halts.With(t).Inc()
		}
		r.log.Error("rollout: a canary REJECTED a change from the control plane; it is held from the rest of the group until the control plane changes those resources again",
			append(attrs, "canary", xds.Clip(ev.Who), "error", xds.Clip(ev.Detail))...)
	case cache.RolloutReleased:
		how := "acked"
		if ev.Baked {
			how = "baked"
		}
		for _, t := range types {
			r.rolloutM.releases.With(t, how).Inc()
		}
		if ev.Baked && ev.Canaries == 0 {
			r.log.Warn("rollout: change released after rollout.bake with no canary sent it (no canary watches it)", attrs...)
			return
		}
		r.log.Info("rollout: change released to the group", append(attrs, "how", how)...)
	case cache.RolloutSuperseded:
		r.log.Info("rollout: a new change from the control plane supersedes a held one", attrs...)
	default:
		r.log.Debug("rollout: change sent to the canaries", attrs...)
	}
}

// debugRollout is a change waiting for release in a group.
type debugRollout struct {
	Since    time.Time `json:"since"`
	Types    []string  `json:"types"`
	Names    int       `json:"resources"`
	Canaries int       `json:"canaries"`
	Acked    int       `json:"acked"`
	Held     bool      `json:"held"`
	Canary   string    `json:"nacked_by,omitempty"`
	Error    string    `json:"nack_error,omitempty"`
}

func rolloutsOf(c *cache.Cache) []debugRollout {
	out := []debugRollout{}
	for _, s := range c.Rollouts() {
		out = append(out, debugRollout{Since: s.Since, Types: s.Types, Names: s.Names, Canaries: s.Canaries,
			Acked: s.Acked, Held: s.Held, Canary: s.Who, Error: s.Detail})
	}
	return out
}

package relay

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// The canary rollout's side in the relay (docs/protection.md, "NACK-gated
// canary rollout"): the caches gate the changes (cache.Rollout) and the streams
// pass their verdicts on; the relay logs and counts each step, shows what
// waits on /debug/groups and what a canary held on /readyz, and releases a
// held change on an operator's word (POST /debug/rollout/release).

// Ways a change is released, the how label of xdsrelay_rollout_releases_total.
const (
	releasedAcked    = "acked"    // every canary sent it ACKed it
	releasedBaked    = "baked"    // rollout.bake passed without a NACK
	releasedOperator = "operator" // held after a NACK, released by an operator
)

type rolloutMetrics struct {
	halts    *metrics.Vec // by type
	releases *metrics.Vec // by type, how
}

func newRolloutMetrics(reg *metrics.Registry) rolloutMetrics {
	return rolloutMetrics{
		halts: reg.Counter("xdsrelay_rollout_halts_total", "Changes from the control plane a canary client NACKed: held from the rest of the group (rollout.canary).", "type").
			ZeroEach(xds.TypeLabels()...),
		releases: reg.Counter("xdsrelay_rollout_releases_total", "Changes released to the whole group after the canaries: acked (every canary sent it ACKed), baked (rollout.bake passed without a NACK) or operator (held after a NACK, released by an operator).", "type", "how").
			Zero(metrics.Cross(xds.TypeLabels(), []string{releasedAcked, releasedBaked, releasedOperator})...),
	}
}

// rolloutEvent logs and counts a rollout step in group key.
func (r *Relay) rolloutEvent(id string, ev cache.RolloutEvent) {
	types := make([]string, len(ev.Types))
	for i, t := range ev.Types {
		types[i] = xds.ShortName(t)
	}
	attrs := []any{"group", id, "types", strings.Join(types, ","), "resources", ev.Names, "canaries", ev.Canaries}
	switch ev.Kind {
	case cache.RolloutHalted:
		for _, t := range types {
			r.rolloutM.halts.With(t).Inc()
		}
		r.log.Error("rollout: a canary REJECTED a change from the control plane; it is held from the rest of the group until the control plane changes those resources again",
			append(attrs, "canary", xds.Clip(ev.Who), "error", xds.Clip(ev.Detail))...)
	case cache.RolloutReleased:
		how := releasedAcked
		switch {
		case ev.Released:
			how = releasedOperator
		case ev.Baked:
			how = releasedBaked
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
	Group    string    `json:"group,omitempty"` // in a release's answer
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
		out = append(out, rolloutOf(s))
	}
	return out
}

func rolloutOf(s cache.RolloutState) debugRollout {
	return debugRollout{Since: s.Since, Types: s.Types, Names: s.Names, Canaries: s.Canaries,
		Acked: s.Acked, Held: s.Held, Canary: xds.Clip(s.Who), Error: xds.Clip(s.Detail)}
}

// rolloutRelease serves POST /debug/rollout/release[?group=G][&type=T]:
// the changes a canary NACKed, of one group or all, changing one type or
// any, are released to their groups.
func (r *Relay) rolloutRelease(w http.ResponseWriter, req *http.Request) {
	release(r, w, req, "rollout: held changes released by an operator", "changes", func(g *group, typeURL string) (out []debugRollout) {
		for _, s := range g.cache.ReleaseHeld(typeURL) {
			d := rolloutOf(s)
			d.Group = g.id
			out = append(out, d)
		}
		return out
	})
}

// rolloutDetail writes a group's held changes for the private /readyz.
func rolloutDetail(w io.Writer, c *cache.Cache) {
	for _, s := range c.Rollouts() {
		if !s.Held {
			continue
		}
		types := make([]string, len(s.Types))
		for i, t := range s.Types {
			types[i] = xds.ShortName(t)
		}
		fmt.Fprintf(w, "  DEGRADED: rollout of %d %s resources held since %s: canary %q NACKed it: %s (release: POST /debug/rollout/release)\n",
			s.Names, strings.Join(types, ","), s.Since.UTC().Format(time.RFC3339), xds.Clip(s.Who), xds.Clip(s.Detail))
	}
}

// heldRollouts reports whether a canary holds a change in c.
func heldRollouts(c *cache.Cache) bool {
	for _, s := range c.Rollouts() {
		if s.Held {
			return true
		}
	}
	return false
}

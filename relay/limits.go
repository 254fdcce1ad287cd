package relay

import (
	"strconv"

	"github.com/xdsrelay/xdsrelay/downstream"
)

// downstreamLimits are the limits.* keys the downstream edge enforces.
func downstreamLimits(cfg Config) downstream.Limits {
	l := cfg.Limits
	return downstream.Limits{
		MaxStreams:          l.MaxStreams,
		StreamRate:          l.StreamRate,
		StreamBurst:         l.StreamBurst,
		FirstRequestTimeout: l.FirstRequestTimeout,
		MaxNamesPerStream:   l.MaxNamesPerStream,
		RESTReadTimeout:     l.RESTReadTimeout,
	}
}

// checkGroupsLocked refuses a new group at limits.max_groups; the groups
// there are untouched.
func (r *Relay) checkGroupsLocked() error {
	if max := r.cfg.Limits.MaxGroups; max > 0 && len(r.groups) >= max {
		return &downstream.LimitError{Key: "limits.max_groups", Limit: strconv.Itoa(max), What: "no new group for this node"}
	}
	return nil
}

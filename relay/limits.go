package relay

import (
	"strconv"

	"google.golang.org/grpc/keepalive"

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
		MaxPolls:            l.MaxPolls,
	}
}

// connectionBounds are the downstream.max_connection_* keys as the gRPC
// server's keepalive parameters: GOAWAY after the age, so that clients
// reconnect and spread over the replicas (a new replica gets its share),
// a forced close after the grace for streams still open, and GOAWAY to a
// connection without streams after the idle bound. gRPC reads 0 as never,
// which is what 0 means for each key. The ±10% jitter on the age that
// docs/configuration.md promises is gRPC's own: grpc-go (v1.85.0,
// internal/transport/http2_server.go, newHTTP2Server) adds getJitter(age),
// uniform in ±10%, to MaxConnectionAge per connection, so connections made
// together do not all end together.
func connectionBounds(cfg Config) keepalive.ServerParameters {
	d := cfg.Downstream
	return keepalive.ServerParameters{
		MaxConnectionAge:      d.MaxConnectionAge,
		MaxConnectionAgeGrace: d.MaxConnectionAgeGrace,
		MaxConnectionIdle:     d.MaxConnectionIdle,
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

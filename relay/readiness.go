package relay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// Why the relay is not ready yet, with admin.ready_after_sync: what stands
// between it and its first sync, in general terms for anyone (the kind of
// failure, never an address) and in full for a private caller and the log.
// A pod whose control plane is misnamed or unreachable never becomes ready,
// and its /readyz says why.

// syncProblem says why the relay has nothing to serve yet.
type syncProblem struct {
	public  string // no address, group key or file name
	private string // the same with the upstream, the group and the error
}

// waitingSync is notReady's answer while admin.ready_after_sync waits.
const waitingSync = "waiting for the first upstream sync"

// refusesPublic is what anyone is told of a control plane that refused
// the protocol the relay speaks to it.
const refusesPublic = "the control plane refuses the protocol the relay speaks to it (upstream.protocol)"

// dialectRefusal is what a server refused when readiness asked it its
// dialect, before any group (upstream.ADS.Dialect).
type dialectRefusal struct {
	server, words string
	at            time.Time
}

// dialectRecheck is how long a refusal of the dialect stands before
// readiness asks the server again: it may be upgraded, or the
// configuration fixed behind the same address.
const dialectRecheck = 5 * time.Second

// speaks reports, before any group has a stream, whether a group's stream
// could get an answer: a server is reachable, and does not refuse the
// protocol the relay would speak to it. A refusal of it is a configuration
// error (upstream.protocol), which the operator must see before clients
// come: readiness asks the server (upstream.ADS.Dialect) rather than wait
// for a group, which only a ready relay is sent (docs/operations.md,
// "Readiness"; docs/architecture.md, invariant 20 "A refusal is an
// answer").
func (r *Relay) speaks() bool {
	i := r.reachable()
	if i < 0 || r.upADS == nil {
		return i >= 0
	}
	if d := r.refusal.Load(); d != nil && time.Since(d.at) < dialectRecheck {
		return false
	}
	if server, refused := r.upADS.Dialect(r.ctx, i, 0); refused != "" {
		r.refusal.Store(&dialectRefusal{server: server, words: refused, at: time.Now()})
		return false
	}
	r.refusal.Store(nil)
	return true
}

// syncProblem looks at what the first sync waits for: the groups'
// upstream streams or, before any group exists, the connection to the
// control plane.
func (r *Relay) syncProblem() syncProblem {
	if _, ok := r.source.(*upstream.File); ok {
		return syncProblem{public: "the resource files are not loaded yet", private: "the resource files are not loaded yet"}
	}
	if gs := r.snapshotGroups(); len(gs) > 0 {
		return groupsProblem(gs)
	}
	if r.upConn == nil {
		return syncProblem{}
	}
	if d := r.refusal.Load(); d != nil {
		return syncProblem{public: refusesPublic, private: fmt.Sprintf("upstream server %s %s", d.server, d.words)}
	}
	target := r.cfg.Upstream.Address
	connected := syncProblem{public: "the control plane has not answered yet", private: "upstream " + target + " connected, no answer yet"}
	switch r.upConn.GetState() {
	case connectivity.TransientFailure:
		err, failed := r.lastConnError()
		if !failed {
			return connected // since GetState
		}
		return syncProblem{
			public:  "the control plane cannot be reached (" + failureKind(err) + ")",
			private: fmt.Sprintf("upstream %s cannot be reached: %s", target, upstream.Explain(err)),
		}
	case connectivity.Ready:
		return connected
	default:
		return syncProblem{public: "connecting to the control plane", private: "connecting to upstream " + target}
	}
}

// groupsProblem is the first group's upstream that is down, or else what
// the groups wait for. A server that refused what the relay asked has
// answered: it is said to refuse, never to be unreachable
// (docs/architecture.md, invariant 20).
func groupsProblem(gs []*group) syncProblem {
	for _, g := range gs {
		for _, u := range upstreamsOf(g.feed.Status()) {
			if u.Connected || u.LastError == "" {
				continue
			}
			if u.Refused != "" {
				return syncProblem{
					public: refusesPublic,
					private: fmt.Sprintf("group %q: upstream %q (server %s) %s",
						g.id, u.Upstream, u.Server, xds.Clip(u.Refused)),
				}
			}
			return syncProblem{
				public: "the control plane cannot be reached (" + failureKind(u.LastError) + ")",
				private: fmt.Sprintf("group %q: upstream %q (server %s) cannot be reached: %s",
					g.id, u.Upstream, u.Server, xds.Clip(u.LastError)),
			}
		}
	}
	return syncProblem{public: "the control plane has not answered yet",
		private: fmt.Sprintf("%d %s waiting for the control plane's first answer", len(gs), plural(len(gs), "group", "groups"))}
}

// lastConnError is the error of the connection's last attempt to reach the
// control plane: a call that does not wait for the connection fails at once
// with it while the connection is in TRANSIENT_FAILURE (gRPC's
// wait-for-ready semantics), before anything is sent. failed is false if
// the call reached the control plane instead: the connection came up
// meanwhile (a control plane without gRPC health answers UNIMPLEMENTED).
func (r *Relay) lastConnError() (err string, failed bool) {
	ctx, cancel := context.WithTimeout(r.ctx, time.Second)
	defer cancel()
	cerr := r.upConn.Invoke(ctx, healthpb.Health_Check_FullMethodName, &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	switch status.Code(cerr) {
	case codes.OK, codes.Unimplemented, codes.NotFound:
		return "", false
	}
	return cerr.Error(), true
}

// failureKind names, in general terms, why a connection failed: what
// /readyz may say to anyone.
func failureKind(err string) string {
	has := func(words ...string) bool {
		for _, w := range words {
			if strings.Contains(err, w) {
				return true
			}
		}
		return false
	}
	switch {
	case upstream.Silent(err) != "":
		return upstream.Silent(err)
	case has("no such host", "produced zero addresses", "name resolver", "server misbehaving"):
		return "its name does not resolve"
	case has("connection refused"):
		return "connection refused"
	case has("x509", "certificate", "handshake", "tls:"):
		return "TLS handshake failed"
	case has("network is unreachable", "no route to host"):
		return "network unreachable"
	case has("i/o timeout", "deadline exceeded", "timed out"):
		return "connection timed out"
	}
	return "connection failing"
}

// notReadyLine is the first line of /readyz when the relay is not ready: why,
// and with admin.ready_after_sync what the first sync waits for.
func (r *Relay) notReadyLine(why string, priv bool) string {
	line := "not ready: " + why
	if why != waitingSync {
		return line
	}
	p := r.syncProblem()
	text := p.public
	if priv {
		text = p.private
	}
	if text != "" {
		line += ": " + text
	}
	return line
}

// logSyncProblem logs, at warn, why the relay is not ready yet, when that
// changes: what a pod that never becomes ready shows in its log.
func (r *Relay) logSyncProblem(last *string) {
	p := r.syncProblem()
	if p.private == "" || p.private == *last {
		return
	}
	*last = p.private
	r.log.Warn("not ready: waiting for the first upstream sync", "why", p.private, "doc", "docs/operations.md#readiness")
}

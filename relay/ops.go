package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/xdsrelay/xdsrelay/upstream"
)

// The operational parts of the relay: the run-time log level and pprof on
// the admin endpoint, gRPC health on the downstream port, and readiness
// (admin.ready_after_sync).

// mutexProfileFraction is the mutex profile's sampling with admin.pprof.
const mutexProfileFraction = 100 // keep in step with settings.go (AdminPaths reads it)

// opsRoutes adds /debug/loglevel and, with admin.pprof, /debug/pprof/ to
// mux: reading the level is a view, setting it and profiling are for the
// callers who may change or inspect the process (adminListener.access).
func (r *Relay) opsRoutes(mux *http.ServeMux, l adminListener) {
	if lv := r.cfg.LogLevel; lv != nil {
		mux.HandleFunc("GET /debug/loglevel", gate(l, accessViews, func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, strings.ToLower(lv.Level().String()))
		}))
		mux.HandleFunc("PUT /debug/loglevel", gate(l, accessAll, func(w http.ResponseWriter, req *http.Request) {
			r.setLogLevel(lv, w, req)
		}))
	}
	// Without admin.pprof, /debug/pprof/ and what is under it answer 404
	// saying how to turn the profiler on.
	index := http.HandlerFunc(pprofOff)
	if r.cfg.Admin.Pprof {
		// The mutex profile (/debug/pprof/mutex) is empty unless sampling
		// is on: 1 in mutexProfileFraction contention events, which costs
		// nothing while locks are not contended.
		runtime.SetMutexProfileFraction(mutexProfileFraction)
		index = gate(l, accessAll, pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", gate(l, accessAll, pprof.Cmdline))
		mux.HandleFunc("/debug/pprof/profile", gate(l, accessAll, pprof.Profile))
		mux.HandleFunc("/debug/pprof/symbol", gate(l, accessAll, pprof.Symbol))
		mux.HandleFunc("/debug/pprof/trace", gate(l, accessAll, pprof.Trace))
	}
	mux.HandleFunc("/debug/pprof/", index)
}

// pprofOff answers the profiler's paths while admin.pprof is off.
func pprofOff(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "xdsrelay: Go's profiler is off: it is served here with admin.pprof: true (XDSRELAY_ADMIN_PPROF=true), to private callers", http.StatusNotFound)
}

// setLogLevel sets lv from the request's body: debug, info, warn or error.
func (r *Relay) setLogLevel(lv *slog.LevelVar, w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 64))
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	word := strings.ToLower(strings.TrimSpace(string(body)))
	var l slog.Level
	if !validLevel(word) || l.UnmarshalText([]byte(word)) != nil {
		http.Error(w, "want one of debug, info, warn, error", http.StatusBadRequest)
		return
	}
	old := lv.Level()
	lv.Set(l)
	r.log.Warn("log level changed", "from", strings.ToLower(old.String()), "to", word)
	fmt.Fprintln(w, word)
}

func validLevel(word string) bool {
	switch word {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

// notReady says why /readyz and gRPC health do not report ready; "" when
// they do.
func (r *Relay) notReady() string {
	switch {
	case r.stopped.Load():
		return "shutting down"
	case !r.ready.Load():
		return "starting"
	case r.cfg.Admin.ReadyAfterSync && !r.synced.Load():
		return waitingSync
	}
	return ""
}

// updateHealth sets the gRPC health of the whole server ("") from notReady.
// After Shutdown has begun the health server ignores it.
func (r *Relay) updateHealth() {
	st := healthpb.HealthCheckResponse_SERVING
	if r.notReady() != "" {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	r.health.SetServingStatus("", st)
}

// watchSync waits, with admin.ready_after_sync, for the relay to have
// something to serve, then reports it ready. It checks every syncPoll until
// the relay stops.
func (r *Relay) watchSync() {
	if conn := r.upConn; conn != nil {
		conn.Connect() // leave IDLE, so that the connection's state says something
	}
	t := time.NewTicker(syncPoll)
	defer t.Stop()
	var logged string // the last reason logged
	for tick := 1; !r.hasSynced(); tick++ {
		if tick%syncLogEvery == 0 {
			r.logSyncProblem(&logged)
		}
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
	}
	r.synced.Store(true)
	r.updateHealth()
	r.log.Info("first upstream sync: ready")
}

const syncPoll = 50 * time.Millisecond

// syncLogEvery is how many syncPolls pass between looks at why the relay
// is not ready yet, for the log (every 5s).
const syncLogEvery = 100

// hasSynced reports whether the relay has something to serve: a saved cache
// was restored, the resource files loaded, a group's control-plane stream
// got its first response or, before any group exists, the connection to the
// control plane is up.
func (r *Relay) hasSynced() bool {
	if r.restored.Load() {
		return true
	}
	if f, ok := r.source.(*upstream.File); ok {
		return !f.Status().LastResponse.IsZero()
	}
	gs := r.snapshotGroups()
	for _, g := range gs {
		if !g.feed.Status().LastResponse.IsZero() {
			return true
		}
	}
	return len(gs) == 0 && r.upConn != nil && r.speaks()
}

// reachable returns, before any group has a stream, the server a group's
// stream could get an answer from: the control plane's (0) if its
// connection is up or, while it cannot connect, the first of its fallback
// servers whose connection is (gRFC A71: a fallback server is tried only
// while the ones above it are unreachable, so it is connected to only
// then); -1 if none. Without the fallbacks, a relay whose primary is down
// at start would never be ready, and so never be sent the clients whose
// streams would fall back.
func (r *Relay) reachable() int {
	if r.upConn.GetState() == connectivity.Ready {
		return 0
	}
	if r.upConn.GetState() != connectivity.TransientFailure {
		return -1
	}
	for i, fb := range r.upFallbacks {
		switch fb.GetState() {
		case connectivity.Ready:
			return i + 1
		case connectivity.Idle:
			fb.Connect()
			return -1
		case connectivity.TransientFailure:
			continue // try the next one down
		default:
			return -1 // connecting: wait for it
		}
	}
	return -1
}

// drainingHealth is the gRPC health service, whose Watch streams end once
// they have told the client NOT_SERVING at shutdown: a watcher must not hold
// GracefulStop until shutdown_timeout.
type drainingHealth struct {
	*health.Server
	r *Relay
}

// Watch implements grpc.health.v1.Health.
func (h drainingHealth) Watch(req *healthpb.HealthCheckRequest, st healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(st.Context())
	defer cancel()
	err := h.Server.Watch(req, &watchStream{Health_WatchServer: st, ctx: ctx, cancel: cancel, r: h.r})
	if h.r.stopped.Load() {
		return status.Error(codes.Unavailable, "relay is shutting down")
	}
	return err
}

// watchStream is a Watch stream that ends after a status other than SERVING
// is sent during shutdown.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx    context.Context
	cancel context.CancelFunc
	r      *Relay
}

func (w *watchStream) Context() context.Context { return w.ctx }

func (w *watchStream) Send(m *healthpb.HealthCheckResponse) error {
	err := w.Health_WatchServer.Send(m)
	if m.GetStatus() != healthpb.HealthCheckResponse_SERVING && w.r.stopped.Load() {
		w.cancel()
	}
	return err
}

package relay

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xdsrelay/xdsrelay/downstream"
	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// The admin endpoint's access rule, decided in one place (access): what a
// request may reach depends on the listener it came on and on the request.
//
//   - Anyone who reaches a listener gets the probes (/healthz, /readyz in
//     general terms), /metrics and the index.
//   - The read-only views (the detailed /readyz, the /debug/ reads: groups,
//     clients, cache, convergence, references, config dump, the guard's
//     holds and the rollout's changes) also answer a caller on
//     admin.local_address: a second listener bound to loopback, which
//     kubectl port-forward and kubectl exec reach inside the pod and other
//     pods cannot reach at all.
//   - Everything, what changes or inspects the process included (releases,
//     PUT /debug/loglevel, pprof), answers a caller on an admin.address
//     bound to loopback, or a request over admin.tls with a client
//     certificate that admin.tls.client_ca_file verifies.
//
// A request that shows it came through a proxy is never local, on either
// loopback listener: a sidecar in the pod (Istio's, say) forwards what
// other pods send, and reaches loopback. It shows it by its source (a
// loopback address other than 127.0.0.1 and ::1: Istio's inbound
// passthrough connects from 127.0.0.6) or by a proxy's headers (proxied).
// What a proxy forwards over plain TCP from 127.0.0.1 to 127.0.0.1 cannot
// be told from kubectl port-forward; docs/operations.md ("Admin exposure")
// says why that is kept out by other means. A verified client certificate
// is the caller's own word and stands through any proxy.

// adminLoopback reports whether the admin listener's address is a
// loopback one (loopbackAddr). The package's tests may give the other
// answer on 127.0.0.1 (Config.hooks).
func (r *Relay) adminLoopback(a net.Addr) bool {
	if loopback := r.cfg.hooks.loopback; loopback != nil {
		return loopback(a)
	}
	return loopbackAddr(a)
}

// loopbackAddr reports whether a is a TCP address on a loopback IP.
func loopbackAddr(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// access is what a request may reach on the admin endpoint.
type access uint8

const (
	accessAnyone access = iota // the probes, /metrics, the index
	accessViews                // and the read-only views
	accessAll                  // and what changes or inspects the process
)

// adminListener is what the access rule knows of the listener a request
// came on.
type adminListener struct {
	loopback bool // admin.address, bound to a loopback address
	local    bool // admin.local_address
}

// access decides what req, which came on l, may reach (see above).
func (l adminListener) access(req *http.Request) access {
	switch {
	case req.TLS != nil && len(req.TLS.VerifiedChains) > 0:
		return accessAll
	case proxied(req) != "":
		return accessAnyone
	case l.loopback:
		return accessAll
	case l.local:
		return accessViews
	}
	return accessAnyone
}

// proxyHeaders are the headers a proxy adds to what it forwards: the
// standard ones, and Envoy's and Linkerd's own (x-envoy-*, l5d-*). Envoy
// always sets X-Forwarded-Proto on what its HTTP connection manager
// forwards.
var proxyHeaders = []string{"Forwarded", "Via", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host",
	"X-Forwarded-Port", "X-Forwarded-Client-Cert", "X-Real-Ip"}

// proxied says how req shows it came through a proxy; "" if it does not.
func proxied(req *http.Request) string {
	for _, h := range proxyHeaders {
		if _, ok := req.Header[h]; ok {
			return "it carries " + h + ", a proxy's header"
		}
	}
	for h := range req.Header {
		if lh := strings.ToLower(h); strings.HasPrefix(lh, "x-envoy-") || strings.HasPrefix(lh, "l5d-") {
			return "it carries " + h + ", a proxy's header"
		}
	}
	host, _, err := net.SplitHostPort(req.RemoteAddr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return ""
	}
	if ip.IsLoopback() && !ip.Equal(net.IPv4(127, 0, 0, 1)) && !ip.Equal(net.IPv6loopback) {
		return "it came from " + ip.String() + ", a proxy's address (Istio's sidecar forwards from 127.0.0.6)"
	}
	return ""
}

// gate serves h to the requests on l that may reach want, and refuses
// the others with 403, saying what it takes.
func gate(l adminListener, want access, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if l.access(req) >= want {
			h(w, req)
			return
		}
		msg := "xdsrelay: " + req.URL.Path + " is served only on a loopback admin.address or admin.local_address (kubectl port-forward or exec), or over admin.tls with a verified client certificate"
		if want == accessAll {
			msg = "xdsrelay: " + req.URL.Path + " changes or inspects the process: served only on a loopback admin.address or over admin.tls with a verified client certificate, not on admin.local_address"
		}
		if why := proxied(req); why != "" && (l.loopback || l.local) {
			msg += "; this request came through a proxy: " + why
		}
		http.Error(w, msg, http.StatusForbidden)
	}
}

// loadAdminTLS loads admin.tls, if set. Client certificates are verified
// when given but not required, so that probes without one still work.
func (r *Relay) loadAdminTLS() error {
	if !r.cfg.Admin.TLS.Enabled() {
		return nil
	}
	rl, err := creds.NewReloader(r.ctx, r.cfg.Admin.TLS, r.log)
	if err != nil {
		return tlsError("admin", "client_ca_file", err)
	}
	r.certs["admin"] = rl
	cfg := rl.ServerConfig()
	if perConn := cfg.GetConfigForClient; perConn != nil {
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := perConn(h)
			if c != nil {
				c.ClientAuth = tls.VerifyClientCertIfGiven
			}
			return c, err
		}
	}
	r.adminTLS = cfg
	return nil
}

// startAdmin serves the admin endpoint on admin.address, if set, and,
// when that is not a loopback address, its read-only views on
// admin.local_address too (see adminListener.access).
func (r *Relay) startAdmin() error {
	if r.cfg.Admin.Address == "" {
		return nil
	}
	aln, err := net.Listen("tcp", r.cfg.Admin.Address)
	if err != nil {
		return fmt.Errorf("admin.address: %w", err)
	}
	r.adminLn = aln
	loopback := r.adminLoopback(aln.Addr())
	if !loopback && r.cfg.Admin.LocalAddress != "" {
		lln, err := net.Listen("tcp", r.cfg.Admin.LocalAddress)
		if err != nil {
			return fmt.Errorf("admin.local_address: %w", err)
		}
		r.adminLocalLn = lln
		if !loopbackAddr(lln.Addr()) { // validateAdmin refuses other hosts: a name that resolved elsewhere
			return fmt.Errorf("admin.local_address: %s is not a loopback address", lln.Addr())
		}
	}
	if !loopback && r.adminTLS == nil {
		views := "and the details to no one"
		if r.adminLocalLn != nil {
			views = "and the details only on admin.local_address, inside the pod"
		}
		r.warnings.warn(r.log, "admin.address", "docs/operations.md#admin-exposure",
			"admin.address is not a loopback address and admin.tls is not set: /metrics (group keys in its labels) is served in plaintext to whoever reaches it, "+views)
	}
	r.admin = r.adminServer(adminListener{loopback: loopback})
	ln := aln
	if r.adminTLS != nil {
		ln = tls.NewListener(aln, r.adminTLS)
	}
	r.goRun(func() {
		if err := r.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("admin server", "error", err)
		}
	})
	if lln := r.adminLocalLn; lln != nil {
		r.adminLocal = r.adminServer(adminListener{local: true})
		r.goRun(func() {
			if err := r.adminLocal.Serve(lln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.log.Error("admin server (admin.local_address)", "error", err)
			}
		})
	}
	return nil
}

// adminServer is the admin endpoint's HTTP server for listener l.
func (r *Relay) adminServer(l adminListener) *http.Server {
	return &http.Server{Handler: r.adminHandler(l), ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)}
}

func (r *Relay) adminHandler(l adminListener) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", r.adminIndex)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		priv := l.access(req) >= accessViews
		if why := r.notReady(); why != "" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusServiceUnavailable)
			line := r.notReadyLine(why, priv)
			fmt.Fprintln(w, line)
			if priv && why == waitingSync {
				r.groupsDetail(w, line)
			}
			return
		}
		// Ready while serving, whatever the control plane does: clients are
		// served from the cache (docs/architecture.md, invariant 6 "Outages
		// are not outages").
		if priv {
			r.readyDetail(w)
		} else {
			fmt.Fprintln(w, r.readySummary())
		}
	})
	mux.Handle("GET /metrics", r.metrics.Handler())
	r.opsRoutes(mux, l)
	r.debugRoutes(mux, l)
	return mux
}

// adminIndex serves GET /: the admin paths, from AdminPaths, as
// docs/admin.md lists them. Its body is the same for every caller and
// bounded by the code.
func (r *Relay) adminIndex(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	fmt.Fprintln(w, "xdsrelay admin endpoint (docs/admin.md): its paths, and who may call them")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, p := range AdminPaths() {
		line := p.Shown() + "\t" + p.Access
		if p.Served != "" {
			line += "\t" + strings.ReplaceAll(p.Served, "`", "")
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

// readyDetail writes, for people, each group's upstream state, what went
// wrong with cache.persist_dir and the configuration warnings.
func (r *Relay) readyDetail(w io.Writer) {
	fmt.Fprintln(w, "ready")
	r.groupsDetail(w, "")
}

// groupsDetail writes the private /readyz's lines after the first, above:
// the warnings, each group (its id, GroupID) with its
// upstreams, its guard holds and its held rollouts, and cache.persist_dir's
// health. An upstream's error is written once, on its own line, and not
// again if the first line said it.
func (r *Relay) groupsDetail(w io.Writer, above string) {
	for _, line := range r.warnings.detail() {
		fmt.Fprintln(w, line)
	}
	for _, g := range r.snapshotGroups() {
		s := g.feed.Status()
		fmt.Fprintf(w, "group %q: %s\n", g.id, describe(s, g.cache.Len()))
		for _, u := range upstreamsOf(s) {
			state := "connected"
			if !u.Connected {
				state = "DOWN"
				switch {
				case u.Refused != "":
					// It answered: it refused (docs/architecture.md, invariant 20).
					state = "refused: " + xds.Clip(u.Refused)
				case u.LastError == "":
				case strings.Contains(above, xds.Clip(u.LastError)):
					state += " (the error above)"
				default:
					state += " (" + xds.Clip(u.LastError) + ")"
				}
			}
			if u.Protocol != "" {
				state += ", speaks " + u.Protocol
			}
			if len(u.Unserved) > 0 {
				state += ", does not serve " + strings.Join(u.Unserved, ", ") + " (not asked of it)"
			}
			if u.Unheard != "" {
				state += ", " + u.Unheard
			}
			fmt.Fprintf(w, "  upstream %q: %s, %s\n", u.Upstream, r.serverOf(u), state)
		}
		guardDetail(w, g.cache)
		rolloutDetail(w, g.cache)
	}
	for _, line := range r.persistHealth.detail() {
		fmt.Fprintln(w, line)
	}
}

// readySummary is the readiness in general terms: no group key, address or
// file name.
func (r *Relay) readySummary() string {
	parts := []string{"ready"}
	down, empty, invalid, held, halted, fallback := 0, 0, false, 0, 0, 0
	for _, g := range r.snapshotGroups() {
		s := g.feed.Status()
		if slices.ContainsFunc(upstreamsOf(s), r.onFallback) {
			fallback++
		}
		switch {
		case s.Connected:
		case g.cache.Len() == 0:
			empty++
		default:
			down++
		}
		invalid = invalid || s.Invalid != ""
		if len(g.cache.Holds()) > 0 {
			held++
		}
		if heldRollouts(g.cache) {
			halted++
		}
	}
	if held > 0 {
		parts = append(parts, fmt.Sprintf("degraded: the guard holds removals from the control plane in %d %s", held, plural(held, "group", "groups")))
	}
	if halted > 0 {
		parts = append(parts, fmt.Sprintf("degraded: a canary rejected a change from the control plane, held from the rest of %d %s", halted, plural(halted, "group", "groups")))
	}
	if down > 0 {
		parts = append(parts, fmt.Sprintf("%d %s with upstream down, serving from cache", down, plural(down, "group", "groups")))
	}
	if empty > 0 {
		parts = append(parts, fmt.Sprintf("%d %s with upstream down and nothing cached to serve", empty, plural(empty, "group", "groups")))
	}
	if fallback > 0 {
		parts = append(parts, fmt.Sprintf("%d %s on a fallback server of their control plane", fallback, plural(fallback, "group", "groups")))
	}
	if invalid {
		parts = append(parts, "invalid resources not served")
	}
	parts = append(parts, r.persistHealth.summary()...)
	return strings.Join(parts, "; ")
}

func (r *Relay) snapshotGroups() []*group {
	r.mu.Lock()
	defer r.mu.Unlock()
	gs := make([]*group, 0, len(r.groups))
	for _, g := range r.groups {
		gs = append(gs, g)
	}
	slices.SortFunc(gs, func(a, b *group) int { return strings.Compare(a.key, b.key) })
	return gs
}

// onFallback reports whether an upstream's stream uses a server other than
// its first (gRFC A71 fallback).
func (r *Relay) onFallback(u upstream.Status) bool {
	for _, c := range append([]UpstreamConfig{r.cfg.Upstream.UpstreamConfig}, r.cfg.Upstreams...) {
		if c.Name == u.Upstream {
			return u.Server != "" && u.Server != c.Address
		}
	}
	return false
}

// serverOf is where an upstream's resources come from, for the private
// /readyz: the server in use (gRFC A71), or the files of a file:// source,
// which has no server.
func (r *Relay) serverOf(u upstream.Status) string {
	if u.Server == "" {
		for _, c := range append([]UpstreamConfig{r.cfg.Upstream.UpstreamConfig}, r.cfg.Upstreams...) {
			if c.Name == u.Upstream || (u.Upstream == upstream.DefaultUpstream && c.Name == "") {
				if strings.HasPrefix(c.Address, FilePrefix) {
					return "files " + c.Address
				}
				return "server " + c.Address
			}
		}
		return "no server"
	}
	server := "server " + u.Server
	if r.onFallback(u) {
		server += " (a fallback server: the higher ones were unreachable with something not cached, gRFC A71)"
	}
	return server
}

// describe is a group's state on the private /readyz; its upstreams' lines,
// after it, carry their errors.
func describe(s upstream.Status, resources int) string {
	state := "upstream connected"
	if !s.Connected {
		// Serving from cache only with something cached to serve.
		state = "upstream DOWN, serving from cache"
		if resources == 0 {
			state = "upstream DOWN, nothing cached to serve"
		}
	}
	age := "no response yet"
	if !s.LastResponse.IsZero() {
		age = "last response " + time.Since(s.LastResponse).Round(time.Second).String() + " ago"
	}
	if s.Invalid != "" {
		age += "; " + xds.Clip(s.Invalid)
	}
	return fmt.Sprintf("%s; %d resources cached; %s", state, resources, age)
}

// RESTListenerHeader is the header, and RESTListener its value, that the
// REST-JSON port sets on its answers to what it does not serve: a command
// meant for the admin endpoint, which speaks HTTP/1.1 too, tells the two
// ports apart by them.
const (
	RESTListenerHeader = downstream.ListenerHeader
	RESTListener       = downstream.ListenerREST
)

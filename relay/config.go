package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/fleet"
	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// Config is the relay's configuration, filled by the binary from YAML and
// the environment. Field comments name the configuration keys.
type Config struct {
	// Upstream is upstream.*: the default control plane, and how clients
	// are grouped.
	Upstream struct {
		UpstreamConfig
		// GroupBy is upstream.group_by: the node fields that form the
		// group key (id, cluster, locality.region, locality.zone,
		// locality.sub_zone, metadata.<key>); empty for one group. One
		// setting for every upstream.
		GroupBy []string
	}
	// Upstreams is upstreams: more control planes, each serving the types
	// and xdstp authorities it lists (gRFC A47); every other name is the
	// default upstream's.
	Upstreams  []UpstreamConfig
	Downstream struct {
		// Address is downstream.address: where xDS clients connect.
		Address string
		// RESTAddress is downstream.rest_address: REST-JSON polling
		// (POST /v3/discovery:<type>); empty to disable.
		RESTAddress string
		// PollTimeout is downstream.poll_timeout: how long a REST-JSON or
		// gRPC Fetch poll is held when nothing changes.
		PollTimeout time.Duration
		// SendTimeout is downstream.send_timeout: a client that reads
		// nothing for this long while a response waits is disconnected.
		SendTimeout time.Duration
		// MaxRequestBytes is downstream.max_request_bytes: the largest
		// request accepted from a client.
		MaxRequestBytes int
		// Reflection is downstream.reflection: gRPC server reflection
		// (grpc.reflection.v1) on the downstream port, for grpcurl.
		Reflection bool
		// MaxConnectionAge and MaxConnectionAgeGrace are
		// downstream.max_connection_age and .max_connection_age_grace: a
		// gRPC client connection is sent GOAWAY after MaxConnectionAge
		// (±10% jitter) so that clients spread over new replicas, and
		// closed MaxConnectionAgeGrace later if streams are still open
		// on it. 0 disables each.
		MaxConnectionAge      time.Duration
		MaxConnectionAgeGrace time.Duration
		// MaxConnectionIdle is downstream.max_connection_idle: a gRPC
		// connection without streams, or a keep-alive REST-JSON
		// connection without a request, is closed after this long; 0
		// disables.
		MaxConnectionIdle time.Duration
		// TLS is downstream.tls.{cert_file,key_file,client_ca_file}: TLS
		// for clients (gRPC and REST), mTLS when client_ca_file is set.
		TLS creds.TLS
		// Authorization is downstream.authorization: which nodes a client
		// may claim, by the identities of its client certificate.
		Authorization struct {
			// Mode is downstream.authorization.mode: AuthorizationRules
			// (with mTLS, Rules are required) or AuthorizationAllowAll
			// (every client may claim every node; warned about).
			Mode string
			// Rules is downstream.authorization.rules. Rules need
			// client_ca_file; without mTLS, none admits every node.
			Rules []AuthorizationRule
		}
	}
	Admin struct {
		// Address is admin.address: /healthz, /readyz, /metrics; empty
		// to disable. Details that name groups or addresses are served only
		// when it is a loopback address, or to clients with a certificate
		// that TLS.CAFile verifies.
		Address string
		// LocalAddress is admin.local_address: a second listener, bound
		// to a loopback address, opened when Address is not loopback,
		// that serves the read-only views to callers inside the pod
		// (kubectl port-forward and exec) and to no proxy (see
		// adminListener.access); empty to open none.
		LocalAddress string
		// TLS is admin.tls.{cert_file,key_file,client_ca_file}: HTTPS for
		// the admin endpoint; with client_ca_file, a client presenting a
		// certificate it verifies gets the details on any address.
		TLS creds.TLS
		// Pprof is admin.pprof: net/http/pprof under /debug/pprof/, to
		// private callers only.
		Pprof bool
		// ReadyAfterSync is admin.ready_after_sync: /readyz and gRPC
		// health report ready only once the relay has something to serve
		// (see Relay.synced).
		ReadyAfterSync bool
		// AdvertiseAddress is admin.advertise_address: the host:port at
		// which the relay above reaches this one's admin endpoint, put in
		// the metadata of every node the relay presents upstream
		// (TierMetadataKey) so that xdsrelay wait --tiers follows the tree
		// down; empty to advertise nothing.
		AdvertiseAddress string
	}
	Metrics struct {
		// GroupLabel is metrics.group_label: the per-group series carry
		// the group key as their group label (hashed when longer than
		// metrics.MaxLabelLen); false sums them without it.
		GroupLabel bool
	}
	Cache struct {
		// Retention is cache.retention: how long a resource nobody
		// watches stays subscribed and cached.
		Retention time.Duration
		// MaxResources is cache.max_resources: per group, past this many
		// resources the least recently used unwatched ones are dropped;
		// 0 for no bound.
		MaxResources int
		// PersistDir is cache.persist_dir: where the caches are saved
		// (atomically) and restored from on start; empty disables it.
		PersistDir string
		// PersistInterval is cache.persist_interval: how often changed
		// caches are saved (and once more on shutdown).
		PersistInterval time.Duration
		// PersistMaxBytes is cache.persist_max_bytes: the largest cache
		// file restored (larger ones are refused unread) or saved.
		PersistMaxBytes int
		// NotFoundTimeout is cache.not_found_timeout: a name subscribed
		// upstream that has not arrived this long after its first
		// subscription is reported to incremental clients as not existing
		// ("Knowing When a Requested Resource Does Not Exist"); 0 disables.
		NotFoundTimeout time.Duration
	}
	// Guard is guard.*: the mass-removal guard ("Protecting the fleet").
	Guard struct {
		// MaxRemovedFraction is guard.max_removed_fraction: upstream
		// removing more than this fraction of a group's resources of one
		// type within Window is held; 0 turns the guard off.
		MaxRemovedFraction float64
		// MinResources is guard.min_resources: a type holding fewer is
		// never held.
		MinResources int
		// Window is guard.window: how far back removals add up.
		Window time.Duration
		// Hold is guard.hold: how long a hold lasts before its removals
		// are applied; 0 holds until released.
		Hold time.Duration
		// WipeHold is guard.wipe_hold: how long the removal of every
		// resource of a type is held, at any size, before it is applied;
		// 0 holds none.
		WipeHold time.Duration
	}
	// Consistency is consistency.*: make before break (docs/architecture.md,
	// invariant 18).
	Consistency struct {
		// MaxWait is consistency.max_wait: how long a resource waits for
		// the names it points at, and a removal for nothing to point at
		// the name, before the control plane's word wins; 0 turns make
		// before break off (nor are referenced names fetched).
		MaxWait time.Duration
	}
	// Rollout is rollout.*: the NACK-gated canary rollout ("Protecting
	// the fleet").
	Rollout struct {
		// Canary is rollout.canary: per type, the fraction (below 1) or
		// the count (1 or more) of a group's clients that get a change
		// first; 0 turns the rollout off.
		Canary float64
		// Bake is rollout.bake: how long a change waits for the canaries'
		// verdict; without a NACK by then it is released.
		Bake time.Duration
	}
	// Limits are the bounds on what clients may make the relay hold
	// (docs/architecture.md, invariant 9 "Every bound is explicit"): each
	// refused with
	// RESOURCE_EXHAUSTED (429 over REST-JSON) naming its key. Zero is no
	// bound.
	Limits struct {
		// MaxGroups is limits.max_groups: a stream or poll whose node
		// would start one more group is refused.
		MaxGroups int
		// MaxNamesPerStream is limits.max_names_per_stream: names one
		// stream (or poll) subscribes to, across types.
		MaxNamesPerStream int
		// MaxNamesPerGroup is limits.max_names_per_group: names one group
		// wants (subscribed upstream), watched or retained.
		MaxNamesPerGroup int
		// MaxStreamsPerConnection is limits.max_streams_per_connection:
		// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS on client connections.
		MaxStreamsPerConnection int
		// MaxStreams is limits.max_streams: open xDS streams in total.
		MaxStreams int
		// StreamRate and StreamBurst are limits.stream_rate and
		// limits.stream_burst: new streams admitted a second, in bursts
		// of up to StreamBurst (a token bucket).
		StreamRate  float64
		StreamBurst int
		// FirstRequestTimeout is limits.first_request_timeout: a stream
		// that sends no request for this long is ended.
		FirstRequestTimeout time.Duration
		// RESTReadTimeout is limits.rest_read_timeout: a REST-JSON
		// request's headers, and then its body, must arrive within it.
		RESTReadTimeout time.Duration
		// MaxPolls is limits.max_polls: REST-JSON and gRPC Fetch polls
		// in progress (held ones included) at once.
		MaxPolls int
	}
	// LRS is lrs.*: load reports (LRS) from clients, summed per group and
	// sent to the control plane.
	LRS struct {
		// Interval is lrs.interval: how often clients are told to report
		// until the control plane has answered, or when it names no
		// interval.
		Interval time.Duration
		// MinInterval is lrs.min_interval: the floor of the control
		// plane's load_reporting_interval; below it, it is raised to it,
		// logged once per group, and counted. 0 (the default) is 1s, or
		// Interval if that is shorter (LRSMinInterval).
		MinInterval time.Duration
		// MaxPending is lrs.max_pending: per group, the relay's own
		// reports (one per interval) held while the control plane cannot
		// be reached; past it the oldest is dropped, and counted.
		MaxPending int
		// SendTimeout is lrs.send_timeout: a report whose send to the
		// control plane has not returned within it ends the stream,
		// which is opened again; what the control plane never read is
		// counted dropped.
		SendTimeout time.Duration
		// MaxPendingBytes is lrs.max_pending_bytes: per group, the
		// encoded size of those held reports; past it they are merged
		// into one, or, if that is still past it, the oldest dropped,
		// and counted.
		MaxPendingBytes int
		// MaxNames is lrs.max_names: per group and period, the distinct
		// names (clusters, localities, endpoints, named metrics, drop
		// categories) summed, and the gauges held; past it stats are
		// left out, and counted.
		MaxNames int
	}
	// Fleet is fleet.*: replicas that know each other and fetch each group
	// from the control plane once between them (docs/architecture.md,
	// "Fleet"); off without fleet.peers.
	Fleet fleet.Config
	// Tracing installs OpenTelemetry instrumentation (gRPC stats handlers on
	// both edges) on the global tracer provider; the binary sets it when
	// tracing.otlp_endpoint is configured.
	Tracing bool
	// ShutdownTimeout is shutdown_timeout: how long Shutdown waits for
	// streams to end before closing them.
	ShutdownTimeout time.Duration
	// LogLevel is the binary's log level (not a key: log.level sets its
	// start value); the admin endpoint's /debug/loglevel reads and sets it.
	// Nil disables /debug/loglevel.
	LogLevel *slog.LevelVar
	// Build is the version xdsrelay_build_info reports (not a key): the
	// binary sets it from its build information; empty, the relay reads
	// the module's own.
	Build BuildInfo

	// hooks are set by the package's tests only: zero in every other use.
	hooks struct {
		// drainGrace replaces drainGrace (Shutdown) when positive.
		drainGrace time.Duration
		// loopback replaces the admin endpoint's answer to whether its
		// listener's address is a loopback one (adminLoopback).
		loopback func(net.Addr) bool
		// resolve resolves fleet.peers' names; the system's resolver if
		// nil. The tests give each relay its own view of a name.
		resolve func(ctx context.Context, host string) ([]string, error)
	}
}

// AuthorizationRule is one of downstream.authorization.rules: a client whose
// certificate has an identity (URI SAN, DNS SAN or subject CN) matching
// Identity may claim a node whose fields match Node, a map from node field
// (as in upstream.group_by) to pattern. In patterns, "{name}" captures a run
// of characters without '/' (in Identity) or stands for the captured value
// (in Node), and "*" matches any run without '/'.
type AuthorizationRule struct {
	Identity string
	Node     map[string]string
	// Authorities, if set, are the xdstp authorities (patterns) whose
	// names the clients the rule admits may ask for; another's are refused
	// with PERMISSION_DENIED, name by name (gRFC A88).
	Authorities []string
}

// UpstreamConfig is one control plane: upstream.* for the default, or one
// of upstreams[] (whose keys are the same, less group_by, plus name and
// types).
type UpstreamConfig struct {
	// Name is upstreams[].name: [a-z0-9-]+, unique, in logs, metrics and
	// /debug; "default" for upstream.*.
	Name string
	// Address is upstream.address: the control plane's host:port, or
	// file://DIR to serve a directory of resource files.
	Address string
	// Addresses is upstream.addresses: fallback servers in priority order
	// after Address (gRFC A71).
	Addresses []string
	// Types is upstreams[].types: the types this upstream serves, as REST
	// short names or type URLs (resolved to type URLs by Validate).
	Types []string
	// Authorities is upstream.authorities: the xdstp authorities this
	// upstream serves.
	Authorities []string
	// FallbackRecheck is upstream.fallback_recheck: while on a fallback
	// server, how often the higher-priority servers are checked.
	FallbackRecheck time.Duration
	// ReconnectBaseDelay and ReconnectMaxDelay are
	// upstream.reconnect.base_delay and .max_delay: the exponential
	// backoff (with jitter) between attempts to reach the control plane.
	ReconnectBaseDelay time.Duration
	ReconnectMaxDelay  time.Duration
	// Protocol is upstream.protocol: auto, delta, sotw or sotw-per-type
	// (upstream.Protocol); auto finds each server's.
	Protocol string
	// MaxMessageBytes is upstream.max_message_bytes: the largest
	// response accepted from the control plane.
	MaxMessageBytes int
	// MaxRequestBytes is upstream.max_request_bytes: the largest
	// request sent to the control plane; larger subscriptions and
	// resumes are split over several requests.
	MaxRequestBytes int
	// KeepaliveTime and KeepaliveTimeout are upstream.keepalive.time
	// and .timeout: HTTP/2 pings on the upstream connection. A silent
	// connection is found dead within their sum; KeepaliveTimeout also
	// bounds the probe of a stream's connection that the does-not-exist
	// timer sends (upstream.ProbeTimeout).
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// StallTimeout is upstream.stall_timeout: a response that began to
	// arrive and made no progress this long, the connection alive (pings
	// and health checks answered, as a load balancer answers them),
	// stalls its stream, which is ended and opened again
	// (upstream.StallTimeout); 0 never ends one.
	StallTimeout time.Duration
	// ConnectTimeout is upstream.connect_timeout: a connection attempt
	// (TCP, TLS and the HTTP/2 handshake) that has not completed by then
	// is given up, as to an address that accepts and answers nothing.
	ConnectTimeout time.Duration
	// TLS is upstream.tls.{cert_file,key_file,ca_file,server_name,
	// insecure_skip_verify}: TLS to the control plane, mTLS with a
	// client certificate. TLSEnabled (upstream.tls.enabled) turns TLS on
	// with the system roots when no file is given.
	TLS        creds.TLS
	TLSEnabled bool
	// Headers is upstream.headers: metadata sent on every upstream RPC
	// (an authorization token, say).
	Headers map[string]string
	// Node is upstream.node.*: the node presented upstream per group.
	Node NodeConfig
	// ForwardNACKs is upstream.forward_nacks: tell the control plane,
	// with a NACK of its response, when clients reject a version it
	// sent (upstream/forward.go).
	ForwardNACKs bool
}

// forwardsNACKs reports whether any upstream is to be told of clients'
// rejections.
func (c *Config) forwardsNACKs() bool {
	if c.Upstream.ForwardNACKs {
		return true
	}
	for _, u := range c.Upstreams {
		if u.ForwardNACKs {
			return true
		}
	}
	return false
}

// Servers are the upstream's servers in priority order: Address, then
// Addresses.
func (u *UpstreamConfig) Servers() []string {
	return append([]string{u.Address}, u.Addresses...)
}

// DefaultUpstream is an upstream's configuration where no key sets it: the
// default for upstream.* and for each of upstreams[].
func DefaultUpstream() UpstreamConfig {
	var u UpstreamConfig
	u.Name = upstream.DefaultUpstream
	u.Address = "127.0.0.1:18000"
	u.FallbackRecheck = 30 * time.Second
	u.ReconnectBaseDelay = 500 * time.Millisecond
	u.ReconnectMaxDelay = 30 * time.Second
	u.MaxMessageBytes = 256 << 20
	u.MaxRequestBytes = upstream.DefaultMaxRequestBytes
	u.Protocol = string(upstream.ProtocolAuto)
	u.Node.ID = DefaultNodeID
	u.Node.UserAgentName = "xdsrelay"
	u.KeepaliveTime = 30 * time.Second
	u.KeepaliveTimeout = 10 * time.Second
	u.StallTimeout = upstream.DefaultStallTimeout
	u.ConnectTimeout = 10 * time.Second
	u.ForwardNACKs = true
	return u
}

// Default returns the default configuration: what the binary uses for a key
// that neither the file nor the environment sets.
func Default() Config {
	var c Config
	c.Upstream.UpstreamConfig = DefaultUpstream()
	c.Upstream.GroupBy = []string{"cluster", xds.FieldUserAgent, xds.FieldClientFeatures}
	c.Downstream.Address = "0.0.0.0:18001"
	c.Downstream.PollTimeout = 30 * time.Second
	c.Downstream.SendTimeout = 30 * time.Second
	c.Downstream.MaxRequestBytes = 4 << 20
	c.Downstream.Reflection = true
	c.Downstream.MaxConnectionAge = 30 * time.Minute
	c.Downstream.MaxConnectionAgeGrace = time.Minute
	c.Downstream.MaxConnectionIdle = 5 * time.Minute
	c.Downstream.Authorization.Mode = AuthorizationRules
	c.Admin.Address = "127.0.0.1:9901"
	c.Admin.LocalAddress = "127.0.0.1:9902"
	c.Metrics.GroupLabel = true
	c.Cache.Retention = 5 * time.Minute
	c.Cache.PersistInterval = 10 * time.Second
	c.Cache.PersistMaxBytes = 256 << 20
	c.Cache.MaxResources = 100000
	c.Cache.NotFoundTimeout = 15 * time.Second
	c.ShutdownTimeout = 10 * time.Second
	c.Guard.MaxRemovedFraction = 0.5
	c.Guard.MinResources = 10
	c.Guard.Window = 10 * time.Second
	c.Guard.Hold = 10 * time.Minute
	c.Guard.WipeHold = 2 * time.Second
	// The race make before break closes (a Route before its Cluster,
	// resolved by one upstream round trip) takes milliseconds; a name not
	// come within a second is far likelier never to come, and holds a
	// whole RouteConfiguration meanwhile (docs/architecture.md, invariant
	// 18).
	c.Consistency.MaxWait = time.Second
	c.Rollout.Bake = 30 * time.Second
	c.Limits.MaxGroups = 1000
	c.Limits.MaxNamesPerStream = 100000
	c.Limits.MaxNamesPerGroup = 1000000
	c.Limits.MaxStreamsPerConnection = 100
	c.Limits.MaxStreams = 100000
	c.Limits.StreamRate = 1000
	c.Limits.StreamBurst = 10000
	c.Limits.FirstRequestTimeout = 10 * time.Second
	c.Limits.RESTReadTimeout = 10 * time.Second
	c.Limits.MaxPolls = 10000
	c.LRS.Interval = 10 * time.Second
	c.LRS.MinInterval = 0 // lrsMinIntervalDefault, or lrs.interval if shorter
	c.LRS.MaxPending = 1000
	c.LRS.MaxNames = 50_000
	c.LRS.MaxPendingBytes = 16 << 20
	c.LRS.SendTimeout = 30 * time.Second
	c.Fleet = fleet.Default()
	return c
}

// FilePrefix marks an upstream address that is a directory of resource files.
const FilePrefix = "file://"

// Validate checks the configuration; an error names the key at fault.
// It is the first of Problems.
func (c *Config) Validate() error {
	if ps := c.Problems(); len(ps) > 0 {
		return ps[0]
	}
	return nil
}

// Problems checks the configuration and returns every error, each naming
// its key, in the order of the areas checked.
func (c *Config) Problems() []error {
	var p problems
	for _, check := range []func(*problems){c.validateUpstreams, c.validateGroupBy, c.validateDownstream,
		c.validateAuthorization, c.validateConnections, c.validateAdmin, c.validateCache, c.validateGuard,
		c.validateLRS, c.validateShutdown, c.validateLimits, c.validateFleet} {
		check(&p)
	}
	return p
}

// problems collects a configuration's errors.
type problems []error

func (p *problems) add(err error) {
	if err != nil {
		*p = append(*p, err)
	}
}

func (p *problems) addf(format string, a ...any) { p.add(fmt.Errorf(format, a...)) }

// validateGroupBy checks upstream.group_by.
func (c *Config) validateGroupBy(p *problems) {
	for _, f := range c.Upstream.GroupBy {
		if err := xds.CheckNodeField(f); err != nil {
			p.addf("upstream.group_by: %w", err)
		}
	}
}

// validateDownstream checks the downstream.* keys but authorization and
// the connections' bounds.
func (c *Config) validateDownstream(p *problems) {
	d := &c.Downstream
	if err := checkHostPort(d.Address); err != nil {
		p.addf("downstream.address: %w", err)
	}
	if d.RESTAddress != "" {
		if err := checkHostPort(d.RESTAddress); err != nil {
			p.addf("downstream.rest_address: %w", err)
		}
	}
	p.add(certAndKey("downstream.tls", d.TLS))
	if d.SendTimeout <= 0 {
		p.addf("downstream.send_timeout: must be positive, got %s", d.SendTimeout)
	}
	if d.MaxRequestBytes < 64<<10 {
		p.addf("downstream.max_request_bytes: %d is below 64 KiB", d.MaxRequestBytes)
	}
	if d.PollTimeout <= 0 {
		p.addf("downstream.poll_timeout: must be positive, got %s", d.PollTimeout)
	}
}

// validateAdmin checks the admin.* keys.
func (c *Config) validateAdmin(p *problems) {
	if c.Admin.Address != "" {
		if err := checkHostPort(c.Admin.Address); err != nil {
			p.addf("admin.address: %w", err)
		}
	}
	if a := c.Admin.LocalAddress; a != "" {
		if err := checkLoopback(a); err != nil {
			p.addf("admin.local_address: %w", err)
		}
	}
	if a := c.Admin.AdvertiseAddress; a != "" {
		if err := checkAdvertised(a); err != nil {
			p.addf("admin.advertise_address: %w", err)
		}
	}
	p.add(certAndKey("admin.tls", c.Admin.TLS))
}

// certAndKey checks that a server's TLS settings, if any, name both its
// certificate and its key; an error names the key that is missing.
func certAndKey(prefix string, t creds.TLS) error {
	switch {
	case !t.Enabled():
		return nil
	case t.CertFile == "" && t.KeyFile == "":
		return fmt.Errorf("%s.cert_file and %s.key_file: both are required with %s", prefix, prefix, prefix)
	case t.CertFile == "":
		return fmt.Errorf("%s.cert_file: required with %s.key_file: cert_file and key_file are both required", prefix, prefix)
	case t.KeyFile == "":
		return fmt.Errorf("%s.key_file: required with %s.cert_file: cert_file and key_file are both required", prefix, prefix)
	}
	return nil
}

// validateCache checks the cache.* keys.
func (c *Config) validateCache(p *problems) {
	cc := &c.Cache
	if cc.Retention < 0 {
		p.addf("cache.retention: must not be negative, got %s", cc.Retention)
	}
	if cc.NotFoundTimeout < 0 {
		p.addf("cache.not_found_timeout: must not be negative, got %s", cc.NotFoundTimeout)
	}
	if cc.MaxResources < 0 {
		p.addf("cache.max_resources: must not be negative, got %d", cc.MaxResources)
	}
	if cc.PersistDir == "" {
		return
	}
	if st, err := os.Stat(cc.PersistDir); err != nil || !st.IsDir() {
		p.addf("cache.persist_dir: %q is not a directory", cc.PersistDir)
	}
	if cc.PersistInterval <= 0 {
		p.addf("cache.persist_interval: must be positive, got %s", cc.PersistInterval)
	}
	if cc.PersistMaxBytes < 64<<10 {
		p.addf("cache.persist_max_bytes: %d is below 64 KiB", cc.PersistMaxBytes)
	}
}

// validateFleet checks fleet.*, and what they need of the other keys: a
// control plane to share (resource files are every replica's own), and,
// with client certificates, the identities that may speak as a peer.
func (c *Config) validateFleet(p *problems) {
	f := &c.Fleet
	if err := f.Validate(); err != nil {
		p.add(err)
		return
	}
	if !f.On() {
		return
	}
	if strings.HasPrefix(c.Upstream.Address, FilePrefix) {
		p.addf("fleet.peers: a fleet shares a control plane's work; with a file:// upstream.address every replica reads the files itself")
	}
	if c.Downstream.TLS.CAFile != "" && len(f.PeerIdentities) == 0 {
		p.addf("fleet.peer_identities: required with downstream.tls.client_ca_file: the identities of the replicas' certificates, the only callers trusted with the peer mark")
	}
	if c.Downstream.TLS.CAFile == "" && len(f.PeerIdentities) > 0 {
		p.addf("fleet.peer_identities: set without downstream.tls.client_ca_file: without client certificates no identity is checked, and any client may use the peer mark; set client_ca_file, or leave peer_identities empty")
	}
	_, selfPort, _ := net.SplitHostPort(f.Self)
	if _, port, err := net.SplitHostPort(c.Downstream.Address); err == nil && port != "0" && port != "" && port != selfPort {
		p.addf("fleet.self: its port %s is not downstream.address's, %s: the other members dial fleet.self for this replica's xDS port", selfPort, port)
	}
	for _, id := range f.PeerIdentities {
		if strings.ContainsAny(id, "{}*") {
			p.addf("fleet.peer_identities: %q is an identity, not a pattern ({, } and * are not allowed)", id)
		}
	}
}

// validateShutdown checks shutdown_timeout.
func (c *Config) validateShutdown(p *problems) {
	if c.ShutdownTimeout <= 0 {
		p.addf("shutdown_timeout: must be positive, got %s", c.ShutdownTimeout)
	}
}

// validateLimits checks the limits.* keys.
func (c *Config) validateLimits(p *problems) {
	l := &c.Limits
	for _, n := range []struct {
		key string
		v   int
	}{
		{"limits.max_groups", l.MaxGroups},
		{"limits.max_names_per_stream", l.MaxNamesPerStream},
		{"limits.max_names_per_group", l.MaxNamesPerGroup},
		{"limits.max_streams_per_connection", l.MaxStreamsPerConnection},
		{"limits.max_streams", l.MaxStreams},
		{"limits.stream_burst", l.StreamBurst},
		{"limits.max_polls", l.MaxPolls},
	} {
		if n.v < 0 {
			p.addf("%s: must not be negative (0 for no bound), got %d", n.key, n.v)
		}
	}
	if l.MaxStreamsPerConnection > math.MaxUint32 {
		p.addf("limits.max_streams_per_connection: %d is past HTTP/2's largest, %d", l.MaxStreamsPerConnection, uint32(math.MaxUint32))
	}
	if l.StreamRate < 0 || math.IsNaN(l.StreamRate) {
		p.addf("limits.stream_rate: must not be negative (0 for no bound), got %v", l.StreamRate)
	}
	if l.StreamRate > 0 && l.StreamBurst < 1 {
		p.addf("limits.stream_burst: must be at least 1 with limits.stream_rate %v", l.StreamRate)
	}
	if l.FirstRequestTimeout < 0 {
		p.addf("limits.first_request_timeout: must not be negative (0 for no bound), got %s", l.FirstRequestTimeout)
	}
	if l.RESTReadTimeout < 0 {
		p.addf("limits.rest_read_timeout: must not be negative (0 for no bound), got %s", l.RESTReadTimeout)
	}
}

// validateConnections checks the downstream.max_connection_* keys.
func (c *Config) validateConnections(p *problems) {
	d := &c.Downstream
	for _, n := range []struct {
		key string
		v   time.Duration
	}{
		{"downstream.max_connection_age", d.MaxConnectionAge},
		{"downstream.max_connection_age_grace", d.MaxConnectionAgeGrace},
		{"downstream.max_connection_idle", d.MaxConnectionIdle},
	} {
		if n.v < 0 {
			p.addf("%s: must not be negative (0 disables), got %s", n.key, n.v)
		}
	}
}

func checkHostPort(addr string) error {
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		return fmt.Errorf("%q is not host:port: write the host and port alone (%s), without %s://", addr, rest, scheme)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if _, err := net.LookupPort("tcp", port); err != nil || port == "" {
		return fmt.Errorf("%q has no valid port", addr)
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("%q has an invalid host", addr)
	}
	return nil
}

// checkUpstreamAddress checks an upstream's address, a host:port: one
// that has no port and reads as a path is a directory of resource files
// written without file://.
func checkUpstreamAddress(addr string) error {
	err := checkHostPort(addr)
	if err == nil || strings.Contains(addr, "://") {
		return err
	}
	if _, _, splitErr := net.SplitHostPort(addr); splitErr != nil && (strings.ContainsAny(addr, "/\\") || addr == ".") {
		return fmt.Errorf("%q is not host:port: a directory of resource files is %s%s", addr, FilePrefix, addr)
	}
	return err
}

// checkLoopback checks a host:port whose host must be a loopback address
// (127.0.0.1, ::1, or localhost), so that nothing outside the machine (the
// pod) can connect to it.
func checkLoopback(addr string) error {
	if err := checkHostPort(addr); err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && !strings.EqualFold(host, "localhost") {
		return fmt.Errorf("%q is not a loopback address (127.0.0.1:PORT, [::1]:PORT or localhost:PORT): it is what keeps it from other pods", addr)
	}
	return nil
}

// validateUpstreams checks upstream.* and every upstreams[] entry, resolves
// their types to type URLs and checks that no type or authority is claimed
// twice; an error names the key.
func (c *Config) validateUpstreams(p *problems) {
	c.Upstream.validate(p, "upstream.", c.Upstream.GroupBy)
	if len(c.Upstream.Types) > 0 {
		p.add(errors.New("upstream.types: the default upstream serves every type no upstreams[] entry lists; list types under upstreams"))
	}
	if len(c.Upstreams) > 0 && strings.HasPrefix(c.Upstream.Address, FilePrefix) {
		p.add(errors.New("upstreams: cannot be combined with a file:// upstream.address"))
	}
	typesOK := true
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		prefix := fmt.Sprintf("upstreams[%d].", i)
		u.validate(p, prefix, c.Upstream.GroupBy)
		if len(u.Types) == 0 && len(u.Authorities) == 0 {
			p.addf("%stypes: upstream %q lists neither types nor authorities: it would serve nothing", prefix, u.Name)
		}
		for j, t := range u.Types {
			url, err := xds.ParseType(t)
			if err != nil {
				p.addf("%stypes: %w", prefix, err)
				typesOK = false
				continue
			}
			u.Types[j] = url
		}
	}
	if !typesOK {
		return // the routes need the types resolved
	}
	if _, err := c.Routes(); err != nil {
		p.addf("upstreams: %w", err)
	}
}

// Routes returns which upstream serves which names: upstream 0 is the
// default, upstream i+1 is upstreams[i].
func (c *Config) Routes() (*upstream.Routes, error) {
	claims := []upstream.Claim{{Name: upstream.DefaultUpstream, Authorities: c.Upstream.Authorities}}
	for _, u := range c.Upstreams {
		claims = append(claims, upstream.Claim{Name: u.Name, Types: u.Types, Authorities: u.Authorities})
	}
	return upstream.NewRoutes(claims)
}

// validate checks one upstream's keys, each named with prefix.
func (u *UpstreamConfig) validate(p *problems, prefix string, groupBy []string) {
	if dir, ok := strings.CutPrefix(u.Address, FilePrefix); ok {
		if dir == "" {
			p.addf("%saddress: %q names no directory", prefix, u.Address)
		}
	} else if err := checkUpstreamAddress(u.Address); err != nil {
		p.addf("%saddress: %w", prefix, err)
	}
	for _, a := range u.Addresses {
		if err := checkHostPort(a); err != nil {
			p.addf("%saddresses: %w", prefix, err)
		}
	}
	if len(u.Addresses) > 0 && strings.HasPrefix(u.Address, FilePrefix) {
		p.addf("%saddresses: cannot be combined with a file:// %saddress", prefix, prefix)
	}
	if _, err := upstream.ParseProtocol(u.Protocol); err != nil {
		p.addf("%sprotocol: %w", prefix, err)
	}
	for _, b := range []struct {
		bad  bool
		what string
		args []any
	}{
		{u.FallbackRecheck <= 0, "%sfallback_recheck: must be positive, got %s", []any{prefix, u.FallbackRecheck}},
		{u.ReconnectBaseDelay <= 0, "%sreconnect.base_delay: must be positive, got %s", []any{prefix, u.ReconnectBaseDelay}},
		{u.ReconnectBaseDelay > 0 && u.ReconnectMaxDelay < u.ReconnectBaseDelay, "%sreconnect.max_delay: %s is below base_delay %s", []any{prefix, u.ReconnectMaxDelay, u.ReconnectBaseDelay}},
		{u.MaxMessageBytes < 1<<20, "%smax_message_bytes: %d is below 1 MiB", []any{prefix, u.MaxMessageBytes}},
		{u.MaxRequestBytes < 64<<10, "%smax_request_bytes: %d is below 64 KiB", []any{prefix, u.MaxRequestBytes}},
		{u.KeepaliveTime < 10*time.Second, "%skeepalive.time: %s is below gRPC's minimum of 10s", []any{prefix, u.KeepaliveTime}},
		{u.KeepaliveTimeout <= 0, "%skeepalive.timeout: must be positive, got %s", []any{prefix, u.KeepaliveTimeout}},
		{u.ConnectTimeout <= 0, "%sconnect_timeout: must be positive, got %s", []any{prefix, u.ConnectTimeout}},
		{u.StallTimeout < 0, "%sstall_timeout: must not be negative, got %s", []any{prefix, u.StallTimeout}},
		{u.StallTimeout > 0 && u.StallTimeout < time.Second, "%sstall_timeout: %s is below 1s: a slow link's pauses would be taken for stalls (0 never ends a stream)", []any{prefix, u.StallTimeout}},
	} {
		if b.bad {
			p.addf(b.what, b.args...)
		}
	}
	if err := checkNodeID(u.Node.ID, groupBy); err != nil {
		p.addf("%snode.id: %w", prefix, err)
	}
	switch t := u.TLS; {
	case t.CertFile != "" && t.KeyFile == "":
		p.addf("%stls.key_file: required with %stls.cert_file (the relay's client certificate and its key go together)", prefix, prefix)
	case t.CertFile == "" && t.KeyFile != "":
		p.addf("%stls.cert_file: required with %stls.key_file (the relay's client certificate and its key go together)", prefix, prefix)
	}
	if u.TLS.Insecure && u.TLS.CAFile != "" {
		p.addf("%stls.insecure_skip_verify: skips verifying the control plane, so %stls.ca_file would be ignored; set one", prefix, prefix)
	}
}

// validateGuard checks the guard.* and rollout.* keys.
func (c *Config) validateGuard(p *problems) {
	g := &c.Guard
	if g.MaxRemovedFraction < 0 || g.MaxRemovedFraction > 1 || math.IsNaN(g.MaxRemovedFraction) {
		p.addf("guard.max_removed_fraction: %v is not between 0 and 1 (0 turns the guard off)", g.MaxRemovedFraction)
	}
	if g.MinResources < 0 {
		p.addf("guard.min_resources: must not be negative, got %d", g.MinResources)
	}
	if g.MaxRemovedFraction > 0 && g.Window <= 0 {
		p.addf("guard.window: must be positive with the guard on, got %s", g.Window)
	}
	if g.Hold < 0 {
		p.addf("guard.hold: must not be negative (0 holds until released), got %s", g.Hold)
	}
	if g.WipeHold < 0 {
		p.addf("guard.wipe_hold: must not be negative (0 holds no wipe), got %s", g.WipeHold)
	}
	if c.Consistency.MaxWait < 0 {
		p.addf("consistency.max_wait: must not be negative (0 turns make before break off), got %s", c.Consistency.MaxWait)
	}
	ro := &c.Rollout
	switch {
	case ro.Canary < 0 || math.IsNaN(ro.Canary) || math.IsInf(ro.Canary, 0):
		p.addf("rollout.canary: %v is neither a fraction (below 1) nor a count (0 turns the rollout off)", ro.Canary)
	case ro.Canary >= 1 && ro.Canary != math.Trunc(ro.Canary):
		p.addf("rollout.canary: %v is a count of clients and must be whole (or a fraction below 1)", ro.Canary)
	}
	if ro.Canary > 0 && ro.Bake <= 0 {
		p.addf("rollout.bake: must be positive with rollout.canary set, got %s", ro.Bake)
	}
}

// cacheRollout is the rollout the groups' caches apply.
func (c *Config) cacheRollout() cache.Rollout {
	return cache.Rollout{Canary: c.Rollout.Canary, Bake: c.Rollout.Bake}
}

// cacheConsistency is the make before break the groups' caches keep.
func (c *Config) cacheConsistency() cache.Consistency {
	return cache.Consistency{MaxWait: c.Consistency.MaxWait}
}

// cacheGuard is the guard the groups' caches apply.
func (c *Config) cacheGuard() cache.Guard {
	return cache.Guard{MaxRemovedFraction: c.Guard.MaxRemovedFraction, MinResources: c.Guard.MinResources,
		Window: c.Guard.Window, Hold: c.Guard.Hold, WipeHold: c.Guard.WipeHold}
}

package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// Config is the relay's configuration, filled by the binary from YAML and
// the environment. Field comments name the configuration keys.
type Config struct {
	Upstream struct {
		// Address is upstream.address: the control plane's host:port, or
		// file://DIR to serve a directory of resource files.
		Address string
		// GroupBy is upstream.group_by: the node fields that form the
		// group key (id, cluster, locality.region, locality.zone,
		// locality.sub_zone, metadata.<key>); empty for one group.
		GroupBy []string
		// Addresses is upstream.addresses: more control planes, tried
		// in turn with upstream.address when one fails.
		Addresses []string
		// ReconnectBaseDelay and ReconnectMaxDelay are
		// upstream.reconnect.base_delay and .max_delay: the exponential
		// backoff (with jitter) between attempts to reach the control plane.
		ReconnectBaseDelay time.Duration
		ReconnectMaxDelay  time.Duration
		// MaxMessageBytes is upstream.max_message_bytes: the largest
		// response accepted from the control plane.
		MaxMessageBytes int
		// MaxRequestBytes is upstream.max_request_bytes: the largest
		// request sent to the control plane; larger subscriptions and
		// resumes are split over several requests.
		MaxRequestBytes int
		// KeepaliveTime and KeepaliveTimeout are upstream.keepalive.time
		// and .timeout: HTTP/2 pings on the upstream connection.
		KeepaliveTime    time.Duration
		KeepaliveTimeout time.Duration
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
	}
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
		// TLS is downstream.tls.{cert_file,key_file,client_ca_file}: TLS
		// for clients (gRPC and REST), mTLS when client_ca_file is set.
		TLS creds.TLS
		// Authorization is downstream.authorization: which nodes a client
		// may claim, by the identities of its client certificate.
		Authorization struct {
			// Rules is downstream.authorization.rules; empty admits
			// every node. Rules need client_ca_file.
			Rules []AuthorizationRule
		}
	}
	Admin struct {
		// Address is admin.address: /healthz, /readyz, /metrics; empty
		// to disable. Details that name groups or addresses are served only
		// when it is a loopback address, or to clients with a certificate
		// that TLS.CAFile verifies.
		Address string
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
	// Limits are the bounds on what clients may make the relay hold
	// ("Every bound is explicit" in DESIGN.md): each refused with
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
	}
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
}

// Default returns the default configuration: what the binary uses for a key
// that neither the file nor the environment sets.
func Default() Config {
	var c Config
	c.Upstream.Address = "127.0.0.1:18000"
	c.Upstream.GroupBy = []string{"cluster"}
	c.Upstream.ReconnectBaseDelay = 500 * time.Millisecond
	c.Upstream.ReconnectMaxDelay = 30 * time.Second
	c.Upstream.MaxMessageBytes = 256 << 20
	c.Upstream.MaxRequestBytes = upstream.DefaultMaxRequestBytes
	c.Upstream.Node.ID = DefaultNodeID
	c.Upstream.Node.UserAgentName = "xdsrelay"
	c.Upstream.KeepaliveTime = 30 * time.Second
	c.Upstream.KeepaliveTimeout = 10 * time.Second
	c.Downstream.Address = "0.0.0.0:18001"
	c.Downstream.PollTimeout = 30 * time.Second
	c.Downstream.SendTimeout = 30 * time.Second
	c.Downstream.MaxRequestBytes = 4 << 20
	c.Admin.Address = "127.0.0.1:9901"
	c.Metrics.GroupLabel = true
	c.Cache.Retention = 5 * time.Minute
	c.Cache.PersistInterval = 10 * time.Second
	c.Cache.PersistMaxBytes = 256 << 20
	c.Cache.MaxResources = 100000
	c.Cache.NotFoundTimeout = 15 * time.Second
	c.ShutdownTimeout = 10 * time.Second
	c.Limits.MaxGroups = 1000
	c.Limits.MaxNamesPerStream = 100000
	c.Limits.MaxNamesPerGroup = 1000000
	c.Limits.MaxStreamsPerConnection = 100
	c.Limits.MaxStreams = 100000
	c.Limits.StreamRate = 1000
	c.Limits.StreamBurst = 2000
	c.Limits.FirstRequestTimeout = 10 * time.Second
	c.Limits.RESTReadTimeout = 10 * time.Second
	return c
}

// FilePrefix marks an upstream address that is a directory of resource files.
const FilePrefix = "file://"

// Validate checks the configuration; an error names the key at fault.
func (c *Config) Validate() error {
	if dir, ok := strings.CutPrefix(c.Upstream.Address, FilePrefix); ok {
		if dir == "" {
			return fmt.Errorf("upstream.address: %q names no directory", c.Upstream.Address)
		}
	} else if err := checkHostPort(c.Upstream.Address); err != nil {
		return fmt.Errorf("upstream.address: %w", err)
	}
	for _, a := range c.Upstream.Addresses {
		if err := checkHostPort(a); err != nil {
			return fmt.Errorf("upstream.addresses: %w", err)
		}
	}
	if len(c.Upstream.Addresses) > 0 && strings.HasPrefix(c.Upstream.Address, FilePrefix) {
		return errors.New("upstream.addresses: cannot be combined with a file:// upstream.address")
	}
	switch {
	case c.Upstream.ReconnectBaseDelay <= 0:
		return fmt.Errorf("upstream.reconnect.base_delay: must be positive, got %s", c.Upstream.ReconnectBaseDelay)
	case c.Upstream.ReconnectMaxDelay < c.Upstream.ReconnectBaseDelay:
		return fmt.Errorf("upstream.reconnect.max_delay: %s is below base_delay %s", c.Upstream.ReconnectMaxDelay, c.Upstream.ReconnectBaseDelay)
	case c.Upstream.MaxMessageBytes < 1<<20:
		return fmt.Errorf("upstream.max_message_bytes: %d is below 1 MiB", c.Upstream.MaxMessageBytes)
	case c.Upstream.MaxRequestBytes < 64<<10:
		return fmt.Errorf("upstream.max_request_bytes: %d is below 64 KiB", c.Upstream.MaxRequestBytes)
	case c.Upstream.KeepaliveTime < 10*time.Second:
		return fmt.Errorf("upstream.keepalive.time: %s is below gRPC's minimum of 10s", c.Upstream.KeepaliveTime)
	case c.Upstream.KeepaliveTimeout <= 0:
		return fmt.Errorf("upstream.keepalive.timeout: must be positive, got %s", c.Upstream.KeepaliveTimeout)
	}
	for _, f := range c.Upstream.GroupBy {
		if err := xds.CheckNodeField(f); err != nil {
			return fmt.Errorf("upstream.group_by: %w", err)
		}
	}
	if err := checkNodeID(c.Upstream.Node.ID, c.Upstream.GroupBy); err != nil {
		return fmt.Errorf("upstream.node.id: %w", err)
	}
	if err := checkHostPort(c.Downstream.Address); err != nil {
		return fmt.Errorf("downstream.address: %w", err)
	}
	if c.Downstream.RESTAddress != "" {
		if err := checkHostPort(c.Downstream.RESTAddress); err != nil {
			return fmt.Errorf("downstream.rest_address: %w", err)
		}
	}
	if t := c.Downstream.TLS; t.Enabled() && (t.CertFile == "" || t.KeyFile == "") {
		return errors.New("downstream.tls: cert_file and key_file are both required")
	}
	if _, err := c.authorizer(); err != nil {
		return err
	}
	if c.Downstream.SendTimeout <= 0 {
		return fmt.Errorf("downstream.send_timeout: must be positive, got %s", c.Downstream.SendTimeout)
	}
	if c.Downstream.MaxRequestBytes < 64<<10 {
		return fmt.Errorf("downstream.max_request_bytes: %d is below 64 KiB", c.Downstream.MaxRequestBytes)
	}
	if c.Downstream.PollTimeout <= 0 {
		return fmt.Errorf("downstream.poll_timeout: must be positive, got %s", c.Downstream.PollTimeout)
	}
	if c.Admin.Address != "" {
		if err := checkHostPort(c.Admin.Address); err != nil {
			return fmt.Errorf("admin.address: %w", err)
		}
	}
	if t := c.Admin.TLS; t.Enabled() && (t.CertFile == "" || t.KeyFile == "") {
		return errors.New("admin.tls: cert_file and key_file are both required")
	}
	if c.Cache.Retention < 0 {
		return fmt.Errorf("cache.retention: must not be negative, got %s", c.Cache.Retention)
	}
	if c.Cache.NotFoundTimeout < 0 {
		return fmt.Errorf("cache.not_found_timeout: must not be negative, got %s", c.Cache.NotFoundTimeout)
	}
	if c.Cache.MaxResources < 0 {
		return fmt.Errorf("cache.max_resources: must not be negative, got %d", c.Cache.MaxResources)
	}
	if c.Cache.PersistDir != "" {
		if st, err := os.Stat(c.Cache.PersistDir); err != nil || !st.IsDir() {
			return fmt.Errorf("cache.persist_dir: %q is not a directory", c.Cache.PersistDir)
		}
		if c.Cache.PersistInterval <= 0 {
			return fmt.Errorf("cache.persist_interval: must be positive, got %s", c.Cache.PersistInterval)
		}
		if c.Cache.PersistMaxBytes < 64<<10 {
			return fmt.Errorf("cache.persist_max_bytes: %d is below 64 KiB", c.Cache.PersistMaxBytes)
		}
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("shutdown_timeout: must be positive, got %s", c.ShutdownTimeout)
	}
	return c.validateLimits()
}

// validateLimits checks the limits.* keys.
func (c *Config) validateLimits() error {
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
	} {
		if n.v < 0 {
			return fmt.Errorf("%s: must not be negative (0 for no bound), got %d", n.key, n.v)
		}
	}
	if l.MaxStreamsPerConnection > math.MaxUint32 {
		return fmt.Errorf("limits.max_streams_per_connection: %d is past HTTP/2's largest, %d", l.MaxStreamsPerConnection, uint32(math.MaxUint32))
	}
	if l.StreamRate < 0 || math.IsNaN(l.StreamRate) {
		return fmt.Errorf("limits.stream_rate: must not be negative (0 for no bound), got %v", l.StreamRate)
	}
	if l.StreamRate > 0 && l.StreamBurst < 1 {
		return fmt.Errorf("limits.stream_burst: must be at least 1 with limits.stream_rate %v", l.StreamRate)
	}
	if l.FirstRequestTimeout < 0 {
		return fmt.Errorf("limits.first_request_timeout: must not be negative (0 for no bound), got %s", l.FirstRequestTimeout)
	}
	if l.RESTReadTimeout < 0 {
		return fmt.Errorf("limits.rest_read_timeout: must not be negative (0 for no bound), got %s", l.RESTReadTimeout)
	}
	return nil
}

func checkHostPort(addr string) error {
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

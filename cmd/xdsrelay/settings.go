package main

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/xdsrelay/xdsrelay/fleet"
	"github.com/xdsrelay/xdsrelay/relay"
)

// A setting is one configuration key: its name, the kind of value it takes,
// the field of Options it fills and a one-line description. The field's value
// in defaultOptions is the key's default.
type setting struct {
	key   string
	kind  kind
	field any // a pointer into an Options, of the kind's type
	doc   string
}

// settings is every configuration key, declared once. Loading, defaults, type
// checking, the environment names, unknown-key detection and --help all read
// it; the tests hold config.example.yaml and docs/configuration.md to it. The fields
// point into o.
func settings(o *Options) []setting {
	d, c, l := &o.Relay.Downstream, &o.Relay.Cache, &o.Relay.Limits
	return slices.Concat(upstreamSettings("upstream.", &o.Relay.Upstream.UpstreamConfig), []setting{
		{"upstream.group_by", kindList, &o.Relay.Upstream.GroupBy, "Node fields forming the group key: id, cluster, locality.region, locality.zone, locality.sub_zone, user_agent (name/MAJOR.MINOR of a dotted numeric version, presented upstream as MAJOR.MINOR.0; another version whole, presented cut to MAJOR.MINOR), user_agent_patch (name/whole version), client_features, metadata.<key>; [] for one group. Without a user agent field and client_features, client kinds share a group."},
		{"upstreams", kindUpstreams, &o.Relay.Upstreams, "More control planes, each serving the types and xdstp authorities it lists: a list of {name, types, authorities, address, ...}, each taking every upstream.* key except group_by; from the environment as JSON."},
		{"downstream.address", kindString, &d.Address, "Where xDS clients connect (gRPC): ADS and the per-type services."},
		{"downstream.rest_address", kindString, &d.RESTAddress, "REST-JSON polling (POST /v3/discovery:<type>); empty disables it."},
		{"downstream.poll_timeout", kindDuration, &d.PollTimeout, "How long a REST-JSON or gRPC Fetch poll with a current version_info is held."},
		{"downstream.send_timeout", kindDuration, &d.SendTimeout, "A client that reads nothing for this long while a response waits is disconnected."},
		{"downstream.max_request_bytes", kindInt, &d.MaxRequestBytes, "Largest request accepted from a client."},
		{"downstream.reflection", kindBool, &d.Reflection, "gRPC server reflection on downstream.address, so that grpcurl can call CSDS and the xDS services by name; false turns it off."},
		{"downstream.max_connection_age", kindDuration, &d.MaxConnectionAge, "A gRPC client connection is sent GOAWAY after this long (±10% jitter), so that clients reconnect and spread over the replicas; 0 disables."},
		{"downstream.max_connection_age_grace", kindDuration, &d.MaxConnectionAgeGrace, "After downstream.max_connection_age, how long streams may stay open before the connection is closed (they resume from the cache elsewhere); 0 waits for them."},
		{"downstream.max_connection_idle", kindDuration, &d.MaxConnectionIdle, "A gRPC connection without streams, or a keep-alive REST-JSON connection without a request, is closed after this long; 0 disables."},
		{"downstream.tls.cert_file", kindString, &d.TLS.CertFile, "TLS certificate for clients, gRPC and REST-JSON."},
		{"downstream.tls.key_file", kindString, &d.TLS.KeyFile, "The key of downstream.tls.cert_file."},
		{"downstream.tls.client_ca_file", kindString, &d.TLS.CAFile, "Require and verify client certificates signed by this CA (mTLS)."},
		{"downstream.authorization.mode", kindString, &d.Authorization.Mode, "rules: with downstream.tls.client_ca_file, downstream.authorization.rules are required; allow-all: every client may claim every node (warned about)."},
		{"downstream.authorization.rules", kindRules, &d.Authorization.Rules, "Nodes a client may claim, by its certificate: a list of {identity: PATTERN, node: {FIELD: PATTERN}, authorities: [PATTERN]} (authorities, optional, bound the xdstp authorities it may ask for); needs downstream.tls.client_ca_file; from the environment as JSON."},
		{"admin.address", kindString, &o.Relay.Admin.Address, "Admin HTTP endpoint (/healthz, /readyz, /metrics); empty disables it. Details naming groups are served only on a loopback address, on admin.local_address, or over admin.tls with a client certificate."},
		{"admin.local_address", kindString, &o.Relay.Admin.LocalAddress, "A second admin listener, on a loopback address only, opened when admin.address is not loopback: it serves the read-only views (the detailed /readyz, /debug/ groups, clients, cache, convergence, config dump, guard holds, rollout changes) to callers inside the pod (kubectl port-forward, kubectl exec) without a certificate, never to a request that came through a proxy, and never the paths that change the process; empty opens none."},
		{"admin.tls.cert_file", kindString, &o.Relay.Admin.TLS.CertFile, "TLS certificate for the admin endpoint (HTTPS)."},
		{"admin.tls.key_file", kindString, &o.Relay.Admin.TLS.KeyFile, "The key of admin.tls.cert_file."},
		{"admin.tls.client_ca_file", kindString, &o.Relay.Admin.TLS.CAFile, "Client certificates signed by this CA see the admin details on any address; requests without one get the general answers."},
		{"admin.advertise_address", kindString, &o.Relay.Admin.AdvertiseAddress, "The host:port at which the relay above reaches this relay's admin endpoint (a pod IP and the admin port), put in the node the relay presents upstream (metadata xdsrelay.admin) so that xdsrelay wait --tiers counts this relay's clients in its place; empty advertises nothing."},
		{"admin.pprof", kindBool, &o.Relay.Admin.Pprof, "Serve Go's profiler (net/http/pprof) under /debug/pprof/ on the admin endpoint, to private callers only, with the mutex profile sampled (1 contention event in 100)."},
		{"admin.ready_after_sync", kindBool, &o.Relay.Admin.ReadyAfterSync, "Report ready (/readyz, gRPC health) only once there is something to serve: a control-plane answer (before any client, a connection to a control plane that does not refuse upstream.protocol), the resource files, or a restored cache."},
		{"metrics.group_label", kindBool, &o.Relay.Metrics.GroupLabel, "Per-group series on /metrics carry the group's id (as xdsrelay groups shows it) as their group label; false sums them without it."},
		{"cache.retention", kindDuration, &c.Retention, "How long a resource nobody watches stays subscribed upstream and cached; also how long a new state-of-the-world stream to the control plane has to send a name held under the wildcard (other than Listeners and Clusters) before it is removed, 0 never."},
		{"cache.max_resources", kindInt, &c.MaxResources, "Per group, resources past this many that nobody watches are dropped, least recently used first; 0 for no bound."},
		{"cache.not_found_timeout", kindDuration, &c.NotFoundTimeout, "A requested name that has not arrived from upstream this long after it was first asked for is reported to incremental clients as not existing; a stream the control plane has answered nothing on this long after it asked is warned of, with the node id presented (upstream.node.id). 0 disables both."},
		{"cache.persist_dir", kindString, &c.PersistDir, "Directory where each group's cache is saved and restored from on start; empty disables it. The relay's own: temporary files of saves cut short (.tmp-*) are removed at start."},
		{"cache.persist_interval", kindDuration, &c.PersistInterval, "How often changed caches are saved (and once more on shutdown)."},
		{"cache.persist_max_bytes", kindInt, &c.PersistMaxBytes, "Largest cache file restored (a larger one is refused unread) or saved."},
		{"limits.max_groups", kindInt, &l.MaxGroups, "Groups (upstream streams) at most; a client whose node would start one more is refused (RESOURCE_EXHAUSTED); 0 for no bound."},
		{"limits.max_names_per_stream", kindInt, &l.MaxNamesPerStream, "Names one stream or poll subscribes to, across types; a request past it ends the stream (RESOURCE_EXHAUSTED); 0 for no bound."},
		{"limits.max_names_per_group", kindInt, &l.MaxNamesPerGroup, "Names one group wants upstream, watched or retained; a request past it ends its stream (RESOURCE_EXHAUSTED). Names resources point at (consistency) count too, for requests as for references: past it they are not fetched (xdsrelay_references_refused_total). 0 for no bound."},
		{"limits.max_streams_per_connection", kindInt, &l.MaxStreamsPerConnection, "Concurrent streams on one client connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); more wait; 0 for no bound."},
		{"limits.max_streams", kindInt, &l.MaxStreams, "Open xDS streams in total; more are refused (RESOURCE_EXHAUSTED); 0 for no bound."},
		{"limits.stream_rate", kindRate, &l.StreamRate, "New xDS streams admitted a second; more are refused (RESOURCE_EXHAUSTED); 0 for no bound."},
		{"limits.stream_burst", kindInt, &l.StreamBurst, "New streams admitted at once above limits.stream_rate (the token bucket's size)."},
		{"limits.first_request_timeout", kindDuration, &l.FirstRequestTimeout, "A stream that sends no request for this long is ended (RESOURCE_EXHAUSTED); 0 for no bound."},
		{"limits.rest_read_timeout", kindDuration, &l.RESTReadTimeout, "A REST-JSON request's headers, then its body, must arrive within this (a held poll's answer is not bounded by it); 0 for no bound."},
		{"limits.max_polls", kindInt, &l.MaxPolls, "REST-JSON and gRPC Fetch polls in progress at once, held ones included; more are refused (RESOURCE_EXHAUSTED, 429); 0 for no bound."},
		{"guard.max_removed_fraction", kindRatio, &o.Relay.Guard.MaxRemovedFraction, "Hold the removals when the control plane removes more than this fraction of a group's resources of one type within guard.window; 0 turns the guard off."},
		{"guard.min_resources", kindInt, &o.Relay.Guard.MinResources, "A type holding fewer resources than this is never held."},
		{"guard.window", kindDuration, &o.Relay.Guard.Window, "How far back the guard adds up removals."},
		{"guard.hold", kindDuration, &o.Relay.Guard.Hold, "How long a hold lasts before its removals are applied; 0 holds until released."},
		{"guard.wipe_hold", kindDuration, &o.Relay.Guard.WipeHold, "How long a removal of every resource of a type waits, at any size, for the control plane to send them again; then it is applied. 0 lets it through at once."},
		{"consistency.max_wait", kindDuration, &o.Relay.Consistency.MaxWait, "How long a resource from the control plane that points at a Cluster the group lacks, or at that Cluster's endpoints (a Route's Clusters, a Listener's inline route Clusters), waits for them before clients get it, and a removal of a name that what clients hold still points at waits for nothing to point at it; then the control plane's word wins, with a warning. Every name a resource points at is fetched as an interest of the group; the others (a Cluster's endpoints, a Listener's Route, Secrets) are not waited for: the client warms them. A name a wait ran out on is not waited for again until it exists. The default (1s) is 70 times and more the Route-before-Cluster race it closes at a gRPC client's first RPC (3-14 ms; about 110 ms with a control plane 20 ms away), and bounds what a name that never comes holds (docs/control-planes.md, References). 0 turns it off."},
		{"rollout.canary", kindRate, &o.Relay.Rollout.Canary, "Per type, the fraction (below 1, e.g. 0.05) or the count (1 or more, e.g. 3) of a group's clients that get a change from the control plane first; the rest get it once they ACK it, or after rollout.bake without a NACK. 0 turns the rollout off."},
		{"rollout.bake", kindDuration, &o.Relay.Rollout.Bake, "How long a change waits for the canaries' verdict; a NACK within it holds the change from the rest of the group."},
		{"lrs.interval", kindDuration, &o.Relay.LRS.Interval, "How often load-reporting (LRS) clients are told to report until the control plane answers, or when it names no interval."},
		{"lrs.min_interval", kindDuration, &o.Relay.LRS.MinInterval, "The shortest load_reporting_interval taken from the control plane: one below it is raised to it, both for what clients are told and for the relay's own reports, logged once per group and counted in xdsrelay_lrs_clamped_intervals_total. At most lrs.interval; 0 (the default) is 1s, or lrs.interval if that is shorter."},
		{"lrs.max_pending", kindInt, &o.Relay.LRS.MaxPending, "Per group, the relay's load reports (one per interval) held while the control plane cannot be reached; they go out together once it is back. Past this many the oldest is dropped and counted in xdsrelay_lrs_dropped_reports_total."},
		{"lrs.send_timeout", kindDuration, &o.Relay.LRS.SendTimeout, "A load report whose send to the control plane has not returned within this (a control plane that reads nothing) ends the stream, which is opened again: the report that could not be written is sent on the next stream, and the cluster stats of the one written before it, which the control plane never read, are counted in xdsrelay_lrs_dropped_stats_total{reason=\"send_blocked\"}. The last report at shutdown or when a group ends waits 1s at most."},
		{"lrs.max_pending_bytes", kindInt, &o.Relay.LRS.MaxPendingBytes, "Per group, the encoded size of the load reports held while the control plane cannot be reached (held encoded: about their size in memory). Past it they are merged into one report over their whole time; if that is still past it, the oldest are dropped, counted in xdsrelay_lrs_dropped_reports_total and xdsrelay_lrs_dropped_stats_total{reason=\"max_pending_bytes\"}. The newest period is always kept."},
		{"lrs.max_names", kindInt, &o.Relay.LRS.MaxNames, "Per group and period, the distinct names clients' load reports may add (clusters, localities, endpoints, named metrics, drop categories), and the gauges held; stats past it are left out, counted in xdsrelay_lrs_dropped_stats_total{reason=\"max_names\"} and logged once per group."},
	}, fleetSettings(&o.Relay.Fleet), []setting{
		{"shutdown_timeout", kindDuration, &o.Relay.ShutdownTimeout, "How long shutdown waits for streams to end before closing them."},
		{"log.level", kindLevel, &o.LogLevel, "debug, info, warn or error; changed at run time with PUT /debug/loglevel."},
		{"log.format", kindString, &o.LogFormat, "text (key=value) or json (one JSON object a line)."},
		{"tracing.otlp_endpoint", kindString, &o.Tracing.Endpoint, "OpenTelemetry collector (OTLP/gRPC, host:port); empty disables tracing."},
		{"tracing.insecure", kindBool, &o.Tracing.Insecure, "Plaintext to the collector."},
		{"tracing.sample_ratio", kindRatio, &o.Tracing.SampleRatio, "Fraction of new traces kept (0 to 1)."},
	})
}

// fleetSettings are the fleet.* keys, their fields in f.
func fleetSettings(f *fleet.Config) []setting {
	return []setting{
		{"fleet.peers", kindList, &f.Peers, "The replicas of this relay as host:port, their xDS addresses (this one's included): a name is resolved every fleet.refresh and each address it resolves to is a member (a headless Service gives every pod's). Each group is then fetched from the control plane once per fleet, by its owner, and the other members fetch it from the owner; empty for no fleet."},
		{"fleet.self", kindString, &f.Self, "This replica's own xDS address as the others dial it ($(POD_IP):port from the downward API); required with fleet.peers."},
		{"fleet.refresh", kindDuration, &f.Refresh, "How often fleet.peers' names are resolved again; members are asked at least this often, and one that stops answering is out within upstream.connect_timeout."},
		{"fleet.balance", kindBool, &f.Balance, "Balance clients over the fleet: a member holding more than (1 + fleet.balance_slack) times the mean (and more than the mean rounded up, plus one) closes some of its client connections (they reconnect through the Service), at most fleet.shed_per_second."},
		{"fleet.balance_slack", kindRate, &f.BalanceSlack, "How far above the fleet's mean a member's client count may go before it sheds (0.2: 20%)."},
		{"fleet.shed_per_second", kindRate, &f.ShedPerSecond, "The most client connections a member closes a second to balance the fleet."},
		{"fleet.peer_identities", kindList, &f.PeerIdentities, "With downstream.tls.client_ca_file: the identities (URI SAN, DNS SAN or subject CN) of the replicas' certificates, the only callers whose peer mark is believed and who may ask for any group; required then. From anyone else the mark is ignored and counted."},
	}
}

// upstreamSettings are one control plane's keys, named with prefix, their
// fields in u: upstream.* for the default upstream, and (prefix "") the keys
// of an upstreams entry. group_by is not among them: it is one setting for
// the whole relay.
func upstreamSettings(prefix string, u *relay.UpstreamConfig) []setting {
	out := []setting{
		{"address", kindString, &u.Address, "The control plane as host:port (spoken to as upstream.protocol says), or file://DIR: a directory of resource files."},
		{"addresses", kindList, &u.Addresses, "Fallback servers (host:port) in priority order after upstream.address: used only while the higher ones are unreachable and something wanted is not cached (gRFC A71)."},
		{"protocol", kindString, &u.Protocol, "What the control plane is spoken to in: auto (delta ADS, then state-of-the-world ADS, then the per-type SotW services, the first each server does not refuse: UNIMPLEMENTED, or UNKNOWN \"not implemented\" as go-control-plane <= v0.9.8 and Gloo say it), delta, sotw or sotw-per-type."},
		{"fallback_recheck", kindDuration, &u.FallbackRecheck, "While on a fallback server, how often the higher-priority servers are checked; the relay moves back to the first that is reachable (gRFC A71)."},
		{"authorities", kindList, &u.Authorities, "xdstp authorities (xdstp://AUTHORITY/...) the default control plane serves (gRFC A47); once any upstream lists one, an xdstp name under an authority none lists does not exist."},
		{"reconnect.base_delay", kindDuration, &u.ReconnectBaseDelay, "First delay before reconnecting to the control plane; grows exponentially with jitter."},
		{"reconnect.max_delay", kindDuration, &u.ReconnectMaxDelay, "Largest reconnect delay."},
		{"max_message_bytes", kindInt, &u.MaxMessageBytes, "Largest response accepted from the control plane."},
		{"max_request_bytes", kindInt, &u.MaxRequestBytes, "Largest request sent to the control plane; larger subscriptions and resumes are split over several requests."},
		{"keepalive.time", kindDuration, &u.KeepaliveTime, "HTTP/2 keepalive ping interval on the upstream connection (at least 10s)."},
		{"keepalive.timeout", kindDuration, &u.KeepaliveTimeout, "How long a keepalive ping may go unanswered before the connection is closed; also bounds the probe of a silent stream's connection before a name is reported not to exist."},
		{"stall_timeout", kindDuration, &u.StallTimeout, "A response from the control plane that began to arrive and made no progress this long, its connection alive, stalls its stream: it is ended and opened again (at least 1s; 0 never ends one). No name is reported not to exist while a response is partly received."},
		{"connect_timeout", kindDuration, &u.ConnectTimeout, "A connection attempt to the control plane (TCP, TLS, HTTP/2 handshake) not complete by then is given up, as to an address that accepts and answers nothing. The longest also bounds how long a SotW Listener or Cluster state is held for a name a returning client may hold and the relay lacks, before its stream ends with UNAVAILABLE."},
		{"tls.enabled", kindBool, &u.TLSEnabled, "TLS to the control plane with the system roots; any upstream.tls file also turns TLS on."},
		{"tls.cert_file", kindString, &u.TLS.CertFile, "The relay's client certificate (mTLS). Without it, when the control plane asks for one, the upstream's errors (in the log, /readyz, /debug/groups) say so and name this key, rather than only \"broken pipe\"."},
		{"tls.key_file", kindString, &u.TLS.KeyFile, "The key of the relay's client certificate."},
		{"tls.ca_file", kindString, &u.TLS.CAFile, "CA bundle verifying the control plane."},
		{"tls.server_name", kindString, &u.TLS.ServerName, "Name verified in the control plane's certificate, if not the dialled one."},
		{"tls.insecure_skip_verify", kindBool, &u.TLS.Insecure, "Do not verify the control plane (testing only)."},
		{"node.id", kindString, &u.Node.ID, "Template of the node id presented upstream for each group: {hostname}, {group} and group_by fields such as {cluster}."},
		{"node.metadata", kindMap, &u.Node.Metadata, "Metadata added to the node presented upstream for each group."},
		{"node.user_agent_name", kindString, &u.Node.UserAgentName, "user_agent_name of the node presented upstream."},
		{"headers", kindMap, &u.Headers, "Metadata sent on every upstream RPC; from the environment name=value,name2=value2."},
		{"forward_nacks", kindBool, &u.ForwardNACKs, "When clients reject (NACK) a version of a resource the control plane sent, tell it: a NACK of its response on the group's stream naming the resource, the version, how many clients rejected it and the first error; once per version, at most one per type every 5s per group (coalesced), counted in xdsrelay_upstream_forwarded_nacks_total. The relay keeps serving what the control plane sent."},
	}
	for i := range out {
		out[i].key = prefix + out[i].key
	}
	return out
}

// defaultOptions is what the binary runs with when nothing is configured.
func defaultOptions() Options {
	return Options{
		Relay:     relay.Default(),
		LogLevel:  slog.LevelInfo,
		LogFormat: "text",
		Tracing:   TracingOptions{SampleRatio: 0.01},
	}
}

// settingsByKey indexes settings(o) by key.
func settingsByKey(o *Options) map[string]setting {
	m := map[string]setting{}
	for _, s := range settings(o) {
		m[s.key] = s
	}
	return m
}

// envName is the environment variable that sets key: XDSRELAY_ and the key
// in upper case, dots becoming underscores.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

const envPrefix = "XDSRELAY_"

// A kind is the type of a key's value: how it is read from YAML and from the
// environment, and how its default is written.
type kind int

const (
	kindString    kind = iota // *string
	kindDuration              // *time.Duration: a Go duration; a bare 0 is allowed
	kindInt                   // *int
	kindBool                  // *bool
	kindList                  // *[]string: a YAML list of strings; comma separated in the environment
	kindMap                   // *map[string]string: a YAML map of strings; name=value,... in the environment
	kindRatio                 // *float64 from 0 to 1
	kindLevel                 // *slog.Level: debug, info, warn or error
	kindRules                 // *[]relay.AuthorizationRule: a YAML list of maps; JSON in the environment
	kindRate                  // *float64, not negative: a rate per second, or rollout.canary's fraction or count
	kindUpstreams             // *[]relay.UpstreamConfig: a YAML list of maps of upstream keys; JSON in the environment
)

var kindNames = [...]string{"string", "duration", "int", "bool", "list", "map", "ratio", "level", "rules", "rate", "upstreams"}

func (k kind) String() string { return kindNames[k] }

// set stores raw in the setting's field: raw is a value decoded from YAML, or
// (fromEnv) the string from the environment. The error does not name the key.
func (s setting) set(raw any, fromEnv bool) error {
	switch s.kind {
	case kindString:
		return decodeString(raw, s.field.(*string))
	case kindDuration:
		return decodeDuration(raw, s.field.(*time.Duration))
	case kindInt:
		return decodeInt(raw, s.field.(*int))
	case kindBool:
		return decodeBool(raw, s.field.(*bool))
	case kindList:
		return decodeList(raw, fromEnv, s.field.(*[]string))
	case kindMap:
		return decodeMap(raw, fromEnv, s.field.(*map[string]string))
	case kindRatio:
		return decodeRatio(raw, s.field.(*float64))
	case kindLevel:
		return decodeLevel(raw, s.field.(*slog.Level))
	case kindRules:
		return decodeRules(raw, fromEnv, s.field.(*[]relay.AuthorizationRule))
	case kindRate:
		return decodeRate(raw, s.field.(*float64))
	case kindUpstreams:
		return decodeUpstreams(raw, fromEnv, s.field.(*[]relay.UpstreamConfig))
	}
	panic(fmt.Sprintf("config: key %s has unknown kind %d", s.key, s.kind))
}

func decodeString(raw any, dst *string) error {
	s, ok := raw.(string)
	if !ok {
		return fmt.Errorf("want a string, got %v", raw)
	}
	*dst = s
	return nil
}

func decodeDuration(raw any, dst *time.Duration) error {
	switch val := raw.(type) {
	case int:
		if val != 0 {
			return fmt.Errorf("want a duration, got %v (durations need a unit, e.g. %ds)", val, val)
		}
		*dst = 0 // a bare 0 is the one duration that needs no unit
		return nil
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("%q is not a duration (e.g. 30s, 5m)", val)
		}
		*dst = d
		return nil
	}
	return fmt.Errorf("want a duration (e.g. 30s, 5m), got %v", raw)
}

func decodeInt(raw any, dst *int) error {
	switch val := raw.(type) {
	case int:
		*dst = val
		return nil
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("%q is not a whole number", val)
		}
		*dst = n
		return nil
	}
	return fmt.Errorf("want a whole number, got %v", raw)
}

func decodeBool(raw any, dst *bool) error {
	switch val := raw.(type) {
	case bool:
		*dst = val
		return nil
	case string:
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("%q is not true or false", val)
		}
		*dst = b
		return nil
	}
	return fmt.Errorf("want true or false, got %v", raw)
}

// fromFlow reads a value from the environment written as YAML writes it
// in a flow, [a, b] or {k: v} (as config.example.yaml shows the keys):
// the decoded value, and whether it was one.
func fromFlow(s string, open string) (any, bool, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, open) {
		return nil, false, nil
	}
	var v any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		return nil, true, fmt.Errorf("%q does not read as YAML: %w", s, err)
	}
	return v, true, nil
}

// decodeList reads a YAML list of strings, or from the environment a
// comma-separated string or a YAML flow list ([a, b], [] for none). A
// YAML scalar is not a list of one: it is an error.
func decodeList(raw any, fromEnv bool, dst *[]string) error {
	if s, ok := raw.(string); ok && fromEnv {
		if v, flow, err := fromFlow(s, "["); flow {
			if err != nil {
				return err
			}
			if v == nil {
				v = []any{}
			}
			return decodeList(v, false, dst)
		}
		var out []string
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
		*dst = out
		return nil
	}
	list, ok := raw.([]any)
	if !ok {
		return fmt.Errorf("want a list such as [a, b] ([] for none), got %v", raw)
	}
	out := make([]string, 0, len(list))
	for _, e := range list {
		s, ok := e.(string)
		if !ok {
			return fmt.Errorf("want a list of strings, got %v in %v", e, raw)
		}
		out = append(out, s)
	}
	*dst = out
	return nil
}

// decodeMap reads a YAML map of strings, or from the environment name=value
// pairs separated by commas or a YAML flow map ({name: value}).
func decodeMap(raw any, fromEnv bool, dst *map[string]string) error {
	if s, ok := raw.(string); ok && fromEnv {
		if v, flow, err := fromFlow(s, "{"); flow {
			if err != nil {
				return err
			}
			if v == nil {
				v = map[string]any{}
			}
			return decodeMap(v, false, dst)
		}
		return decodePairs(s, dst)
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return fmt.Errorf("want a map of names to values, got %v", raw)
	}
	out := make(map[string]string, len(m))
	for k, x := range m {
		s, ok := x.(string)
		if !ok {
			return fmt.Errorf("%s: want a string, got %v", k, x)
		}
		out[k] = s
	}
	*dst = out
	return nil
}

func decodePairs(s string, dst *map[string]string) error {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, x, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%q is not name=value", kv)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(x)
	}
	*dst = out
	return nil
}

func decodeRatio(raw any, dst *float64) error {
	f, err := decodeNumber(raw)
	if err != nil {
		return fmt.Errorf("want a number from 0 to 1: %w", err)
	}
	if f < 0 || f > 1 {
		return fmt.Errorf("%v is not between 0 and 1", f)
	}
	*dst = f
	return nil
}

func decodeRate(raw any, dst *float64) error {
	f, err := decodeNumber(raw)
	if err != nil {
		return fmt.Errorf("want a number per second: %w", err)
	}
	if f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return fmt.Errorf("%v is not a number of 0 or more", f)
	}
	*dst = f
	return nil
}

func decodeNumber(raw any) (float64, error) {
	switch val := raw.(type) {
	case float64:
		return val, nil
	case int:
		return float64(val), nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a number", val)
		}
		return f, nil
	}
	return 0, fmt.Errorf("got %v", raw)
}

func decodeLevel(raw any, dst *slog.Level) error {
	s, ok := raw.(string)
	if !ok || dst.UnmarshalText([]byte(strings.TrimSpace(s))) != nil {
		return fmt.Errorf("%v is not one of debug, info, warn, error", raw)
	}
	return nil
}

// formatValue writes a setting's current value as the documentation does:
// "empty" for an empty string, [a, b] for a list, durations without zero
// units (5m, not 5m0s).
func formatValue(s setting) string {
	switch v := s.field.(type) {
	case *string:
		if *v == "" {
			return "empty"
		}
		return *v
	case *time.Duration:
		return shortDuration(*v)
	case *[]string:
		return "[" + strings.Join(*v, ", ") + "]"
	case *map[string]string:
		var pairs []string
		for _, k := range slices.Sorted(maps.Keys(*v)) {
			pairs = append(pairs, k+": "+(*v)[k])
		}
		return "{" + strings.Join(pairs, ", ") + "}"
	case *slog.Level:
		return strings.ToLower(v.String())
	case *[]relay.AuthorizationRule:
		return formatRules(*v)
	case *[]relay.UpstreamConfig:
		return formatUpstreams(*v)
	case *int:
		return strconv.Itoa(*v)
	case *bool:
		return strconv.FormatBool(*v)
	case *float64:
		return strconv.FormatFloat(*v, 'g', -1, 64)
	}
	panic(fmt.Sprintf("config: key %s has a field of unsupported type %T", s.key, s.field))
}

// shortDuration is d.String() without trailing zero units: 5m, 1h30m, 0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if d == 0 || d%time.Second != 0 {
		return s
	}
	s = strings.TrimSuffix(s, "m0s")
	if s != d.String() {
		s += "m"
	}
	if t := strings.TrimSuffix(s, "h0m"); t != s {
		s = t + "h"
	}
	return s
}

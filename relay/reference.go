package relay

import (
	"fmt"
	"strings"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
)

// What the generated references (docs/metrics.md, docs/admin.md) read of
// the relay: its metric families as registered, and its admin paths. A
// test holds the admin paths to what adminHandler registers, and their
// access to what each answers a caller who is not private.

// MetricFamilies describes every metric family the relay registered, sorted
// by name.
func (r *Relay) MetricFamilies() []metrics.Family { return r.metrics.Families() }

// Who may call an admin path (see adminListener.access).
const (
	// AdminAnyone: any caller that reaches admin.address.
	AdminAnyone = "anyone"
	// AdminDetails: any caller; a private or local one gets more.
	AdminDetails = "anyone; the details to private and local callers"
	// AdminViews: private and local callers; others get 403.
	AdminViews = "private and local callers"
	// AdminPrivate: private callers; others, local ones included, get 403.
	AdminPrivate = "private callers only"
)

// AdminPath is one path of the admin endpoint.
type AdminPath struct {
	// Pattern is the path as the endpoint's mux registers it: a method
	// and a path, or a path alone for every method.
	Pattern string
	// Access is AdminAnyone, AdminDetails or AdminPrivate.
	Access string
	// Served says when the path is served; empty: always.
	Served string
	// Returns is what it answers, in Markdown.
	Returns string
}

// Shown is the pattern as people write it: "GET /" for the mux's exact
// root, "GET /{$}".
func (p AdminPath) Shown() string { return strings.TrimSuffix(p.Pattern, "{$}") }

// When the paths served only with a setting are served (AdminPath.Served).
const (
	servedWithLogLevel = "with a run-time log level (the binary always has one)"
	servedWithPprof    = "with `admin.pprof: true` (else 404)"
)

// AdminPaths are the admin endpoint's paths, in the order the reference
// lists them.
func AdminPaths() []AdminPath {
	return []AdminPath{
		{Pattern: "GET /{$}", Access: AdminAnyone,
			Returns: "This index: every path below, who may call it and when it is served, as text (Envoy's admin endpoint has one too). Other paths that are not below are 404."},
		{Pattern: "GET /healthz", Access: AdminAnyone,
			Returns: "200 `ok` while the process runs (a liveness probe)."},
		{Pattern: "GET /readyz", Access: AdminDetails,
			Returns: "200 once the relay serves, whatever the control plane does (clients are served from the cache); 503 `not ready: starting`, `not ready: waiting for the first upstream sync: ...` (with `admin.ready_after_sync`, and why) or `not ready: shutting down`. To anyone, one line in general terms: `ready`, or `ready; ...` with counts (groups with upstream down, guard holds and held rollouts, invalid resources, saved caches that did not load), never a group key, an address or a file name. To a private caller, each group's upstream state (connected, down, or `refused:` what the server refused in its own words and what the relay tries next; the server in use, the protocol it speaks, the types it does not serve, resources cached, time since the last response), `DEGRADED:` lines for guard holds and changes a canary NACKed, resource files rejected as invalid, saved caches that did not load or failed to save, and the configuration warnings (`warning: ...`)."},
		{Pattern: "GET /metrics", Access: AdminAnyone,
			Returns: "The metrics in the Prometheus text format, or OpenMetrics when the `Accept` header asks for it: every family in [metrics.md](metrics.md). Its `group` label carries group ids, made of group keys: keep `admin.address` private, or set `metrics.group_label: false`, if they are sensitive."},
		{Pattern: "GET /debug/loglevel", Access: AdminViews, Served: servedWithLogLevel,
			Returns: "The current log level: `debug`, `info`, `warn` or `error`."},
		{Pattern: "PUT /debug/loglevel", Access: AdminPrivate, Served: servedWithLogLevel,
			Returns: "Sets the log level to the body's `debug`, `info`, `warn` or `error` until the next restart, logs the change at `warn` and answers the new level; 400 for another body."},
		{Pattern: "/debug/pprof/", Access: AdminPrivate, Served: servedWithPprof,
			Returns: "Go's profiler (`net/http/pprof`): the index, and `heap`, `goroutine`, `allocs`, `block`, `mutex` (sampled 1 contention event in " + fmt.Sprint(mutexProfileFraction) + " with `admin.pprof`), `threadcreate` by name."},
		{Pattern: "/debug/pprof/cmdline", Access: AdminPrivate, Served: servedWithPprof,
			Returns: "The process's command line."},
		{Pattern: "/debug/pprof/profile", Access: AdminPrivate, Served: servedWithPprof,
			Returns: "A CPU profile over `?seconds=N` (default 30)."},
		{Pattern: "/debug/pprof/symbol", Access: AdminPrivate, Served: servedWithPprof,
			Returns: "Symbols for program counters (for `go tool pprof`)."},
		{Pattern: "/debug/pprof/trace", Access: AdminPrivate, Served: servedWithPprof,
			Returns: "An execution trace over `?seconds=N` (default 1)."},
		{Pattern: "GET /debug/clients", Access: AdminViews,
			Returns: "JSON, one entry per live xDS stream: `node` id, `group` id, `variant` (`sotw-ads`, `delta-ads`, `sotw`, `delta`) and, per type, `subscribed` (names subscribed by name), `wildcard`, `resources` (names with a status), `last_ack_version`, `last_nack_version`, `last_nack_error`, `last_nack_time`."},
		{Pattern: "GET /debug/groups", Access: AdminViews,
			Returns: "JSON, one entry per group: `id` (the name the logs, the metrics' `group` label, `/readyz`, the other `/debug/` paths and the commands give it: the key, or a prefix of a key over 48 bytes and 12 hex digits of its hash), `key` (the whole group key, clipped to 1 KiB), the `user_agent` and `client_features` its clients share, `upstream_connected`, `upstream_last_error`, `invalid`, `last_response`, `resources` cached, `clients`, per type what the group subscribes upstream (`wildcard`, `names`), `upstreams` (each upstream it has a stream to: `name`, the `server` in use (for resource files, their `file://` address), the `protocol` it answered in (`delta`, `sotw`, `sotw-per-type`), `connected`, `last_error`, `refused` (what the server refused on the last stream, in its words, and what the relay tries next), `unserved` (the types the server was found not to serve, not asked of it), `last_response`), `guard_holds` (`type`, `since`, `names`, and `wipe` for a wipe's hold), `rollouts` (changes waiting for the canaries: `since`, `types`, `resources`, `canaries`, `acked`, `held`, `nacked_by`, `nack_error`) and `load_reports` (null until a client reports load; then `clients`, `interval`, `send_all_clusters`, `clusters`, `endpoint_granularity`, `control_plane_answered`, `pending_reports`, `pending_bytes`, `upstream_stream` and `last_report`)."},
		{Pattern: "GET /debug/cache", Access: AdminViews,
			Returns: "Without `type`: JSON list of the groups (or of the group `?group=ID`), each with its `group` id, the `resources` it caches and its `types` (`type`, `resources`, and the cache's `version` of the type, which changes whenever a resource of it does). `?group=ID&type=TYPE[&bodies=true]`: JSON list of one type's resources in one group's cache, `name` and `version`, and with `bodies=true` the `resource` as protojson (never a Secret's: the admin endpoint shows no private key). `TYPE` is any name of the type (`clusters`, `Cluster`, `cds` or its type URL; see [Resource types](cli.md#resource-types)). 400 for an unknown type (the answer lists the names) or a type without a group, 404 if there is no group `ID` (a group is named by its id, or by its whole key)."},
		{Pattern: "GET /debug/config_dump", Access: AdminViews,
			Returns: "`?node=ID[&type=TYPE]`: what each live stream of the client with node id `ID` holds, like Envoy's `/config_dump` (or `istioctl proxy-config`) for that client: JSON with `node` and `streams` (at most " + fmt.Sprint(maxDumpStreams) + ", `more` counting the rest), each with its `group`, `variant` and `config_dump`, an `envoy.admin.v3.ConfigDump` in its JSON form: `configs` holds, for each type Envoy's dump has a form for, that form (`ClustersConfigDump`, `EcdsConfigDump`, `EndpointsConfigDump`, `ListenersConfigDump`, `ScopedRoutesConfigDump`, `RoutesConfigDump`, `SecretsConfigDump`), its `version_info` the version the client last ACKed, each resource with its body as the client was sent it, the `version_info` it was sent, `last_updated` (when) and `client_status` (`ACKED`, or `REQUESTED` while not answered); then one `envoy.service.status.v3.ClientConfig` whose `generic_xds_configs`, as CSDS gives them, hold the rest: the types Envoy's dump has no form for (virtual hosts, LEDS, runtime) and the names without a body (subscribed and not sent, `DOES_NOT_EXIST`, `NACKED` with its `error_state`: the client keeps an earlier version, which the relay does not record; or a version the cache has let go). Secrets are shown without their bodies. Read from the streams' own status (as CSDS) and the group's cache, not a copy. `TYPE` narrows it to one type. 400 without `node` or for an unknown type, 404 if no client with that node id is connected. `xdsrelay config-dump` calls it."},
		{Pattern: "GET /debug/convergence", Access: AdminViews,
			Returns: "Where the clients stand with each resource's versions, from counters kept as responses are sent and answered (never by visiting the clients): JSON with `summary` (per `group` and `type`, without `?name=`: its `resources`, and its clients, each counted once however many resources it holds, in the first class that applies: `rejected` (NACKed a resource it holds), `behind` (owed a change of the type not sent yet: a held rollout, a slow client), `pending` (sent something not answered yet), `accepted` (acknowledged everything it was sent), `waiting` (holds nothing yet); `subscribed` is their sum; with a fleet, `peer_streams` are the peers' streams of the type, which are not clients and are left out of the counts: each member counts its own) and `resources` (per resource: `group`, `type`, `name`, its current `version` and the `upstream_version` it came with (a SotW response's `version_info`, a delta response's `system_version_info`), `subscribed`, `accepted`, `rejected`, `pending`, `behind`, and `versions`, the current first, each with `received`, `accepted`, `rejected`, `pending`, `oldest_pending_seconds`, the first NACK's `error`, up to " + fmt.Sprint(cache.MaxRejectedBy) + " node ids in `rejected_by`, and the time to accept it from `received` to each ACK: `acks`, `p50_seconds`, `p99_seconds`, `max_seconds`). `?group=ID`, `?type=T` (any name of the type) and `?name=N` (repeatable) narrow it; at most `?limit=N` resources are listed (" + fmt.Sprint(convergenceLimit) + " by default), `more` says how many matched past it. `tiers` lists the lower relays among the groups' clients (`group`, `node`, and the `admin` endpoint their node advertises with `admin.advertise_address`; at most 1000 a group, `tiers_more` counting the streams of the others), which `xdsrelay wait --tiers` asks in turn. With a fleet, `fleet_paths` says where each group comes from (as `groups` in `/debug/fleet`): a peer drawing a group from this replica is one of its clients, and a lower relay to `wait --tiers`. With `?bytes_version=1` each listed resource also has its `bytes_version`: a hash of its bytes, the version a relay below that speaks SotW holds it at. 400 for an unknown type, 404 for an unknown group. An ACK means the client accepted the configuration, not that traffic uses it. `xdsrelay wait` and `xdsrelay status --summary` read it."},
		{Pattern: "GET /debug/references", Access: AdminViews,
			Returns: "`?group=ID`: JSON of make before break in one group's cache (`consistency.max_wait`; see [References](control-planes.md#references)): `dangling`, the names its resources point at that it lacks (`type`, `name`, and `from`, what points at each: `type`, `name`), and `waiting`, what clients do not get yet (`type`, `name`, `since`, `removal`; for a resource the names it lacks, `missing`; for a removal what still points at the name, `pointed_at_by`). Each list shows 1000 entries at most, then counts the rest (`more_dangling`, `more_waiting`, `more_from`, `more`); names are clipped. 400 without `group`, 404 if there is no group `ID` (a group is named by its id, or by its whole key)."},
		{Pattern: "GET /debug/fleet", Access: AdminViews,
			Returns: "JSON of this replica's fleet (`fleet.peers`; see [Kubernetes](kubernetes.md#a-fleet-of-replicas)): `enabled` (false without a fleet, the rest empty), `self`, `members` (the live members it sees, itself included), `view_since` and `view_age_seconds` (when its view last changed), `peers` (each other member resolved: `address`, the `name` it came from, `live`, `last_answer`, its `clients`, its own `view` and whether it `agrees` with this one, `last_error`, why the last exchange with it failed (a dial, TLS or `fleet.peer_identities` error; empty once it answers), `this_replica` when the address answers as this replica (`fleet.self` is wrong: it is left out of the view), `names_itself`, the `fleet.self` it gave where that is not its address, and `config_differs`, its configuration's fingerprint where that is not this one's `config` (`upstream.group_by` and the control planes' addresses: members that differ group and fetch differently)), `clients` (the client connections it holds as balance counts them) and `excess` (how many are past the bound), `groups_owned`, and `groups` (each group's `group` id and whole `key`, as `/debug/groups` shows them, its `owner`, the `source` it is fetched from now, `control_plane`, `peer` or `fallback`, the `peer` drawn from, and `asked_by_peers`, the peers' streams in it)."},
		{Pattern: "GET /debug/guard/holds", Access: AdminViews,
			Returns: "The mass-removal guard's holds, what `POST /debug/guard/release` would end: JSON list with `group`, `type`, `since`, `names` (removals held) and `wipe` for a wipe's hold; `?group=ID` and `?type=T` narrow it. 400 for an unknown type, 404 for an unknown group. `xdsrelay guard list` calls it."},
		{Pattern: "GET /debug/rollout/changes", Access: AdminViews,
			Returns: "The changes waiting for the canaries, and those a canary NACKed (`held`), what `POST /debug/rollout/release` would release: JSON list with `group`, `since`, `types`, `resources`, `canaries`, `acked`, `held`, `nacked_by`, `nack_error`; `?group=ID` and `?type=T` (changes of that type) narrow it. 400 for an unknown type, 404 for an unknown group. `xdsrelay rollout list` calls it."},
		{Pattern: "POST /debug/guard/release", Access: AdminPrivate,
			Returns: "Ends the mass-removal guard's holds and applies their removals; `?group=ID` and `?type=T` (any name of the type: `clusters`, `Cluster`, `cds` or its type URL; see [Resource types](cli.md#resource-types)) narrow it. Answers the holds it ended as JSON (`group`, `type`, `since`, `names`); 400 for an unknown type, 404 for an unknown group. `xdsrelay guard release` calls it."},
		{Pattern: "POST /debug/rollout/release", Access: AdminPrivate,
			Returns: "Releases the changes a canary NACKed to the rest of their groups; `?group=ID` and `?type=T` narrow it. Answers the changes it released as JSON (`group`, `since`, `types`, `resources`, `canaries`, `nacked_by`, `nack_error`); 400 for an unknown type, 404 for an unknown group. `xdsrelay rollout release` calls it."},
	}
}

package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/xdsrelay/xdsrelay/relay"
)

func TestLoadConfig(t *testing.T) {
	tests := []loadTest{
		{
			name: "defaults without a file",
			check: func(t *testing.T, o Options) {
				if o.Relay.Upstream.Address != "127.0.0.1:18000" || o.Relay.Cache.Retention != 5*time.Minute {
					t.Errorf("defaults: %+v", o.Relay)
				}
				if !reflect.DeepEqual(o.Relay.Upstream.GroupBy, []string{"cluster", "user_agent", "client_features"}) {
					t.Errorf("group_by default: %v", o.Relay.Upstream.GroupBy)
				}
			},
		},
		{
			name: "file values",
			yaml: "upstream:\n  address: cp.example:18000\n  group_by: [cluster, locality.zone]\ncache:\n  retention: 30s\n",
			check: func(t *testing.T, o Options) {
				if o.Relay.Upstream.Address != "cp.example:18000" || o.Relay.Cache.Retention != 30*time.Second {
					t.Errorf("got %+v", o.Relay)
				}
				if !reflect.DeepEqual(o.Relay.Upstream.GroupBy, []string{"cluster", "locality.zone"}) {
					t.Errorf("group_by: %v", o.Relay.Upstream.GroupBy)
				}
			},
		},
		{
			name: "empty group_by is one group",
			yaml: "upstream:\n  group_by: []\n",
			check: func(t *testing.T, o Options) {
				if len(o.Relay.Upstream.GroupBy) != 0 {
					t.Errorf("group_by: %v", o.Relay.Upstream.GroupBy)
				}
			},
		},
		{
			name: "environment overrides the file",
			yaml: "upstream:\n  address: cp.example:18000\n",
			env: map[string]string{
				"XDSRELAY_UPSTREAM_ADDRESS":  "other.example:18000",
				"XDSRELAY_UPSTREAM_GROUP_BY": "id, metadata.team",
				"XDSRELAY_CACHE_RETENTION":   "1m",
			},
			check: func(t *testing.T, o Options) {
				if o.Relay.Upstream.Address != "other.example:18000" || o.Relay.Cache.Retention != time.Minute {
					t.Errorf("got %+v", o.Relay)
				}
				if !reflect.DeepEqual(o.Relay.Upstream.GroupBy, []string{"id", "metadata.team"}) {
					t.Errorf("group_by: %v", o.Relay.Upstream.GroupBy)
				}
			},
		},
		{
			name: "TLS both ways and upstream headers",
			yaml: "upstream:\n  tls:\n    ca_file: /ca.pem\n    server_name: cp.internal\n  headers:\n    authorization: Bearer abc\n" + mtls + allowAll,
			env:  map[string]string{"XDSRELAY_UPSTREAM_TLS_INSECURE_SKIP_VERIFY": "false"},
			check: func(t *testing.T, o Options) {
				u, d := o.Relay.Upstream, o.Relay.Downstream
				if u.TLS.CAFile != "/ca.pem" || u.TLS.ServerName != "cp.internal" || u.Headers["authorization"] != "Bearer abc" {
					t.Errorf("upstream: %+v %v", u.TLS, u.Headers)
				}
				if d.TLS.CertFile != "/tls.crt" || d.TLS.KeyFile != "/tls.key" || d.TLS.CAFile != "/clients.pem" {
					t.Errorf("downstream: %+v", d.TLS)
				}
				if d.Authorization.Mode != relay.AuthorizationAllowAll {
					t.Errorf("authorization mode %q", d.Authorization.Mode)
				}
			},
		},
		{name: "downstream TLS without a key", yaml: "downstream:\n  tls:\n    cert_file: /tls.crt\n", wantErr: "downstream.tls"},
		{name: "bad bool", env: map[string]string{"XDSRELAY_UPSTREAM_TLS_ENABLED": "yes please"}, wantErr: "upstream.tls.enabled"},
		{name: "unknown key", yaml: "upstream:\n  adress: x:1\n", wantErr: `unknown key "upstream.adress"`},
		{name: "unknown section", yaml: "tracing:\n  endpoint: x\n", wantErr: `unknown key "tracing.endpoint"`},
		{name: "malformed upstream address", yaml: "upstream:\n  address: nowhere\n", wantErr: "upstream.address"},
		{name: "malformed downstream address", env: map[string]string{"XDSRELAY_DOWNSTREAM_ADDRESS": "1.2.3.4:port"}, wantErr: "downstream.address"},
		{name: "malformed duration", yaml: "cache:\n  retention: 5 minutes\n", wantErr: "cache.retention"},
		{name: "duration without unit", yaml: "shutdown_timeout: 10\n", wantErr: "shutdown_timeout"},
		{
			name: "zero retention",
			yaml: "cache:\n  retention: 0\n",
			check: func(t *testing.T, o Options) {
				if o.Relay.Cache.Retention != 0 {
					t.Errorf("retention %s", o.Relay.Cache.Retention)
				}
			},
		},
		{name: "unknown group field", yaml: "upstream:\n  group_by: [colour]\n", wantErr: "upstream.group_by"},
		{name: "guard fraction past 1", yaml: "guard:\n  max_removed_fraction: 1.5\n", wantErr: "guard.max_removed_fraction"},
		{name: "negative guard minimum", yaml: "guard:\n  min_resources: -1\n", wantErr: "guard.min_resources"},
		{name: "guard without a window", yaml: "guard:\n  window: 0\n", wantErr: "guard.window"},
		{name: "negative guard hold", env: map[string]string{"XDSRELAY_GUARD_HOLD": "-1s"}, wantErr: "guard.hold"},
		{name: "negative wipe hold", yaml: "guard:\n  wipe_hold: -1s\n", wantErr: "guard.wipe_hold: must not be negative"},
		{name: "wipe hold with the guard off", yaml: "guard:\n  max_removed_fraction: 0\n  wipe_hold: 500ms\n",
			check: func(t *testing.T, o Options) {
				if o.Relay.Guard.WipeHold != 500*time.Millisecond || o.Relay.Guard.MaxRemovedFraction != 0 {
					t.Errorf("guard %+v", o.Relay.Guard)
				}
			},
		},
		{name: "user_agent_patch", yaml: "upstream:\n  group_by: [cluster, user_agent_patch]\n",
			check: func(t *testing.T, o Options) {
				if !reflect.DeepEqual(o.Relay.Upstream.GroupBy, []string{"cluster", "user_agent_patch"}) {
					t.Errorf("group_by %v", o.Relay.Upstream.GroupBy)
				}
			},
		},
		{name: "canary count not whole", yaml: "rollout:\n  canary: 2.5\n", wantErr: "rollout.canary"},
		{name: "negative canary", yaml: "rollout:\n  canary: -1\n", wantErr: "rollout.canary"},
		{name: "rollout without a bake", yaml: "rollout:\n  canary: 3\n  bake: 0\n", wantErr: "rollout.bake"},
		{
			name: "rollout and guard",
			yaml: "rollout:\n  canary: 0.05\n  bake: 1m\nguard:\n  max_removed_fraction: 0\n",
			check: func(t *testing.T, o Options) {
				if o.Relay.Rollout.Canary != 0.05 || o.Relay.Rollout.Bake != time.Minute || o.Relay.Guard.MaxRemovedFraction != 0 {
					t.Errorf("rollout %+v guard %+v", o.Relay.Rollout, o.Relay.Guard)
				}
			},
		},
		{name: "bad log level", yaml: "log:\n  level: loud\n", wantErr: "log.level"},
		{name: "zero connect_timeout", yaml: "upstream:\n  connect_timeout: 0s\n", wantErr: "upstream.connect_timeout: must be positive, got 0s"},
		{name: "negative connect_timeout from the environment", env: map[string]string{"XDSRELAY_UPSTREAM_CONNECT_TIMEOUT": "-1s"},
			wantErr: "upstream.connect_timeout: must be positive, got -1s"},
		{name: "zero lrs interval", yaml: "lrs:\n  interval: 0s\n", wantErr: "lrs.interval: must be positive, got 0s"},
		{name: "zero lrs max_pending", yaml: "lrs:\n  max_pending: 0\n", wantErr: "lrs.max_pending: must be at least 1, got 0"},
		{name: "lrs max_pending not a number", env: map[string]string{"XDSRELAY_LRS_MAX_PENDING": "many"}, wantErr: "lrs.max_pending"},
		{name: "lrs min_interval above lrs.interval", yaml: "lrs:\n  interval: 1s\n  min_interval: 2s\n",
			wantErr: "lrs.min_interval: must be at most lrs.interval (1s), or 0 for 1s or lrs.interval if shorter; got 2s"},
		{name: "negative lrs min_interval", env: map[string]string{"XDSRELAY_LRS_MIN_INTERVAL": "-1s"}, wantErr: "lrs.min_interval: must be at most lrs.interval"},
		{
			// Valid before lrs.min_interval existed: the floor follows
			// lrs.interval below 1s.
			name: "lrs.interval below 1s alone",
			yaml: "lrs:\n  interval: 300ms\n",
			check: func(t *testing.T, o Options) {
				if got := o.Relay.LRSMinInterval(); o.Relay.LRS.Interval != 300*time.Millisecond || got != 300*time.Millisecond {
					t.Errorf("lrs: %+v, min interval %v, want 300ms", o.Relay.LRS, got)
				}
			},
		},
		{
			name: "lrs.min_interval by default, and set",
			env:  map[string]string{"XDSRELAY_LRS_MIN_INTERVAL": "250ms"},
			check: func(t *testing.T, o Options) {
				if got := o.Relay.LRSMinInterval(); got != 250*time.Millisecond {
					t.Errorf("lrs.min_interval set to 250ms is %v", got)
				}
				def := defaultOptions()
				if got := def.Relay.LRSMinInterval(); got != time.Second {
					t.Errorf("lrs.min_interval by default is %v, want 1s beside lrs.interval 10s", got)
				}
			},
		},
		{name: "zero lrs max_names", yaml: "lrs:\n  max_names: 0\n", wantErr: "lrs.max_names: must be at least 1, got 0"},
		{name: "zero lrs max_pending_bytes", env: map[string]string{"XDSRELAY_LRS_MAX_PENDING_BYTES": "0"}, wantErr: "lrs.max_pending_bytes: must be at least 1, got 0"},
		{
			name: "lrs bounds alone, beside the others, and from the environment",
			yaml: "lrs:\n  interval: 500ms\n  min_interval: 100ms\n  max_names: 7\n",
			env:  map[string]string{"XDSRELAY_LRS_MAX_PENDING_BYTES": "4096"},
			check: func(t *testing.T, o Options) {
				l := o.Relay.LRS
				if l.Interval != 500*time.Millisecond || l.MinInterval != 100*time.Millisecond || l.MaxNames != 7 || l.MaxPendingBytes != 4096 || l.MaxPending != 1000 {
					t.Errorf("lrs: %+v", l)
				}
			},
		},
		{name: "zero lrs send_timeout", yaml: "lrs:\n  send_timeout: 0s\n", wantErr: "lrs.send_timeout: must be positive, got 0s"},
		{name: "negative lrs send_timeout from the environment", env: map[string]string{"XDSRELAY_LRS_SEND_TIMEOUT": "-1s"},
			wantErr: "lrs.send_timeout: must be positive, got -1s"},
		{
			name: "lrs.send_timeout alone",
			yaml: "lrs:\n  send_timeout: 3s\n",
			check: func(t *testing.T, o Options) {
				if l := o.Relay.LRS; l.SendTimeout != 3*time.Second || l.MaxPending != 1000 {
					t.Errorf("lrs: %+v", l)
				}
			},
		},
		{
			name: "lrs.send_timeout from the environment overrides the file",
			yaml: "lrs:\n  send_timeout: 3s\n  max_pending: 4\n",
			env:  map[string]string{"XDSRELAY_LRS_SEND_TIMEOUT": "7s"},
			check: func(t *testing.T, o Options) {
				if l := o.Relay.LRS; l.SendTimeout != 7*time.Second || l.MaxPending != 4 {
					t.Errorf("lrs: %+v", l)
				}
			},
		},
		{name: "negative consistency max_wait", yaml: "consistency:\n  max_wait: -1s\n",
			wantErr: "consistency.max_wait: must not be negative (0 turns make before break off), got -1s"},
		{name: "consistency max_wait not a duration", env: map[string]string{"XDSRELAY_CONSISTENCY_MAX_WAIT": "soon"}, wantErr: "consistency.max_wait"},
		{
			name: "consistency.max_wait 0 beside guard.wipe_hold",
			yaml: "consistency:\n  max_wait: 0s\nguard:\n  wipe_hold: 1s\n",
			check: func(t *testing.T, o Options) {
				if o.Relay.Consistency.MaxWait != 0 || o.Relay.Guard.WipeHold != time.Second {
					t.Errorf("consistency %+v guard %+v", o.Relay.Consistency, o.Relay.Guard)
				}
			},
		},
		{
			name: "consistency.max_wait and guard.wipe_hold from the environment",
			env:  map[string]string{"XDSRELAY_CONSISTENCY_MAX_WAIT": "250ms", "XDSRELAY_GUARD_WIPE_HOLD": "0s"},
			check: func(t *testing.T, o Options) {
				if o.Relay.Consistency.MaxWait != 250*time.Millisecond || o.Relay.Guard.WipeHold != 0 {
					t.Errorf("consistency %+v guard %+v", o.Relay.Consistency, o.Relay.Guard)
				}
			},
		},
		{
			name: "consistency.max_wait, guard.wipe_hold, lrs.send_timeout and upstream.protocol defaults",
			check: func(t *testing.T, o Options) {
				if o.Relay.Consistency.MaxWait != time.Second || o.Relay.Guard.WipeHold != 2*time.Second || o.Relay.LRS.SendTimeout != 30*time.Second {
					t.Errorf("consistency %+v guard %+v lrs %+v", o.Relay.Consistency, o.Relay.Guard, o.Relay.LRS)
				}
				if o.Relay.Upstream.Protocol != "auto" {
					t.Errorf("protocol %q, want auto", o.Relay.Upstream.Protocol)
				}
			},
		},
		{name: "admin.advertise_address without a port", yaml: "admin:\n  advertise_address: 10.0.0.7\n", wantErr: "admin.advertise_address"},
		{name: "admin.advertise_address unspecified host from the environment", env: map[string]string{"XDSRELAY_ADMIN_ADVERTISE_ADDRESS": "0.0.0.0:9901"},
			wantErr: "admin.advertise_address"},
		{
			name: "admin.advertise_address default, beside admin.address",
			yaml: "admin:\n  address: :9902\n",
			check: func(t *testing.T, o Options) {
				if a := o.Relay.Admin; a.AdvertiseAddress != "" || a.Address != ":9902" {
					t.Errorf("admin: advertise_address %q address %q", a.AdvertiseAddress, a.Address)
				}
			},
		},
		{
			name: "admin.advertise_address alone",
			yaml: "admin:\n  advertise_address: 10.0.0.7:9901\n",
			check: func(t *testing.T, o Options) {
				if got := o.Relay.Admin.AdvertiseAddress; got != "10.0.0.7:9901" {
					t.Errorf("advertise_address %q", got)
				}
			},
		},
		{
			name: "admin.advertise_address from the environment overrides the file",
			yaml: "admin:\n  address: :9902\n  advertise_address: 10.0.0.7:9901\n",
			env:  map[string]string{"XDSRELAY_ADMIN_ADVERTISE_ADDRESS": "10.0.0.8:9902"},
			check: func(t *testing.T, o Options) {
				if a := o.Relay.Admin; a.AdvertiseAddress != "10.0.0.8:9902" || a.Address != ":9902" {
					t.Errorf("admin: advertise_address %q address %q", a.AdvertiseAddress, a.Address)
				}
			},
		},
		{name: "upstream.forward_nacks not a bool", yaml: "upstream:\n  forward_nacks: sometimes\n", wantErr: "upstream.forward_nacks"},
		{
			name: "upstream.forward_nacks default, and off beside the address",
			yaml: "upstream:\n  address: cp.example:18000\n  forward_nacks: false\n",
			check: func(t *testing.T, o Options) {
				if u := o.Relay.Upstream; u.ForwardNACKs || u.Address != "cp.example:18000" {
					t.Errorf("upstream: forward_nacks %v address %q", u.ForwardNACKs, u.Address)
				}
				if !relay.Default().Upstream.ForwardNACKs {
					t.Error("upstream.forward_nacks is off by default")
				}
			},
		},
		{
			name: "upstream.forward_nacks from the environment overrides the file",
			yaml: "upstream:\n  forward_nacks: true\n",
			env:  map[string]string{"XDSRELAY_UPSTREAM_FORWARD_NACKS": "false"},
			check: func(t *testing.T, o Options) {
				if o.Relay.Upstream.ForwardNACKs {
					t.Error("forward_nacks on, want the environment's false")
				}
			},
		},
		{name: "unknown upstream.protocol", yaml: "upstream:\n  protocol: grpc\n",
			wantErr: `upstream.protocol: unknown protocol "grpc": want auto, delta, sotw or sotw-per-type`},
		{name: "unknown upstream.protocol from the environment", env: map[string]string{"XDSRELAY_UPSTREAM_PROTOCOL": "SotW"},
			wantErr: `upstream.protocol: unknown protocol "SotW"`},
		{
			name: "upstream.protocol default, alone, and from the environment",
			yaml: "upstream:\n  address: cp.example:18000\n",
			env:  map[string]string{"XDSRELAY_UPSTREAM_PROTOCOL": "sotw-per-type"},
			check: func(t *testing.T, o Options) {
				if u := o.Relay.Upstream; u.Protocol != "sotw-per-type" || u.Address != "cp.example:18000" {
					t.Errorf("upstream: protocol %q address %q", u.Protocol, u.Address)
				}
			},
		},
		{
			name: "upstream.protocol from the file",
			yaml: "upstream:\n  protocol: delta\n",
			check: func(t *testing.T, o Options) {
				if o.Relay.Upstream.Protocol != "delta" {
					t.Errorf("protocol %q", o.Relay.Upstream.Protocol)
				}
			},
		},
		{name: "reflection not a bool", yaml: "downstream:\n  reflection: sometimes\n", wantErr: "downstream.reflection"},
		{
			name: "connect_timeout, reflection, lrs and kinds in group_by",
			yaml: "upstream:\n  connect_timeout: 3s\n  group_by: [id, user_agent, client_features]\ndownstream:\n  reflection: false\nlrs:\n  interval: 2s\n  max_pending: 5\n",
			check: func(t *testing.T, o Options) {
				r := o.Relay
				if r.Upstream.ConnectTimeout != 3*time.Second || r.Downstream.Reflection || r.LRS.Interval != 2*time.Second || r.LRS.MaxPending != 5 {
					t.Errorf("connect_timeout %s, reflection %v, lrs %+v", r.Upstream.ConnectTimeout, r.Downstream.Reflection, r.LRS)
				}
				if !reflect.DeepEqual(r.Upstream.GroupBy, []string{"id", "user_agent", "client_features"}) {
					t.Errorf("group_by: %v", r.Upstream.GroupBy)
				}
			},
		},
		{name: "address as a list", yaml: "admin:\n  address: [a, b]\n", wantErr: "admin.address"},
		{name: "group_by a number", yaml: "upstream:\n  group_by: 5\n", wantErr: "upstream.group_by"},
		{name: "group_by a bare string", yaml: "upstream:\n  group_by: cluster\n", wantErr: "upstream.group_by"},
		{name: "group_by a map", yaml: "upstream:\n  group_by: {cluster: true}\n", wantErr: "upstream.group_by"},
		{name: "group_by with a number", yaml: "upstream:\n  group_by: [cluster, 5]\n", wantErr: "upstream.group_by"},
		{name: "group_by with an unknown field", yaml: "upstream:\n  group_by: [cluster, region]\n", wantErr: "upstream.group_by"},
		{name: "group_by unknown from the environment", env: map[string]string{"XDSRELAY_UPSTREAM_GROUP_BY": "cluster,colour"}, wantErr: "upstream.group_by"},
		{name: "addresses a bare string", yaml: "upstream:\n  addresses: cp2.example:18000\n", wantErr: "upstream.addresses"},
		{name: "addresses with a number", yaml: "upstream:\n  addresses: [cp2.example:18000, 18000]\n", wantErr: "upstream.addresses"},
		{
			name: "addresses from the file and the environment",
			yaml: "upstream:\n  addresses: [cp2.example:18000, cp3.example:18000]\n",
			check: func(t *testing.T, o Options) {
				if want := []string{"cp2.example:18000", "cp3.example:18000"}; !reflect.DeepEqual(o.Relay.Upstream.Addresses, want) {
					t.Errorf("addresses: %v", o.Relay.Upstream.Addresses)
				}
			},
		},
		{
			name: "group_by from the environment, empty is one group",
			env:  map[string]string{"XDSRELAY_UPSTREAM_GROUP_BY": ""},
			check: func(t *testing.T, o Options) {
				if len(o.Relay.Upstream.GroupBy) != 0 {
					t.Errorf("group_by: %v", o.Relay.Upstream.GroupBy)
				}
			},
		},
		{
			name: "not_found_timeout default",
			check: func(t *testing.T, o Options) {
				if o.Relay.Cache.NotFoundTimeout != 15*time.Second {
					t.Errorf("not_found_timeout %s", o.Relay.Cache.NotFoundTimeout)
				}
			},
		},
		{
			name: "not_found_timeout from the file",
			yaml: "cache:\n  not_found_timeout: 2s\n",
			check: func(t *testing.T, o Options) {
				if o.Relay.Cache.NotFoundTimeout != 2*time.Second {
					t.Errorf("not_found_timeout %s", o.Relay.Cache.NotFoundTimeout)
				}
			},
		},
		{
			name: "not_found_timeout 0 disables",
			env:  map[string]string{"XDSRELAY_CACHE_NOT_FOUND_TIMEOUT": "0"},
			check: func(t *testing.T, o Options) {
				if o.Relay.Cache.NotFoundTimeout != 0 {
					t.Errorf("not_found_timeout %s", o.Relay.Cache.NotFoundTimeout)
				}
			},
		},
		{name: "negative not_found_timeout", yaml: "cache:\n  not_found_timeout: -1s\n", wantErr: "cache.not_found_timeout"},
		{name: "bad not_found_timeout", env: map[string]string{"XDSRELAY_CACHE_NOT_FOUND_TIMEOUT": "soon"}, wantErr: "cache.not_found_timeout (from XDSRELAY_CACHE_NOT_FOUND_TIMEOUT)"},
		{
			name: "log level and tracing",
			yaml: "log:\n  level: debug\ntracing:\n  otlp_endpoint: otel:4317\n  sample_ratio: 1\n",
			check: func(t *testing.T, o Options) {
				if o.LogLevel != slog.LevelDebug || o.Tracing.SampleRatio != 1 || !o.Relay.Tracing {
					t.Errorf("level %v, tracing %+v, relay tracing %v", o.LogLevel, o.Tracing, o.Relay.Tracing)
				}
			},
		},
		{
			name: "authorization rules from the file keep the case of metadata keys",
			yaml: mtls + "  authorization:\n    rules:\n      - identity: spiffe://cluster.local/ns/{ns}/sa/*\n        node:\n          metadata.NAMESPACE: \"{ns}\"\n          cluster: \"*\"\n      - identity: relay.example.org\n",
			check: func(t *testing.T, o Options) {
				want := []relay.AuthorizationRule{
					{Identity: "spiffe://cluster.local/ns/{ns}/sa/*", Node: map[string]string{"metadata.NAMESPACE": "{ns}", "cluster": "*"}},
					{Identity: "relay.example.org"},
				}
				if got := o.Relay.Downstream.Authorization.Rules; !reflect.DeepEqual(got, want) {
					t.Errorf("rules %+v, want %+v", got, want)
				}
			},
		},
		{
			name: "authorization rules from the environment, in JSON",
			yaml: mtls,
			env:  map[string]string{"XDSRELAY_DOWNSTREAM_AUTHORIZATION_RULES": `[{"identity": "spiffe://example.org/tenant/{t}", "node": {"cluster": "{t}"}}]`},
			check: func(t *testing.T, o Options) {
				want := []relay.AuthorizationRule{{Identity: "spiffe://example.org/tenant/{t}", Node: map[string]string{"cluster": "{t}"}}}
				if got := o.Relay.Downstream.Authorization.Rules; !reflect.DeepEqual(got, want) {
					t.Errorf("rules %+v, want %+v", got, want)
				}
			},
		},
		{
			name: "authorization rules with authorities, from the file and the environment",
			yaml: mtls + "  authorization:\n    rules:\n      - identity: spiffe://example.org/tenant/{t}\n        node: {cluster: \"{t}\"}\n        authorities: [\"{t}.example.com\"]\n",
			check: func(t *testing.T, o Options) {
				want := []relay.AuthorizationRule{{Identity: "spiffe://example.org/tenant/{t}", Node: map[string]string{"cluster": "{t}"},
					Authorities: []string{"{t}.example.com"}}}
				if got := o.Relay.Downstream.Authorization.Rules; !reflect.DeepEqual(got, want) {
					t.Errorf("rules %+v, want %+v", got, want)
				}
			},
		},
		{name: "authorization rule authority with a capture the identity lacks", yaml: mtls + "  authorization:\n    rules: [{identity: x, authorities: [\"{t}.example.com\"]}]\n",
			wantErr: `downstream.authorization.rules[0].authorities[0]: "{t}.example.com" uses {t}, which the identity does not capture`},
		{name: "authorization rules without client_ca_file", yaml: "downstream:\n  authorization:\n    rules: [{identity: x}]\n",
			wantErr: "downstream.authorization.rules: require downstream.tls.client_ca_file"},
		{name: "authorization rule with an unknown key", yaml: mtls + "  authorization:\n    rules: [{identity: x, nod: {cluster: a}}]\n",
			wantErr: `downstream.authorization.rules: [0]: nod: unknown key`},
		{name: "authorization rule with an unknown node field", yaml: mtls + "  authorization:\n    rules: [{identity: x, node: {colour: a}}]\n",
			wantErr: "downstream.authorization.rules[0].node.colour: unknown node field"},
		{name: "authorization rules a map", yaml: mtls + "  authorization:\n    rules: {identity: x}\n",
			wantErr: "downstream.authorization.rules: want a list"},
		{name: "authorization rules not JSON in the environment", yaml: mtls, env: map[string]string{"XDSRELAY_DOWNSTREAM_AUTHORIZATION_RULES": "identity=x"},
			wantErr: "downstream.authorization.rules (from XDSRELAY_DOWNSTREAM_AUTHORIZATION_RULES): want a JSON list"},
		{name: "authorization rules misspelt", yaml: mtls + "  authorization:\n    rule: []\n",
			wantErr: `unknown key "downstream.authorization.rule"`},
		{name: "mTLS without rules", yaml: mtls,
			wantErr: "add downstream.authorization.rules, or set downstream.authorization.mode: allow-all"},
		{name: "allow-all with rules", yaml: mtls + "  authorization:\n    mode: allow-all\n    rules: [{identity: x}]\n",
			wantErr: "downstream.authorization.mode: allow-all admits every node"},
		{name: "unknown authorization mode", env: map[string]string{"XDSRELAY_DOWNSTREAM_AUTHORIZATION_MODE": "deny"},
			wantErr: `downstream.authorization.mode: "deny" is neither rules nor allow-all`},
		{
			name: "connection bounds and max_polls",
			yaml: "downstream:\n  max_connection_age: 1h\n  max_connection_age_grace: 0\n  max_connection_idle: 0\nlimits:\n  max_polls: 5\n",
			check: func(t *testing.T, o Options) {
				d := o.Relay.Downstream
				if d.MaxConnectionAge != time.Hour || d.MaxConnectionAgeGrace != 0 || d.MaxConnectionIdle != 0 || o.Relay.Limits.MaxPolls != 5 {
					t.Errorf("age %s grace %s idle %s max_polls %d", d.MaxConnectionAge, d.MaxConnectionAgeGrace, d.MaxConnectionIdle, o.Relay.Limits.MaxPolls)
				}
			},
		},
		{name: "negative connection age", env: map[string]string{"XDSRELAY_DOWNSTREAM_MAX_CONNECTION_AGE": "-1m"}, wantErr: "downstream.max_connection_age:"},
		{name: "negative max_polls", yaml: "limits:\n  max_polls: -1\n", wantErr: "limits.max_polls"},
		{name: "ratio above 1", env: map[string]string{"XDSRELAY_TRACING_SAMPLE_RATIO": "2"}, wantErr: "tracing.sample_ratio"},
	}
	runLoadTests(t, tests)
}

// A loadTest loads yaml (as the file, if not empty) and env, and expects an
// error containing wantErr, or (wantErr "") options that pass check.
type loadTest struct {
	name    string
	yaml    string
	env     map[string]string
	wantErr string // a substring; "" for success
	check   func(t *testing.T, o Options)
}

func runLoadTests(t *testing.T, tests []loadTest) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := ""
			if tc.yaml != "" {
				file = filepath.Join(t.TempDir(), "config.yaml")
				if err := os.WriteFile(file, []byte(tc.yaml), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			o, _, err := loadConfig(file, environ(tc.env))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}
}

// mtls is a downstream section with client certificates, which
// authorization rules need.
const mtls = "downstream:\n  tls:\n    cert_file: /tls.crt\n    key_file: /tls.key\n    client_ca_file: /clients.pem\n"

// allowAll, after mtls, admits every node without rules.
const allowAll = "  authorization:\n    mode: allow-all\n"

// environ is m as os.Environ gives it.
func environ(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

func TestUnknownEnvironmentVariables(t *testing.T) {
	_, unknown, err := loadConfig("", []string{
		"HOME=/root",
		"XDSRELAY_UPSTREAM_ADDRES=typo.example:18000",
		"XDSRELAY_CACHE_RETENTION=1m",
		"XDSRELAY_FOO=1",
		"XDSRELAY_FOO=2",
		"XDSRELAY_SERVICE_HOST=10.0.0.1", // Kubernetes service links for a Service named xdsrelay
		"XDSRELAY_SERVICE_PORT_GRPC=18001",
		"XDSRELAY_PORT=tcp://10.0.0.1:18001",
		"XDSRELAY_PORT_18001_TCP_ADDR=10.0.0.1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"XDSRELAY_FOO", "XDSRELAY_UPSTREAM_ADDRES"}; !reflect.DeepEqual(unknown, want) {
		t.Fatalf("unknown %v, want %v", unknown, want)
	}
}

// The table is consistent: unique keys and environment names, one-line
// descriptions, fields of the kind's type, defaults that format.
func TestSettingsTable(t *testing.T) {
	def := defaultOptions()
	seen := map[string]bool{}
	for _, s := range settings(&def) {
		if seen[s.key] || seen[envName(s.key)] {
			t.Errorf("%s: declared twice, or its environment name clashes", s.key)
		}
		seen[s.key], seen[envName(s.key)] = true, true
		if s.doc == "" || strings.Contains(s.doc, "\n") {
			t.Errorf("%s: doc %q is not one line", s.key, s.doc)
		}
		if got, want := reflect.TypeOf(s.field), kindTypes[s.kind]; got != want {
			t.Errorf("%s: field is %v, kind %s wants %v", s.key, got, s.kind, want)
		}
		if formatValue(s) == "" {
			t.Errorf("%s: default formats empty", s.key)
		}
	}
}

var kindTypes = map[kind]reflect.Type{
	kindString:    reflect.TypeFor[*string](),
	kindDuration:  reflect.TypeFor[*time.Duration](),
	kindInt:       reflect.TypeFor[*int](),
	kindBool:      reflect.TypeFor[*bool](),
	kindList:      reflect.TypeFor[*[]string](),
	kindMap:       reflect.TypeFor[*map[string]string](),
	kindRatio:     reflect.TypeFor[*float64](),
	kindLevel:     reflect.TypeFor[*slog.Level](),
	kindRules:     reflect.TypeFor[*[]relay.AuthorizationRule](),
	kindRate:      reflect.TypeFor[*float64](),
	kindUpstreams: reflect.TypeFor[*[]relay.UpstreamConfig](),
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                       "0s",
		500 * time.Millisecond:  "500ms",
		30 * time.Second:        "30s",
		90 * time.Second:        "1m30s",
		5 * time.Minute:         "5m",
		time.Hour:               "1h",
		90 * time.Minute:        "1h30m",
		time.Hour + time.Second: "1h0m1s",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

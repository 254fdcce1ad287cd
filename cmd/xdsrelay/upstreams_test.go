package main

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/xdsrelay/xdsrelay/relay"
)

// twoUpstreams is a control-plane upstream section and two more upstreams.
const twoUpstreams = `upstream:
  address: cp:18000
  fallback_recheck: 5s
  reconnect:
    base_delay: 2s
  headers:
    authorization: Bearer default
upstreams:
  - name: secrets
    address: secrets:18000
    addresses: [secrets-2:18000]
    types: [secrets, type.googleapis.com/envoy.service.runtime.v3.Runtime]
    tls:
      ca_file: /ca.pem
    keepalive:
      time: 20s
    max_message_bytes: 2097152
    node:
      metadata:
        NAMESPACE: mesh
  - Name: partner
    Address: partner-cp:18000
    authorities: [partner.example.com]
    fallback_recheck: 1m
`

func TestLoadUpstreams(t *testing.T) {
	runLoadTests(t, []loadTest{
		{
			name: "two upstreams from the file, types resolved, defaults their own",
			yaml: twoUpstreams,
			check: func(t *testing.T, o Options) {
				us := o.Relay.Upstreams
				if len(us) != 2 {
					t.Fatalf("upstreams %+v", us)
				}
				s, p := us[0], us[1]
				if s.Name != "secrets" || s.Address != "secrets:18000" || !reflect.DeepEqual(s.Addresses, []string{"secrets-2:18000"}) {
					t.Errorf("secrets: %+v", s)
				}
				if want := []string{resourcev3.SecretType, resourcev3.RuntimeType}; !reflect.DeepEqual(s.Types, want) {
					t.Errorf("secrets types %v, want %v", s.Types, want)
				}
				if s.TLS.CAFile != "/ca.pem" || s.KeepaliveTime != 20*time.Second || s.MaxMessageBytes != 2<<20 {
					t.Errorf("secrets: %+v", s)
				}
				if s.Node.Metadata["NAMESPACE"] != "mesh" {
					t.Errorf("node metadata lost its case: %v", s.Node.Metadata)
				}
				if p.Name != "partner" || p.Address != "partner-cp:18000" || !reflect.DeepEqual(p.Authorities, []string{"partner.example.com"}) || len(p.Types) != 0 {
					t.Errorf("partner: %+v", p)
				}
				if p.FallbackRecheck != time.Minute {
					t.Errorf("partner fallback_recheck %s", p.FallbackRecheck)
				}
				// An unset key takes relay.DefaultUpstream's value, not upstream's.
				def := relay.DefaultUpstream()
				if s.FallbackRecheck != def.FallbackRecheck || s.ReconnectBaseDelay != def.ReconnectBaseDelay || s.Headers != nil {
					t.Errorf("secrets inherited from upstream: fallback_recheck %s, base_delay %s, headers %v", s.FallbackRecheck, s.ReconnectBaseDelay, s.Headers)
				}
				if p.KeepaliveTime != def.KeepaliveTime || !reflect.DeepEqual(p.Node, def.Node) || p.TLS != def.TLS {
					t.Errorf("partner: %+v, want defaults", p)
				}
				if u := o.Relay.Upstream; u.FallbackRecheck != 5*time.Second || u.ReconnectBaseDelay != 2*time.Second {
					t.Errorf("upstream: %+v", u.UpstreamConfig)
				}
			},
		},
		{
			name: "the environment's JSON overrides the file",
			yaml: twoUpstreams,
			env: map[string]string{"XDSRELAY_UPSTREAMS": `[{"name": "sds", "address": "sds:18000", "types": ["secrets"],
				"max_request_bytes": 131072, "fallback_recheck": "10s", "reconnect": {"base_delay": "1s"},
				"keepalive": {"time": "15s"}, "tls": {"enabled": true}, "headers": {"x-team": "Mesh"}}]`},
			check: func(t *testing.T, o Options) {
				want := relay.DefaultUpstream()
				want.Name, want.Address, want.Types = "sds", "sds:18000", []string{resourcev3.SecretType}
				want.MaxRequestBytes, want.FallbackRecheck, want.ReconnectBaseDelay = 128<<10, 10*time.Second, time.Second
				want.KeepaliveTime, want.TLSEnabled, want.Headers = 15*time.Second, true, map[string]string{"x-team": "Mesh"}
				if !reflect.DeepEqual(o.Relay.Upstreams, []relay.UpstreamConfig{want}) {
					t.Errorf("upstreams %+v, want %+v", o.Relay.Upstreams, want)
				}
			},
		},
		{
			name: "an empty XDSRELAY_UPSTREAMS is none",
			yaml: twoUpstreams,
			env:  map[string]string{"XDSRELAY_UPSTREAMS": ""},
			check: func(t *testing.T, o Options) {
				if len(o.Relay.Upstreams) != 0 {
					t.Errorf("upstreams %+v", o.Relay.Upstreams)
				}
			},
		},
		{
			name: "upstream.authorities and upstream.fallback_recheck",
			yaml: "upstream:\n  authorities: [a.example]\n",
			env:  map[string]string{"XDSRELAY_UPSTREAM_FALLBACK_RECHECK": "10s"},
			check: func(t *testing.T, o Options) {
				u := o.Relay.Upstream
				if !reflect.DeepEqual(u.Authorities, []string{"a.example"}) || u.FallbackRecheck != 10*time.Second {
					t.Errorf("upstream: %+v", u.UpstreamConfig)
				}
			},
		},
		{
			name: "upstream.authorities from the environment, fallback_recheck default",
			env:  map[string]string{"XDSRELAY_UPSTREAM_AUTHORITIES": "a.example, b.example"},
			check: func(t *testing.T, o Options) {
				u := o.Relay.Upstream
				if !reflect.DeepEqual(u.Authorities, []string{"a.example", "b.example"}) || u.FallbackRecheck != 30*time.Second {
					t.Errorf("upstream: %+v", u.UpstreamConfig)
				}
			},
		},
		{name: "unknown key in an entry", yaml: "upstreams:\n  - name: a\n    adress: a:1\n    types: [secrets]\n",
			wantErr: `upstreams[0]: unknown key "adress"`},
		{name: "unknown nested key in an entry", yaml: "upstreams:\n  - name: a\n    types: [secrets]\n    tls:\n      ca: /ca.pem\n",
			wantErr: `upstreams[0]: unknown key "tls.ca"`},
		{name: "bad duration in an entry", yaml: "upstreams:\n  - {name: a, types: [secrets]}\n  - {name: b, types: [clusters], reconnect: {base_delay: soon}}\n",
			wantErr: `upstreams[1].reconnect.base_delay: "soon" is not a duration`},
		{name: "bad string in an entry", yaml: "upstreams:\n  - {name: a, types: [secrets]}\n  - {name: b, types: [clusters], tls: {ca_file: [x]}}\n",
			wantErr: "upstreams[1].tls.ca_file: want a string"},
		{name: "bad duration in the environment", env: map[string]string{"XDSRELAY_UPSTREAMS": `[{"name": "a", "types": ["secrets"], "fallback_recheck": 30}]`},
			wantErr: "upstreams[0].fallback_recheck (from XDSRELAY_UPSTREAMS): want a duration"},
		{name: "a fraction for an int in the environment", env: map[string]string{"XDSRELAY_UPSTREAMS": `[{"name": "a", "types": ["secrets"], "max_request_bytes": 1.5}]`},
			wantErr: "upstreams[0].max_request_bytes (from XDSRELAY_UPSTREAMS): want a whole number"},
		{name: "a bare 0 duration from the environment", env: map[string]string{"XDSRELAY_UPSTREAMS": `[{"name": "a", "types": ["secrets"], "keepalive": {"timeout": 0}}]`},
			wantErr: "upstreams[0].keepalive.timeout: must be positive, got 0s"},
		{name: "not JSON in the environment", env: map[string]string{"XDSRELAY_UPSTREAMS": "name=a"},
			wantErr: "upstreams (from XDSRELAY_UPSTREAMS): want a JSON list"},
		{name: "more after the JSON", env: map[string]string{"XDSRELAY_UPSTREAMS": `[] []`},
			wantErr: "upstreams (from XDSRELAY_UPSTREAMS): want a JSON list"},
		{name: "upstreams a map", yaml: "upstreams:\n  secrets: {types: [secrets]}\n", wantErr: "upstreams: want a list"},
		{name: "an entry not a map", yaml: "upstreams: [secrets]\n", wantErr: "upstreams[0]: want a map"},
		{name: "missing name", yaml: "upstreams:\n  - address: a:1\n    types: [secrets]\n", wantErr: "upstreams[0].name: required"},
		{name: "bad name", yaml: "upstreams:\n  - {name: Secrets!, types: [secrets]}\n", wantErr: "a name is [a-z0-9-]+"},
		{name: "the default's name", yaml: "upstreams:\n  - {name: default, types: [secrets]}\n", wantErr: `not "default"`},
		{name: "duplicate name", yaml: "upstreams:\n  - {name: a, types: [secrets]}\n  - {name: a, types: [clusters]}\n",
			wantErr: `upstream "a": the name is used twice`},
		{name: "a type claimed twice", yaml: "upstreams:\n  - {name: a, types: [secrets]}\n  - {name: b, types: [" + resourcev3.SecretType + "]}\n",
			wantErr: `upstream "b": type ` + resourcev3.SecretType + ` is claimed by "a" too`},
		{name: "an authority claimed twice", yaml: "upstream:\n  authorities: [x.example]\nupstreams:\n  - {name: a, authorities: [x.example]}\n",
			wantErr: `upstream "a": authority "x.example" is claimed by "default" too`},
		{name: "unknown type", yaml: "upstreams:\n  - {name: a, types: [secretz]}\n", wantErr: `upstreams[0].types: "secretz" is not a resource type: Cluster|CDS|clusters, `},
		{name: "a type by any name", yaml: "upstreams:\n  - {name: a, types: [SDS, Runtime, " + resourcev3.ClusterType + "]}\n",
			check: func(t *testing.T, o Options) {
				if got, want := o.Relay.Upstreams[0].Types, []string{resourcev3.SecretType, resourcev3.RuntimeType, resourcev3.ClusterType}; !reflect.DeepEqual(got, want) {
					t.Errorf("types %q, want %q", got, want)
				}
			}},
		{name: "upstreams with a file:// upstream.address", yaml: "upstream:\n  address: file:///etc/xds\nupstreams:\n  - {name: a, types: [secrets]}\n",
			wantErr: "upstreams: cannot be combined with a file:// upstream.address"},
		{name: "group_by in an entry", yaml: "upstreams:\n  - {name: a, types: [secrets], group_by: [id]}\n",
			wantErr: "upstreams[0].group_by: group_by is one setting for the whole relay (upstream.group_by)"},
		{name: "neither types nor authorities", yaml: "upstreams:\n  - {name: a, address: a:1}\n",
			wantErr: `upstreams[0].types: upstream "a" lists neither types nor authorities`},
		{name: "an entry's value checked", yaml: "upstreams:\n  - {name: a, types: [secrets], fallback_recheck: 0s}\n",
			wantErr: "upstreams[0].fallback_recheck: must be positive"},
		{name: "an entry's connect_timeout checked", yaml: "upstreams:\n  - {name: a, types: [secrets], connect_timeout: 0s}\n",
			wantErr: "upstreams[0].connect_timeout: must be positive, got 0s"},
		{
			name: "upstream.stall_timeout from the environment, an entry's 0, another's default",
			env:  map[string]string{"XDSRELAY_UPSTREAM_STALL_TIMEOUT": "45s"},
			yaml: "upstreams:\n  - {name: a, types: [secrets], stall_timeout: 0s}\n  - {name: b, types: [clusters]}\n",
			check: func(t *testing.T, o Options) {
				if got := o.Relay.Upstream.StallTimeout; got != 45*time.Second {
					t.Errorf("upstream.stall_timeout: %s, want 45s", got)
				}
				if a, b := o.Relay.Upstreams[0].StallTimeout, o.Relay.Upstreams[1].StallTimeout; a != 0 || b != 30*time.Second {
					t.Errorf("upstreams[].stall_timeout: %s and %s, want 0s and the default 30s", a, b)
				}
			},
		},
		{name: "an entry's stall_timeout checked", yaml: "upstreams:\n  - {name: a, types: [secrets], stall_timeout: 500ms}\n",
			wantErr: "upstreams[0].stall_timeout: 500ms is below 1s"},
		{name: "a negative stall_timeout", yaml: "upstream:\n  stall_timeout: -1s\n",
			wantErr: "upstream.stall_timeout: must not be negative, got -1s"},
		{name: "an entry's protocol checked", yaml: "upstreams:\n  - {name: a, types: [secrets], protocol: xds}\n",
			wantErr: `upstreams[0].protocol: unknown protocol "xds"`},
		{
			name: "upstream.protocol from the environment, an entry's own, another's default",
			env:  map[string]string{"XDSRELAY_UPSTREAM_PROTOCOL": "sotw"},
			yaml: "upstreams:\n  - {name: a, types: [secrets], protocol: delta}\n  - {name: b, types: [clusters]}\n",
			check: func(t *testing.T, o Options) {
				if got := o.Relay.Upstream.Protocol; got != "sotw" {
					t.Errorf("upstream.protocol: %q, want sotw", got)
				}
				if a, b := o.Relay.Upstreams[0].Protocol, o.Relay.Upstreams[1].Protocol; a != "delta" || b != "auto" {
					t.Errorf("upstreams[].protocol: %q and %q, want delta and the default auto", a, b)
				}
			},
		},
		{
			name: "upstream.forward_nacks from the environment, an entry's own, another's default",
			env:  map[string]string{"XDSRELAY_UPSTREAM_FORWARD_NACKS": "false"},
			yaml: "upstreams:\n  - {name: a, types: [secrets], forward_nacks: false}\n  - {name: b, types: [clusters]}\n  - {name: c, types: [listeners], forward_nacks: true}\n",
			check: func(t *testing.T, o Options) {
				if o.Relay.Upstream.ForwardNACKs {
					t.Error("upstream.forward_nacks on, want the environment's false")
				}
				us := o.Relay.Upstreams
				if a, b, c := us[0].ForwardNACKs, us[1].ForwardNACKs, us[2].ForwardNACKs; a || !b || !c {
					t.Errorf("upstreams[].forward_nacks: %v, %v and %v, want false, the default true and true", a, b, c)
				}
			},
		},
		{name: "an entry's forward_nacks not a bool", yaml: "upstreams:\n  - {name: a, types: [secrets], forward_nacks: 1s}\n",
			wantErr: "upstreams[0].forward_nacks"},
		{name: "an entry's address checked", yaml: "upstreams:\n  - {name: a, types: [secrets], addresses: [nowhere]}\n",
			wantErr: "upstreams[0].addresses"},
	})
}

// An upstreams entry takes name, types and every upstream.* key but
// group_by, with the same kinds: the keys are declared once.
func TestUpstreamEntrySettings(t *testing.T) {
	var want []string
	kinds := map[string]kind{}
	for _, s := range settings(new(Options)) {
		if k, ok := strings.CutPrefix(s.key, "upstream."); ok && k != "group_by" {
			want, kinds[k] = append(want, k), s.kind
		}
	}
	want = append(want, "name", "types")
	var got []string
	for _, s := range upstreamEntrySettings(new(relay.UpstreamConfig)) {
		got = append(got, s.key)
		if k, ok := kinds[s.key]; ok && k != s.kind {
			t.Errorf("%s: kind %s, upstream.%s is %s", s.key, s.kind, s.key, k)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("entry keys %v, want %v", got, want)
	}
}

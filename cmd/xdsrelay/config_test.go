package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		env     map[string]string
		wantErr string // a substring; "" for success
		check   func(t *testing.T, o Options)
	}{
		{
			name: "defaults without a file",
			check: func(t *testing.T, o Options) {
				if o.Relay.Upstream.Address != "127.0.0.1:18000" || o.Relay.Cache.Retention != 5*time.Minute {
					t.Errorf("defaults: %+v", o.Relay)
				}
				if !reflect.DeepEqual(o.Relay.Upstream.GroupBy, []string{"cluster"}) {
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
			yaml: "upstream:\n  tls:\n    ca_file: /ca.pem\n    server_name: cp.internal\n  headers:\n    authorization: Bearer abc\ndownstream:\n  tls:\n    cert_file: /tls.crt\n    key_file: /tls.key\n    client_ca_file: /clients.pem\n",
			env:  map[string]string{"XDSRELAY_UPSTREAM_TLS_INSECURE_SKIP_VERIFY": "false"},
			check: func(t *testing.T, o Options) {
				u, d := o.Relay.Upstream, o.Relay.Downstream
				if u.TLS.CAFile != "/ca.pem" || u.TLS.ServerName != "cp.internal" || u.Headers["authorization"] != "Bearer abc" {
					t.Errorf("upstream: %+v %v", u.TLS, u.Headers)
				}
				if d.TLS.CertFile != "/tls.crt" || d.TLS.KeyFile != "/tls.key" || d.TLS.CAFile != "/clients.pem" {
					t.Errorf("downstream: %+v", d.TLS)
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
		{name: "bad log level", yaml: "log:\n  level: loud\n", wantErr: "log.level"},
		{name: "address as a list", yaml: "admin:\n  address: [a, b]\n", wantErr: "admin.address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := ""
			if tc.yaml != "" {
				file = filepath.Join(t.TempDir(), "config.yaml")
				if err := os.WriteFile(file, []byte(tc.yaml), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			env := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			o, err := loadConfig(file, env)
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

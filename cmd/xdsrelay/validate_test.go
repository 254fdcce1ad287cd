package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/testcp"
)

// validate is serve without listening: what serve refuses at start,
// validate refuses, every error in one run, each naming its key; a
// resource file's error is placed in the file as written.
func TestValidateIsServeWithoutListening(t *testing.T) {
	certs := testcp.MakeCerts(t)
	missing := filepath.Join(t.TempDir(), "nope.crt")
	resources := t.TempDir()
	writeFile(t, filepath.Join(resources, "good.yaml"), clusterFile("good"))
	writeFile(t, filepath.Join(resources, "listener.yaml"), "\"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\nname: edge\nadress: {}\n")

	// A client certificate that is not there: serve exits 1 naming the key.
	tlsConfig := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, tlsConfig, "upstream:\n  address: cp:18000\n  tls:\n    cert_file: "+missing+"\n    key_file: "+certs.ClientKey+"\n")
	var errOut bytes.Buffer
	if c := run(context.Background(), []string{"serve", "--config", tlsConfig}, nil, io.Discard, &errOut); c != 1 ||
		!strings.Contains(errOut.String(), "upstream.tls.cert_file: creds: certificate: open "+missing) {
		t.Errorf("serve: exit %d, %q; want 1 naming upstream.tls.cert_file", c, errOut.String())
	}
	code, out, errText := runCLI("validate", "--config", tlsConfig)
	if code != 2 || out != "" || !strings.Contains(errText, "xdsrelay: upstream.tls.cert_file: creds: certificate: open "+missing) {
		t.Errorf("validate: exit %d, %q %q; want 2 naming upstream.tls.cert_file", code, out, errText)
	}

	// --keys-only: the keys' values, not the files they name (a manifest
	// checked where its certificates are not mounted).
	if code, out, errText := runCLI("validate", "--keys-only", "--config", tlsConfig); code != 0 || out != "configuration OK\n" {
		t.Errorf("validate --keys-only: exit %d, %q %q", code, out, errText)
	}

	// Every error at once: keys that do not load, values out of bounds, a
	// key file missing beside its certificate, a server's TLS files, and
	// the resource files.
	many := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, many, `upstream:
  address: file://`+resources+`
cache:
  retention: soon
  max_resources: -1
downstream:
  tls:
    cert_file: `+certs.ServerCert+`
    key_file: `+missing+`
admin:
  tls:
    cert_file: `+certs.ServerCert+`
lrs:
  max_names: 0
`)
	code, _, errText = runCLI("validate", "--config", many)
	lines := strings.Split(strings.TrimSpace(errText), "\n")
	want := []string{
		"xdsrelay: cache.retention: \"soon\" is not a duration",
		"xdsrelay: admin.tls.key_file: required with admin.tls.cert_file",
		"xdsrelay: cache.max_resources: must not be negative, got -1",
		"xdsrelay: lrs.max_names: must be at least 1, got 0",
		"xdsrelay: downstream.tls.key_file: creds: key: open " + missing,
		"/listener.yaml: resource 1: line 3:1: unknown field \"adress\"",
	}
	if code != 2 || len(lines) != len(want) {
		t.Fatalf("validate: exit %d, %d lines, want 2 and %d:\n%s", code, len(lines), len(want), errText)
	}
	for _, w := range want {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, w) }) {
			t.Errorf("no line says %q:\n%s", w, errText)
		}
	}

	// Resource files alone: exit 1, each error placed in its file.
	code, _, errText = runCLI("validate", "--config", filepath.Join(t.TempDir(), "none.yaml"))
	if code != 2 {
		t.Errorf("a configuration file that is not there: exit %d, %q", code, errText)
	}
	code, _, errText = runCLIEnv(map[string]string{"XDSRELAY_UPSTREAM_ADDRESS": "file://" + resources}, "validate")
	if code != 1 || !strings.Contains(errText, "listener.yaml: resource 1: line 3:1: unknown field \"adress\"") || strings.Contains(errText, "line 1:") {
		t.Errorf("validate of the resource files: exit %d, %q", code, errText)
	}
}

// A list from the environment may be written as the YAML file writes it,
// [a, b], as config.example.yaml shows the key; a map as {k: v}.
func TestEnvironmentFlowValues(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"XDSRELAY_UPSTREAM_GROUP_BY": "[cluster]"}, []string{"cluster"}},
		{map[string]string{"XDSRELAY_UPSTREAM_GROUP_BY": "[cluster, user_agent, client_features]"}, []string{"cluster", "user_agent", "client_features"}},
		{map[string]string{"XDSRELAY_UPSTREAM_GROUP_BY": "[]"}, []string{}},
		{map[string]string{"XDSRELAY_UPSTREAM_GROUP_BY": "cluster,locality.zone"}, []string{"cluster", "locality.zone"}},
	} {
		o, _, err := loadConfig("", environ(tc.env))
		if err != nil || !slices.Equal(o.Relay.Upstream.GroupBy, tc.want) {
			t.Errorf("%v: group_by %q, %v; want %q", tc.env, o.Relay.Upstream.GroupBy, err, tc.want)
		}
	}
	o, _, err := loadConfig("", environ(map[string]string{"XDSRELAY_UPSTREAM_ADDRESSES": "[a:1, b:2]", "XDSRELAY_UPSTREAM_HEADERS": "{x-team: mesh, x-env: prod}"}))
	if err != nil || !slices.Equal(o.Relay.Upstream.Addresses, []string{"a:1", "b:2"}) || o.Relay.Upstream.Headers["x-team"] != "mesh" || len(o.Relay.Upstream.Headers) != 2 {
		t.Errorf("addresses %q, headers %v, %v", o.Relay.Upstream.Addresses, o.Relay.Upstream.Headers, err)
	}
	if _, _, err := loadConfig("", environ(map[string]string{"XDSRELAY_UPSTREAM_GROUP_BY": "[cluster"})); err == nil || !strings.Contains(err.Error(), "upstream.group_by (from XDSRELAY_UPSTREAM_GROUP_BY)") {
		t.Errorf("a flow list that does not close: %v", err)
	}
	if code, out, errText := runCLIEnv(map[string]string{"XDSRELAY_UPSTREAM_GROUP_BY": "[cluster]"}, "validate"); code != 0 || out != "configuration OK\n" {
		t.Errorf("validate with XDSRELAY_UPSTREAM_GROUP_BY=[cluster]: exit %d, %q %q", code, out, errText)
	}
}

// validate reports every file of one TLS section that does not load, not
// the first; and the TLS files of an upstream whose address is a
// directory (file://, as config.example.yaml and the manifests keep it,
// the real address coming from the environment) are checked too: a
// typo there is a warning (this configuration runs as it is), said
// before a pod uses them.
func TestValidateEveryTLSFile(t *testing.T) {
	certs := testcp.MakeCerts(t)
	missing := filepath.Join(t.TempDir(), "nope.pem")
	resources := t.TempDir()
	writeFile(t, filepath.Join(resources, "good.yaml"), clusterFile("good"))
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, cfg, `upstream:
  address: file://`+resources+`
  tls:
    ca_file: `+missing+`
admin:
  tls:
    cert_file: `+missing+`
    key_file: `+certs.ServerKey+`
    client_ca_file: `+missing+`-ca
`)
	code, out, errText := runCLI("validate", "--config", cfg)
	for _, want := range []string{"xdsrelay: admin.tls.cert_file: creds: certificate: open " + missing,
		"xdsrelay: admin.tls.client_ca_file: creds: CA: open " + missing + "-ca"} {
		if !strings.Contains(errText, want) {
			t.Errorf("validate: no line says %q:\n%s", want, errText)
		}
	}
	if code != 2 || out != "" {
		t.Errorf("validate: exit %d, %q %q", code, out, errText)
	}

	writeFile(t, cfg, "upstream:\n  address: file://"+resources+"\n  tls:\n    ca_file: "+missing+"\n")
	code, out, errText = runCLI("validate", "--config", cfg)
	if code != 0 || !strings.HasPrefix(out, "configuration OK; 1 resources in "+resources+" (and 1 warning)") ||
		!strings.Contains(errText, "xdsrelay: warning: upstream.tls.ca_file: creds: CA: open "+missing) || !strings.Contains(errText, "unused while upstream.address is file://") {
		t.Errorf("validate with a file:// address and a missing CA: exit %d, %q %q; want 0 and a warning naming upstream.tls.ca_file", code, out, errText)
	}
}

// Errors say what to do: a directory given as upstream.address without
// file://, an address with a scheme, a relative resource directory that
// is not there (read from the working directory), a misspelt key in the
// file (the nearest key, as the environment's form says it).
func TestErrorsSayWhatToDo(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		want       string
	}{
		{"a directory", "", map[string]string{"XDSRELAY_UPSTREAM_ADDRESS": "examples/resources"},
			`upstream.address: "examples/resources" is not host:port: a directory of resource files is file://examples/resources`},
		{"a scheme", "", map[string]string{"XDSRELAY_UPSTREAM_ADDRESS": "http://cp:18000"},
			`upstream.address: "http://cp:18000" is not host:port: write the host and port alone (cp:18000), without http://`},
		{"a relative directory", "", map[string]string{"XDSRELAY_UPSTREAM_ADDRESS": "file://no/such/dir"},
			"open no/such/dir: no such file or directory (a relative file:// directory is read from the working directory, "},
		{"a misspelt key", "upstream:\n  protocl: sotw\n", nil, `unknown key "upstream.protocl" (did you mean upstream.protocol?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"validate"}
			if tc.file != "" {
				writeFile(t, cfg, tc.file)
				args = append(args, "--config", cfg)
			}
			code, out, errText := runCLIEnv(tc.env, args...)
			if code == 0 || !strings.Contains(errText, tc.want) {
				t.Errorf("exit %d, %q %q; want an error saying %q", code, out, errText, tc.want)
			}
		})
	}
}

package relay

import (
	"fmt"
	"strings"

	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/upstream"
)

// Checked is what CheckStart found.
type Checked struct {
	// TLS is every error of the TLS files of each side, each naming its
	// key.
	TLS []error
	// Files is every error of the resource files of a file://
	// upstream.address: each file that does not load and each invalid
	// resource.
	Files []error
	// Dir and Resources are the resource directory, if any, and how many
	// resources its files that load hold.
	Dir       string
	Resources int
}

// CheckStart makes the checks New makes at start beyond the
// configuration's own (Problems, which the authorization rules are among):
// it loads the TLS files of each side and the resource files of a file://
// upstream, without listening, connecting or watching anything, and
// reports every error, not the first. With Problems, it is what xdsrelay
// validate runs.
func CheckStart(cfg Config) Checked {
	var out Checked
	for _, t := range tlsOf(cfg) {
		if err := creds.Check(t.files); err != nil {
			out.TLS = append(out.TLS, tlsError(t.prefix, t.caKey, err))
		}
	}
	if dir, ok := strings.CutPrefix(cfg.Upstream.Address, FilePrefix); ok && dir != "" {
		out.Dir = dir
		var errs []error
		out.Resources, errs = upstream.CheckDir(dir)
		for _, err := range errs {
			out.Files = append(out.Files, fmt.Errorf("upstream.address: %w", err))
		}
	}
	return out
}

// tlsSide is one side's TLS settings and how their keys are named.
type tlsSide struct {
	prefix, caKey string
	files         creds.TLS
}

// tlsOf lists the TLS settings New loads: each control plane's (not a
// directory's), the downstream's and the admin endpoint's.
func tlsOf(cfg Config) []tlsSide {
	var out []tlsSide
	ups := []UpstreamConfig{cfg.Upstream.UpstreamConfig}
	prefixes := []string{"upstream"}
	for i, u := range cfg.Upstreams {
		ups, prefixes = append(ups, u), append(prefixes, fmt.Sprintf("upstreams[%d]", i))
	}
	for i, u := range ups {
		t := u.TLS
		whole := (t.CertFile == "") == (t.KeyFile == "") && !(t.Insecure && t.CAFile != "") // else Problems said so
		if t.Enabled() && whole && !strings.HasPrefix(u.Address, FilePrefix) {
			out = append(out, tlsSide{prefixes[i], "ca_file", u.TLS})
		}
	}
	if t := cfg.Downstream.TLS; t.Enabled() && t.CertFile != "" && t.KeyFile != "" {
		out = append(out, tlsSide{"downstream", "client_ca_file", t})
	}
	if t := cfg.Admin.TLS; t.Enabled() && t.CertFile != "" && t.KeyFile != "" {
		out = append(out, tlsSide{"admin", "client_ca_file", t})
	}
	return out
}

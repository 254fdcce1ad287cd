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
	// Warnings are errors of files the configuration names and this
	// configuration does not use: the TLS files of an upstream whose
	// address is a directory (file://), which the address set where the
	// relay runs (XDSRELAY_UPSTREAM_ADDRESS) would use.
	Warnings []error
	// Dir and Resources are the resource directory, if any, and how many
	// resources its files that load hold.
	Dir       string
	Resources int
}

// CheckStart makes the checks New makes at start beyond the
// configuration's own (Problems, which the authorization rules are among):
// it loads the TLS files of each side and the resource files of a file://
// upstream, without listening, connecting or watching anything, and
// reports every error, not the first; and, when the TLS files load, what
// the other members of a fleet will make of this replica's certificate
// (checkFleetCert), which New does not refuse: a member refused by the
// others serves alone, and says so as it runs. With Problems, it is what
// xdsrelay validate runs.
func CheckStart(cfg Config) Checked {
	var out Checked
	for _, t := range tlsOf(cfg) {
		for _, err := range creds.CheckEach(t.files) {
			err = tlsError(t.prefix, t.caKey, err)
			if t.unusedBy != "" {
				out.Warnings = append(out.Warnings, fmt.Errorf("%w (unused while %s is %s...; used where it names a control plane, as the environment may set it)",
					err, t.unusedBy, FilePrefix))
				continue
			}
			out.TLS = append(out.TLS, err)
		}
	}
	if len(out.TLS) == 0 {
		out.TLS = checkFleetCert(cfg)
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

// tlsSide is one side's TLS settings and how their keys are named;
// unusedBy, for an upstream's that this configuration does not load, is
// the key of its file:// address.
type tlsSide struct {
	prefix, caKey string
	files         creds.TLS
	unusedBy      string
}

// tlsOf lists the TLS settings New loads: each control plane's, the
// downstream's and the admin endpoint's; and those of an upstream whose
// address is a directory, which New does not load but a deployment that
// sets the address from its environment does: a typo there is found
// before it reaches a pod (as a warning: this configuration runs).
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
		if !t.Enabled() || !whole {
			continue
		}
		side := tlsSide{prefix: prefixes[i], caKey: "ca_file", files: u.TLS}
		if strings.HasPrefix(u.Address, FilePrefix) {
			side.unusedBy = prefixes[i] + ".address"
		}
		out = append(out, side)
	}
	if t := cfg.Downstream.TLS; t.Enabled() && t.CertFile != "" && t.KeyFile != "" {
		out = append(out, tlsSide{prefix: "downstream", caKey: "client_ca_file", files: t})
	}
	if t := cfg.Admin.TLS; t.Enabled() && t.CertFile != "" && t.KeyFile != "" {
		out = append(out, tlsSide{prefix: "admin", caKey: "client_ca_file", files: t})
	}
	return out
}

package main

//go:generate go run . docs --dir ../../docs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/relay"
)

// The reference documents in docs/ that the binary writes from what it is
// built from: the key table (settings), the metrics registry and the admin
// paths. A test holds the committed files to what it writes.

// generatedBy opens every reference document.
const generatedBy = "<!-- Written by `xdsrelay docs` (`go generate ./...`); do not edit: change the source it names and run it again. -->\n\n"

// newDocsCmd is xdsrelay docs.
func newDocsCmd() *cobra.Command {
	var (
		dir   string
		check bool
	)
	cmd := &cobra.Command{
		Use:   "docs [--dir DIR] [--check]",
		Short: "Write the reference documents (configuration, metrics, admin paths)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			docs, err := referenceDocs()
			if err != nil {
				return err
			}
			if check {
				return checkDocs(cmd, dir, docs)
			}
			return writeDocs(dir, docs)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "docs", "write the documents into `DIR`")
	cmd.Flags().BoolVar(&check, "check", false, "write nothing; exit 1 naming each document in DIR that differs")
	return cmd
}

func writeDocs(dir string, docs map[string][]byte) error {
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		if err := os.WriteFile(filepath.Join(dir, name), docs[name], 0o644); err != nil {
			return fmt.Errorf("docs: %w", err)
		}
	}
	return nil
}

func checkDocs(cmd *cobra.Command, dir string, docs map[string][]byte) error {
	stale := 0
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		have, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(have, docs[name]) {
			fmt.Fprintf(cmd.ErrOrStderr(), "xdsrelay: %s is not what xdsrelay docs writes: run go generate ./...\n", filepath.Join(dir, name))
			stale++
		}
	}
	if stale > 0 {
		return exitStatus(1)
	}
	return nil
}

// referenceDocs returns the reference documents by file name.
func referenceDocs() (map[string][]byte, error) {
	families, err := metricFamilies()
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		"configuration.md": configurationDoc(),
		"metrics.md":       metricsDoc(families),
		"admin.md":         adminDoc(relay.AdminPaths()),
	}, nil
}

// cell makes s fit in a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

// code is s as inline code, or "empty".
func code(s string) string {
	if s == "empty" {
		return s
	}
	return "`" + s + "`"
}

// kindDocs says what each kind of value takes, in the file and in the
// environment.
var kindDocs = map[kind]string{
	kindString:    "A string.",
	kindDuration:  "A Go duration: `300ms`, `30s`, `5m`, `1h30m`; a bare `0` is allowed.",
	kindInt:       "A whole number.",
	kindBool:      "`true` or `false`.",
	kindList:      "A YAML list of strings (`[a, b]`, `[]` for none); in the environment, comma separated (`a,b`).",
	kindMap:       "A YAML map of strings; in the environment, `name=value,name2=value2`.",
	kindRatio:     "A number from 0 to 1.",
	kindLevel:     "`debug`, `info`, `warn` or `error`.",
	kindRules:     "A YAML list of maps `{identity, node, authorities}`; in the environment, the same list as JSON.",
	kindRate:      "A number of 0 or more: a rate per second (`limits.stream_rate`), or a fraction or a count (`rollout.canary`).",
	kindUpstreams: "A YAML list of maps, each taking the keys below; in the environment, the same list as JSON.",
}

// configurationDoc is docs/configuration.md: every key of the table in
// settings.go, by section.
func configurationDoc() []byte {
	var b bytes.Buffer
	b.WriteString("# Configuration reference\n\n" + generatedBy)
	fmt.Fprintf(&b, `Every key the relay reads, from the table in `+"`cmd/xdsrelay/settings.go`"+`.
A key is set in the YAML file named by `+"`--config`"+` (its dots are nesting:
`+"`upstream.address`"+` is `+"`address`"+` under `+"`upstream:`"+`), or in the environment as
`+"`%s`"+` and the key in upper case, dots becoming underscores
(`+"`%s`"+`). The environment wins over the file; a key set in
neither has its default. An unknown key in the file is an error; an unknown
`+"`%s`"+` variable is warned about by `+"`serve`"+` and refused by `+"`validate`"+`.
`+"`config.example.yaml`"+` shows every key. The configuration is read once, at start:
restart to apply a change.
`, envPrefix, envName("upstream.address"), envPrefix)

	def := defaultOptions()
	var section string
	for _, s := range settings(&def) {
		if sec, _, _ := strings.Cut(s.key, "."); sec != section {
			section = sec
			fmt.Fprintf(&b, "\n## %s\n\n| Key | Type | Default | Environment | Meaning |\n|-----|------|---------|-------------|---------|\n", section)
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | `%s` | %s |\n", s.key, s.kind, cell(code(formatValue(s))), envName(s.key), cell(s.doc))
	}

	u := relay.DefaultUpstream()
	u.Name = ""
	b.WriteString("\n## Keys of an `upstreams` entry\n\n")
	b.WriteString("Each entry of `upstreams` is a control plane of its own: a map with these keys, nested as under `upstream:`. An entry starts from these defaults, not from the `upstream.*` values; `group_by` is one setting for the whole relay and is refused here. From the environment, `" + envName("upstreams") + "` is the whole list as JSON.\n\n")
	b.WriteString("| Key | Type | Default | Meaning |\n|-----|------|---------|---------|\n")
	for _, s := range upstreamEntrySettings(&u) {
		def := code(formatValue(s))
		if s.key == "name" {
			def = "required"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", s.key, s.kind, cell(def), cell(s.doc))
	}

	b.WriteString("\n## Types\n\n| Type | Takes |\n|------|-------|\n")
	for k := range kind(len(kindNames)) {
		fmt.Fprintf(&b, "| %s | %s |\n", k, cell(kindDocs[k]))
	}
	return b.Bytes()
}

// metricFamilies are the families of relays built as the binary builds
// them: one with several control planes (the router's families) and one
// serving resource files (the file source's), together every family the
// relay registers.
func metricFamilies() ([]metrics.Family, error) {
	dir, err := os.MkdirTemp("", "xdsrelay-docs")
	if err != nil {
		return nil, fmt.Errorf("docs: %w", err)
	}
	defer os.RemoveAll(dir)
	routed := relay.Default()
	extra := relay.DefaultUpstream()
	extra.Name, extra.Types = "secrets", []string{"secrets"}
	routed.Upstreams = []relay.UpstreamConfig{extra}
	files := relay.Default()
	files.Upstream.Address = relay.FilePrefix + dir
	byName := map[string]metrics.Family{}
	for _, cfg := range []relay.Config{routed, files} {
		fs, err := familiesOf(cfg)
		if err != nil {
			return nil, err
		}
		for _, f := range fs {
			byName[f.Name] = f
		}
	}
	out := make([]metrics.Family, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[name])
	}
	return out, nil
}

// familiesOf builds a relay (without starting it) and describes its
// families.
func familiesOf(cfg relay.Config) ([]metrics.Family, error) {
	cfg.Build = currentVersion().relayBuild()
	r, err := relay.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("docs: %w", err)
	}
	fs := r.MetricFamilies()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("docs: %w", err)
	}
	return fs, nil
}

// metricsDoc is docs/metrics.md: every family the relay registers.
func metricsDoc(families []metrics.Family) []byte {
	var b bytes.Buffer
	b.WriteString("# Metrics reference\n\n" + generatedBy)
	b.WriteString(`Every metric family the relay serves on ` + "`/metrics`" + ` (see [admin.md](admin.md)), from
its metrics registry: the Prometheus text format, or OpenMetrics when the
scraper asks for it. Beside them the Go runtime's (` + "`go_*`" + `) and the
process's (` + "`process_*`" + `) families are served, from the Prometheus client
library's collectors.

Label values are bounded: no metric is labelled with a node id; the
` + "`group`" + ` label is the group's id, the one name the logs, the admin endpoint and
the commands give it (the key itself, or a prefix of a key longer than 48
bytes and 12 hex digits of its hash: at most 45 bytes; ` + "`xdsrelay groups`" + `
maps it to the whole key); any other value longer than 64 bytes or not
valid UTF-8 is replaced by ` + "`sha256:`" + ` and 16 hex digits. With
` + "`metrics.group_label: false`" + ` the ` + "`group`" + ` label is dropped: the groups' series are
summed, or for the families marked *largest*, the largest is kept.

Every family is there from the start, whatever the upstream (a control
plane, several, resource files): a family whose labels take a finite set
of values (types, reasons, variants, configured upstreams and keys) has
each of its series from the start, at 0 (a histogram with no
observation), so that a first event is an increase. Only a group's series
come and go with the group, and ` + "`xdsrelay_certificate_expiry_seconds`" + `
has a series for each configured certificate.

| Metric | Type | Labels | Meaning |
|--------|------|--------|---------|
`)
	for _, f := range families {
		labels := make([]string, len(f.Labels))
		for i, l := range f.Labels {
			labels[i] = "`" + l + "`"
		}
		typ := f.Type
		if f.Max {
			typ += " (*largest*)"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", f.Name, typ, strings.Join(labels, ", "), cell(f.Help))
	}
	return b.Bytes()
}

// adminDoc is docs/admin.md: every path of the admin endpoint.
func adminDoc(paths []relay.AdminPath) []byte {
	var b bytes.Buffer
	b.WriteString("# Admin endpoint reference\n\n" + generatedBy)
	b.WriteString(`The admin endpoint is HTTP on ` + "`admin.address`" + ` (` + "`127.0.0.1:9901`" + ` by default;
empty turns it off), HTTPS with ` + "`admin.tls`" + `, and the same paths over HTTP on
` + "`admin.local_address`" + ` when it is open. ` + "`xdsrelay admin PATH`" + ` calls it, with a
client certificate if need be.

**Who may call what.** Probes and ` + "`/metrics`" + ` answer anyone who reaches a
listener. The read-only views, which reveal the configuration or the
tenants (group keys, the control plane's address, file and resource names),
answer a *local* or a *private* caller; what changes or inspects the
process answers only a *private* caller:

- a *private* caller came on an ` + "`admin.address`" + ` bound to a loopback address
  (decided by the address it is bound to: ` + "`0.0.0.0`" + ` is not loopback), or over
  ` + "`admin.tls`" + ` with a client certificate that ` + "`admin.tls.client_ca_file`" + `
  verifies (a certificate is verified when presented, not required, so
  probes without one still work);
- a *local* caller came on ` + "`admin.local_address`" + ` (` + "`127.0.0.1:9902`" + ` by default, a
  loopback address only, opened when ` + "`admin.address`" + ` is not loopback): inside
  the pod, as ` + "`kubectl port-forward`" + ` and ` + "`kubectl exec`" + ` reach it, where other
  pods cannot.

A request that came through a proxy is neither, on either loopback
listener: one from a loopback address other than ` + "`127.0.0.1`" + ` and ` + "`::1`" + ` (Istio's
sidecar forwards from ` + "`127.0.0.6`" + `), or carrying a proxy's headers
(` + "`Forwarded`" + `, ` + "`Via`" + `, ` + "`X-Forwarded-*`" + `, ` + "`X-Real-IP`" + `, ` + "`X-Envoy-*`" + `, ` + "`l5d-*`" + `); a verified
client certificate stands through any proxy (see [Admin
exposure](operations.md#admin-exposure)). Others get 403, which says what
it takes. An ` + "`admin.address`" + ` that is not loopback without ` + "`admin.tls`" + ` is allowed
and warned about (` + "`xdsrelay_config_warnings{key=\"admin.address\"}`" + `).

Every body is bounded whatever clients put in their nodes: a group key is
shown as the ` + "`group`" + ` label of the metrics shows it, and the paths that take
` + "`group=`" + ` accept that form; texts from peers are clipped to 1 KiB.

| Path | Who may call it | Served | Returns |
|------|-----------------|--------|---------|
`)
	for _, p := range paths {
		served := p.Served
		if served == "" {
			served = "always"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", p.Shown(), p.Access, cell(served), cell(p.Returns))
	}
	b.WriteString(`
The downstream port (` + "`downstream.address`" + `) serves gRPC health
(` + "`grpc.health.v1.Health`" + `, service ` + "`\"\"`" + `): ` + "`SERVING`" + ` while ` + "`/readyz`" + ` would answer 200,
` + "`NOT_SERVING`" + ` before and from the start of shutdown on.
`)
	return b.Bytes()
}

package upstream

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/xdsrelay/xdsrelay/cache"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
	"github.com/xdsrelay/xdsrelay/internal/testlog"
)

// hcm is an HttpConnectionManager typed_config, with or without its
// required stat_prefix.
func hcm(statPrefix string) string {
	return `{"@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager,
  stat_prefix: "` + statPrefix + `", rds: {route_config_name: r, config_source: {ads: {}}},
  http_filters: [{name: router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}]}`
}

// Resources are checked against their protos' rules, and so is every Any
// within them whose type is known; an error names the field.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		yaml    string
		wantErr []string // substrings of the error; none if valid
	}{
		{name: "valid cluster", yaml: cluster("a", "1s")},
		{name: "negative duration", yaml: cluster("a", "-1s"),
			wantErr: []string{"Cluster.ConnectTimeout", "greater than 0s"}},
		{name: "valid listener", yaml: `"@type": type.googleapis.com/envoy.config.listener.v3.Listener
name: l
api_listener: {api_listener: ` + hcm("l") + "}\n"},
		{name: "invalid typed_config", yaml: `"@type": type.googleapis.com/envoy.config.listener.v3.Listener
name: l
filter_chains: [{filters: [{name: hcm, typed_config: ` + hcm("") + `}]}]
`, wantErr: []string{"filter_chains[0].filters[0].typed_config: ", "HttpConnectionManager.StatPrefix"}},
		{name: "invalid Any in a map", yaml: `"@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
name: r
virtual_hosts: [{name: vh, domains: ["*"], typed_per_filter_config: {x: ` + hcm("") + `}}]
`, wantErr: []string{`virtual_hosts[0].typed_per_filter_config["x"]: `, "HttpConnectionManager.StatPrefix"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.yaml")
			writeFile(t, path, tc.yaml)
			anys, errs := loadFile(path)
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			_, m, err := decodeFileResource(anys[0].a)
			if err != nil {
				t.Fatal(err)
			}
			err = validate(m)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			for _, want := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("error %v, want one containing %q", err, want)
				}
			}
		})
	}
}

// An Any of a type the relay does not know is passed on unchecked.
func TestValidateSkipsUnknownAny(t *testing.T) {
	rc := &routepb.RouteConfiguration{Name: "r", VirtualHosts: []*routepb.VirtualHost{{
		Name: "vh", Domains: []string{"*"},
		TypedPerFilterConfig: map[string]*anypb.Any{"x": {TypeUrl: "type.googleapis.com/example.Unknown", Value: []byte{1, 2}}},
	}}}
	if err := validate(rc); err != nil {
		t.Fatalf("rejected: %v", err)
	}
}

// At startup there is no last good version to serve: an invalid resource
// is an error naming the file, the resource and the field.
func TestFileInvalidAtStartup(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "good.yaml"), cluster("ok", "1s"))
	writeFile(t, filepath.Join(dir, "clusters.yaml"), cluster("ok2", "1s")+"---\n"+cluster("bad", "-1s"))
	_, err := NewFile(dir, nil, nil)
	for _, want := range []string{"clusters.yaml", `Cluster "bad"`, "Cluster.ConnectTimeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v, want one naming %s", err, want)
		}
	}
}

// syncBuffer is a log destination that tests may read while it is written.
type syncBuffer = testlog.Buffer

func metricsText(reg *metrics.Registry) string {
	var b strings.Builder
	reg.WriteTo(&b)
	return b.String()
}

// A reload that makes a resource invalid keeps its last good version served
// while the file's other resources update; a new invalid resource is not
// served. Both are logged (file, resource, field), counted and shown in the
// status until they are fixed.
func TestFileInvalidAtReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "clusters.yaml")
	writeFile(t, file, cluster("a", "1s")+"---\n"+cluster("b", "1s"))
	var logs syncBuffer
	reg := &metrics.Registry{}
	f, err := NewFile(dir, slog.New(slog.NewTextHandler(&logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := cache.New(cache.Options{Retention: time.Minute})
	c.Watch(cache.NewWatch(), resourcev3.ClusterType, "a", "b", "new")
	done := make(chan struct{}, 2)
	go func() { f.Run(ctx); done <- struct{}{} }()
	go func() { f.Serve(ctx, c); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()
	a1, b1 := waitVersion(t, c, "a", ""), waitVersion(t, c, "b", "")

	writeFile(t, file, cluster("a", "-1s")+"---\n"+cluster("b", "2s")+"---\n"+cluster("new", "-2s"))
	waitVersion(t, c, "b", b1) // the same reload decided a and new
	if l := c.Get(resourcev3.ClusterType, []string{"a"})[0]; l.Resource == nil || l.Resource.Version != a1 {
		t.Fatalf("a: %+v, want its last good version %s", l.Resource, a1)
	}
	if l := c.Get(resourcev3.ClusterType, []string{"new"})[0]; l.Resource != nil {
		t.Fatalf("the invalid new resource is served: %+v", l.Resource)
	}
	st := f.Status().Invalid
	for _, want := range []string{file + `: Cluster "a": invalid Cluster.ConnectTimeout`, "its last good version is served",
		file + `: Cluster "new": invalid Cluster.ConnectTimeout`, "not served"} {
		if !strings.Contains(st, want) {
			t.Errorf("status %q does not say %q", st, want)
		}
	}
	if m := metricsText(reg); !strings.Contains(m, "xdsrelay_file_invalid_resources 2\n") {
		t.Errorf("metrics do not count 2 invalid resources:\n%s", m)
	}
	eventually(t, "the log lines", func() bool {
		s := logs.String()
		return strings.Contains(s, "file="+file+" type=Cluster name=a error=\"invalid Cluster.ConnectTimeout") &&
			strings.Contains(s, "name=new error=\"invalid Cluster.ConnectTimeout")
	})

	// Files that do not load are shown too, until they load.
	writeFile(t, file, "{{{")
	eventually(t, "the status to say the files do not load", func() bool {
		return strings.Contains(f.Status().Invalid, "resource files do not load")
	})

	writeFile(t, file, cluster("a", "3s")+"---\n"+cluster("b", "2s"))
	waitVersion(t, c, "a", a1)
	if st := f.Status().Invalid; st != "" {
		t.Errorf("status after the fix: %q", st)
	}
	if m := metricsText(reg); !strings.Contains(m, "xdsrelay_file_invalid_resources 0\n") {
		t.Errorf("metrics after the fix:\n%s", m)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

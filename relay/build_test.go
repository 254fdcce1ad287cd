package relay

import (
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"
)

// buildInfoLabels returns the labels of the one xdsrelay_build_info series
// on r's /metrics, whose value must be 1.
func buildInfoLabels(t *testing.T, r *Relay) map[string]string {
	t.Helper()
	mf := scrape(t, r)["xdsrelay_build_info"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		t.Fatalf("xdsrelay_build_info: %v, want one series", mf)
	}
	m := mf.GetMetric()[0]
	if v := m.GetGauge().GetValue(); v != 1 {
		t.Errorf("xdsrelay_build_info is %v, want 1", v)
	}
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func exampleFiles() string { return FilePrefix + filepath.Join("..", "examples", "resources") }

// The binary's version (Config.Build) is what /metrics reports.
func TestBuildInfoMetric(t *testing.T) {
	r := startRelay(t, exampleFiles(), func(c *Config) {
		c.Build = BuildInfo{Version: "v1.2.3", Revision: "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d", GoVersion: "go1.99.0"}
	})
	got := buildInfoLabels(t, r)
	want := map[string]string{"version": "v1.2.3", "revision": "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d", "go_version": "go1.99.0"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("labels %v, want exactly %v", got, want)
	}
}

// Without Config.Build, a relay reports its module's version from the build
// information, and the Go version it runs on.
func TestBuildInfoMetricDefault(t *testing.T) {
	r := startRelay(t, exampleFiles())
	got := buildInfoLabels(t, r)
	bi, _ := debug.ReadBuildInfo()
	if want := moduleBuild(bi).Version; got["version"] != want || want == "" {
		t.Errorf("version %q, want the module's %q", got["version"], want)
	}
	if got["go_version"] != runtime.Version() {
		t.Errorf("go_version %q, want %q", got["go_version"], runtime.Version())
	}
}

func TestModuleBuild(t *testing.T) {
	const rev = "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d"
	dep := &debug.Module{Path: modulePath, Version: "v0.3.0"}
	tests := []struct {
		name string
		bi   *debug.BuildInfo
		want BuildInfo
	}{
		{name: "no build information", want: BuildInfo{Version: "(devel)"}},
		{
			name: "the relay's own binary",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: modulePath, Version: "v0.2.0"},
				Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}}},
			want: BuildInfo{Version: "v0.2.0", Revision: rev, GoVersion: "go1.26.8"},
		},
		{
			name: "built into another program",
			bi: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/other", Version: "v9.0.0"},
				Deps: []*debug.Module{{Path: "example.com/lib", Version: "v1.0.0"}, dep}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}}},
			want: BuildInfo{Version: "v0.3.0", GoVersion: "go1.26.8"},
		},
		{
			name: "another program without the relay's module",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/other", Version: "v9.0.0"}},
			want: BuildInfo{Version: "(devel)", GoVersion: "go1.26.8"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := moduleBuild(tc.bi); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

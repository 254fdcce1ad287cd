package relay

import (
	"runtime"
	"runtime/debug"
)

// BuildInfo is the version of the relay that runs, as xdsrelay_build_info
// reports it.
type BuildInfo struct {
	Version   string // the module version; "(devel)" when unknown
	Revision  string // the VCS commit; "" when unknown
	GoVersion string // the Go toolchain that built it; runtime.Version() if empty
}

// modulePath is the relay's module, looked up in the build information.
const modulePath = "github.com/xdsrelay/xdsrelay"

// moduleBuild is the relay module's version from the running binary's build
// information (bi may be nil): the main module's, with its VCS revision, or
// the dependency's when the relay is built into another program.
func moduleBuild(bi *debug.BuildInfo) BuildInfo {
	b := BuildInfo{Version: "(devel)"}
	if bi == nil {
		return b
	}
	b.GoVersion = bi.GoVersion
	m := &bi.Main
	if m.Path != modulePath {
		m = nil
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				m = d
				break
			}
		}
	}
	if m == nil {
		return b
	}
	if m.Version != "" {
		b.Version = m.Version
	}
	if m == &bi.Main {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				b.Revision = s.Value
			}
		}
	}
	return b
}

// registerBuildInfo sets xdsrelay_build_info: 1, labelled with the version
// (Config.Build, or the module's), the revision and the Go version.
func (r *Relay) registerBuildInfo() {
	b := r.cfg.Build
	if b.Version == "" {
		bi, _ := debug.ReadBuildInfo()
		b = moduleBuild(bi)
	}
	if b.GoVersion == "" {
		b.GoVersion = runtime.Version()
	}
	r.metrics.Gauge("xdsrelay_build_info", "Always 1; its labels say which relay runs: the version, the VCS revision (empty when unknown) and the Go version it was built with.",
		"version", "revision", "go_version").With(b.Version, b.Revision, b.GoVersion).Set(1)
}

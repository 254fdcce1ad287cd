package main

import (
	"runtime/debug"
	"strings"
)

// version and revision may be set at build time, and then win over the build
// information: -ldflags "-X main.version=v1.2.3 -X main.revision=<commit>".
var version, revision = "", ""

// buildVersion is what --version reports.
type buildVersion struct {
	Version  string // the module version, "(devel)" when unknown
	Revision string // the VCS commit, "" when unknown
	Time     string // the commit time (RFC 3339), "" when unknown
	Modified bool   // the tree had uncommitted changes
}

// readVersion combines the linker-set values with the build information (bi
// may be nil).
func readVersion(bi *debug.BuildInfo, ldVersion, ldRevision string) buildVersion {
	var v buildVersion
	if bi != nil {
		v.Version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.time":
				v.Time = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if ldVersion != "" {
		v.Version = ldVersion
	}
	if ldRevision != "" {
		v.Revision = ldRevision
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	return v
}

// String is the version, then in parentheses the revision (12 digits), its
// time and whether the tree was modified, when known:
// "v1.2.3 (rev 1a2b3c4d5e6f, 2026-11-02T10:00:00Z, modified)".
func (v buildVersion) String() string {
	var details []string
	if v.Revision != "" {
		details = append(details, "rev "+v.Revision[:min(len(v.Revision), 12)])
	}
	if v.Time != "" {
		details = append(details, v.Time)
	}
	if v.Modified {
		details = append(details, "modified")
	}
	if len(details) == 0 {
		return v.Version
	}
	return v.Version + " (" + strings.Join(details, ", ") + ")"
}

// currentVersion is this binary's version.
func currentVersion() buildVersion {
	bi, _ := debug.ReadBuildInfo()
	return readVersion(bi, version, revision)
}

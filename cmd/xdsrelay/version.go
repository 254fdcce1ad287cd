package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/relay"
)

// release is the release this source is: vX.Y.Z of the newest version in
// CHANGELOG.md. The release commit sets it, with the chart's appVersion,
// deploy/'s image tag and the README's lines (CONTRIBUTING.md,
// "Releases"; release_test.go holds them together). Every build reports
// it as its version, whatever the clone knows of tags (a CI clone often
// has none, and the container build has no .git): between releases a
// build carries the last release's number, and its revision tells the
// commit.
const release = "v0.2.0"

// version and revision may be set at build time, and then win over the
// release and the build information: -ldflags "-X main.version=v1.2.3-rc.1
// -X main.revision=<commit>".
var version, revision = "", ""

// buildVersion is what --version and the version command report.
type buildVersion struct {
	Version   string // release, unless the build set another
	Revision  string // the VCS commit, "" when unknown
	Time      string // the commit time (RFC 3339), "" when unknown
	Modified  bool   // the tree had uncommitted changes
	GoVersion string // the Go toolchain that built the binary
}

// readVersion combines the release and the linker-set values with the
// build information (bi may be nil). The module version in bi is not
// read: outside a tagged checkout the go command makes it a
// pseudo-version (v0.0.0-20261127...-abcdef), which names no release.
func readVersion(bi *debug.BuildInfo, ldVersion, ldRevision string) buildVersion {
	v := buildVersion{Version: release, GoVersion: runtime.Version()}
	if bi != nil {
		if bi.GoVersion != "" {
			v.GoVersion = bi.GoVersion
		}
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

// newVersionCmd is xdsrelay version.
func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the revision and the Go version",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return currentVersion().write(cmd.OutOrStdout())
		},
	}
}

// write prints the version, one field a line; "unknown" for what the
// build did not record:
//
//	version:  v1.2.3
//	revision: 1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b (modified)
//	time:     2026-11-02T10:00:00Z
//	go:       go1.26.8 linux/amd64
func (v buildVersion) write(w io.Writer) error {
	rev, when := orUnknown(v.Revision), orUnknown(v.Time)
	if v.Modified {
		rev += " (modified)"
	}
	_, err := fmt.Fprintf(w, "version:  %s\nrevision: %s\ntime:     %s\ngo:       %s %s/%s\n",
		v.Version, rev, when, v.GoVersion, runtime.GOOS, runtime.GOARCH)
	return err
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// relayBuild is what the relay reports in xdsrelay_build_info.
func (v buildVersion) relayBuild() relay.BuildInfo {
	return relay.BuildInfo{Version: v.Version, Revision: v.Revision, GoVersion: v.GoVersion}
}

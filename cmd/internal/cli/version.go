package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Build stamps, set at link time:
//
//	go build -ldflags "-X github.com/keiro-go/keiro/cmd/internal/cli.version=v1.2.3 -X github.com/keiro-go/keiro/cmd/internal/cli.commit=$(git rev-parse HEAD)"
//
// Unset, [Build] falls back to what the Go toolchain recorded in the binary
// (debug.ReadBuildInfo: the module version and the vcs.revision of the build).
var (
	version string
	commit  string
)

// BuildInfo identifies a binary's build.
type BuildInfo struct {
	// Version is the release version ("v1.2.3"), or "(devel)" for a build from a work tree.
	Version string `json:"version"`
	// Commit is the VCS revision built, with "-dirty" when the work tree had changes; "" when
	// unknown.
	Commit string `json:"commit"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

// Build returns the binary's build information: the link-time stamps, else the build info
// the Go toolchain embedded.
func Build() BuildInfo {
	return buildInfo(version, commit, debug.ReadBuildInfo)
}

func buildInfo(v, c string, read func() (*debug.BuildInfo, bool)) BuildInfo {
	b := BuildInfo{Version: v, Commit: c, GoVersion: runtime.Version()}
	if bi, ok := read(); ok {
		if b.Version == "" {
			b.Version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			b.GoVersion = bi.GoVersion
		}
		if b.Commit == "" {
			dirty := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					b.Commit = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if b.Commit != "" && dirty {
				b.Commit += "-dirty"
			}
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	return b
}

// String is the one-line form --version prints after the binary's name.
func (b BuildInfo) String() string {
	c := b.Commit
	if c == "" {
		c = "unknown"
	}
	return fmt.Sprintf("%s (commit %s, %s)", b.Version, c, b.GoVersion)
}

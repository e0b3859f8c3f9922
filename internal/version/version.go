// Package version says which build of idem-extproc is running. A release
// build stamps the version with the linker:
//
//	go build -ldflags "-X github.com/idem-extproc/idem-extproc/internal/version.version=v0.1.0" ./cmd/idem-extproc
//
// Without the stamp the module version Go recorded in the binary is used,
// and the VCS revision when Go recorded one: `go install …@v0.1.0` records
// v0.1.0; go build and go install in a git clone record the commit as a
// pseudo-version (v0.0.0-<commit time>-<revision prefix>, "+dirty" with
// uncommitted changes) and its revision; go run, -buildvcs=false and a tree
// Go does not take for a git repository (no .git directory: a source
// archive, a git worktree) record "(devel)" and no revision
// (cmd/go/internal/load/pkg.go, setBuildInfo).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at build time with -ldflags -X; see the package comment.
var version string

// Info is what the build says about itself.
type Info struct {
	Version   string
	Revision  string
	GoVersion string
}

// String is the one line `idem-extproc version` prints.
func (i Info) String() string {
	return fmt.Sprintf("idem-extproc %s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}

// Get returns the running build's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuild(version, bi)
}

// fromBuild prefers the stamped version, then the module version from the
// build info, and says "unknown" for what neither gives.
func fromBuild(stamped string, bi *debug.BuildInfo) Info {
	info := Info{Version: stamped, Revision: "unknown", GoVersion: runtime.Version()}
	if bi != nil {
		if info.Version == "" && bi.Main.Version != "" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				info.Revision = s.Value
			}
		}
	}
	if info.Version == "" {
		info.Version = "unknown"
	}
	return info
}

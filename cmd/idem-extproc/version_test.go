package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBinaryVersionUnstamped builds the binary from a fresh git clone of
// this repository without the release stamp, as a newcomer does, and
// checks what docs/flags.md ("Versions") says it reports. Go records the main module's version
// from the VCS when it finds a repository (go build and go install do by
// default, go run only with -buildvcs=true): the commit as a pseudo-version
// (cmd/go/internal/load/pkg.go, setBuildInfo; "+dirty" with uncommitted
// changes), and the revision. With -buildvcs=false, or in a tree Go does not
// take for a git repository (it looks for a .git directory:
// cmd/go/internal/vcs/vcs.go, vcsGit.RootNames; a git worktree's .git is a
// file), it records "(devel)" and no revision.
func TestBinaryVersionUnstamped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary from a fresh clone")
	}
	doc, err := os.ReadFile("../../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, claim := range []string{"`-buildvcs=false`", "`(devel)`", "`+dirty`", "pseudo-version"} {
		if !strings.Contains(string(doc), claim) {
			t.Errorf("docs/flags.md does not say %s about an unstamped build's version", claim)
		}
	}

	top, err := exec.Command("git", "-C", "../..", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): nothing to clone", err)
	}
	// A new directory each run costs no compilation: the build's
	// -trimpath keeps the directory out of the build cache's keys.
	src := filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command("git", "clone", "-q", strings.TrimSpace(string(top)), src).CombinedOutput(); err != nil {
		t.Skipf("git clone of this checkout: %v\n%s", err, out)
	}
	rev, err := exec.Command("git", "-C", src, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	revision := strings.TrimSpace(string(rev))
	version := func(buildvcs string) string {
		t.Helper()
		bin := filepath.Join(t.TempDir(), "idem-extproc")
		// Built as binary() builds it, so that the dependencies'
		// compilations are that build's, not a second configuration's.
		cmd := exec.Command("go", append(buildArgs(), buildvcs, "-o", bin, "./cmd/idem-extproc")...)
		cmd.Dir = src
		// The module cache has every dependency (this test's binary needs
		// them too): never reach for the network.
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", buildvcs, err, out)
		}
		if out, err = exec.Command(bin, "version").Output(); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}

	// The commit's pseudo-version (v0.0.0-<commit time>-<12 hex of the
	// revision>, its base taken from an earlier tag when there is one:
	// go.dev/ref/mod#pseudo-versions), or a tag of the commit itself.
	line := regexp.MustCompile(`^idem-extproc (\S+) \(revision ([0-9a-f]{40}), go`)
	tags, err := exec.Command("git", "-C", src, "tag", "--points-at", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	got := version("-buildvcs=true")
	m := line.FindStringSubmatch(got)
	switch {
	case m == nil || m[2] != revision:
		t.Errorf("a build from a clone of %s reports %q, want that revision", revision, got)
	case !regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+-(?:0\.)?[0-9]{14}-`+revision[:12]+`$`).MatchString(m[1]) &&
		!strings.Contains("\n"+string(tags), "\n"+m[1]+"\n"):
		t.Errorf("a build from a clone of %s reports version %q, want its pseudo-version or tag", revision, m[1])
	}
	if got := version("-buildvcs=false"); !strings.HasPrefix(got, "idem-extproc (devel) (revision unknown, go") {
		t.Errorf("a build with -buildvcs=false reports %q, want (devel) and no revision", got)
	}
}

// TestBinaryLinksOnlyWhatItCalls: the release build keeps the linker's
// dead-code elimination of methods, which a reachable call of
// reflect.Value.MethodByName with a name known only at run time turns off
// for the whole binary (cmd/link/internal/ld/deadcode.go, "reflectSeen"):
// text/template's executor makes one (text/template/exec.go, evalField),
// so neither the usage text nor grpc-go's tracing pages (grpcnotrace) may
// link it. A Redis command the store never sends is the witness.
func TestBinaryLinksOnlyWhatItCalls(t *testing.T) {
	bin, err := os.ReadFile(binary(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, sym := range []string{"text/template.(*state).evalField", "github.com/redis/go-redis/v9.cmdable.FTCreate"} {
		if bytes.Contains(bin, []byte(sym)) {
			t.Errorf("the binary links %s", sym)
		}
	}
}

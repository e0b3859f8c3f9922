// Package norace runs one test of the current package in a test binary
// built without the race detector, for a measurement the detector would
// make several times as costly, and says whether the running binary was
// built with it.
package norace

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RaceBuilt reports whether this binary was built with -race: the go
// command records it among the binary's build settings
// (cmd/go/internal/load/pkg.go, setBuildInfo: appendSetting("-race", "true")).
func RaceBuilt() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// Run, in a binary built with the race detector, runs the test named name
// of the package in the working directory (go test's, the package's own)
// with go test -race=false, which also overrides a -race in GOFLAGS, fails
// t with its output when it fails or does not run, and returns true: the
// caller returns at once. In a binary built without the detector it
// returns false, and the caller measures. The output is in t's log (go
// test -v).
//
// The inner build takes -trimpath, as the suite's other builds without
// the detector do (see Lock), so that they share the standard library's
// compilations and another clone of the repository reuses them; and no
// vet pass, because the test command's go vet reads these very files in
// the race build.
func Run(t *testing.T, name string) bool {
	t.Helper()
	if !RaceBuilt() {
		return false
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command must be in PATH to run %s without the race detector: %v", name, err)
	}
	// The binary gets what is left of this test's deadline, not go test's
	// default of 10 minutes, which three suites at once on two busy vCPUs
	// ran past; without a deadline, none.
	ctx, timeout := context.Background(), time.Duration(0)
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
		timeout = time.Until(d)
	}
	run := "^" + name + "$"
	defer Lock(t)()
	out, err := exec.CommandContext(ctx, goCmd, "test", "-race=false", "-trimpath", "-vet=off", "-count=1", "-timeout="+timeout.String(), "-v", "-run", run, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go test -race=false -run '%s': %v\n%s", run, err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("go test -race=false -run '%s' ran no %s:\n%s", run, name, out)
	}
	t.Logf("run without the race detector:\n%s", out)
	return true
}

// Lock takes the lock that the suite's go commands building without the
// race detector hold while they run (Run's, test/codecheck's build of
// staticcheck, test/deploytest's run of its envoy136 command), and returns
// its release. The go command does not share work in progress between
// processes: two that start compiling the same packages into one build
// cache each compile them all, which from empty caches cost the standard
// library's compilation once per command that builds at the same time.
// One after the other, the second links what the first compiled. The
// lock is an flock on a file in the user's cache directory (released when
// the process ends, however it ends), shared by every checkout on the
// machine.
func Lock(t testing.TB) (unlock func()) {
	t.Helper()
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	path := filepath.Join(dir, "idem-extproc-test", "build-without-race.lock")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatal(err)
	}
	return func() { f.Close() }
}

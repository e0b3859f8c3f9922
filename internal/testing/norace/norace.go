// Package norace runs one test of the current package in a test binary
// built without the race detector, for the tests whose figures the
// detector changes (allocation counts, resident memory): the suite's
// command builds with -race, and a test kept out of that build by
// //go:build !race would otherwise never run in it.
package norace

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Run runs the test named name of the package in the working directory
// (go test's, the package's own) with go test -race=false, which also
// overrides a -race in GOFLAGS, and fails t with its output when it fails
// or does not run. The output is in t's log (go test -v).
func Run(t *testing.T, name string) {
	t.Helper()
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
	out, err := exec.CommandContext(ctx, goCmd, "test", "-race=false", "-count=1", "-timeout="+timeout.String(), "-v", "-run", run, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go test -race=false -run '%s': %v\n%s", run, err, out)
	}
	if !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("go test -race=false -run '%s' ran no %s:\n%s", run, name, out)
	}
	t.Logf("run without the race detector:\n%s", out)
}

package loadtest

import (
	"bytes"
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
)

// TestMain lets the test binary stand in for idem-loadtest: the tool starts
// its servers by running its own executable with a serve-* argument.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "serve-noop", "serve-floor", "serve-idem", "log-sink":
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
			stop()
			os.Exit(code)
		}
	}
	os.Exit(m.Run())
}

// TestSmoke runs every scenario against every server for a moment: each
// server answers every request without error, the report prints its
// targets and memory sections. The figures themselves are not judged here
// (docs/performance.md has the command that measures them).
func TestSmoke(t *testing.T) {
	var out, progress bytes.Buffer
	code := Main(context.Background(), []string{
		"-duration=300ms", "-reps=1", "-slices=1", "-warmup=0", "-initial-warmup=100ms",
		"-concurrency=4", "-keys=20", "-memory-records=50", "-work-dir=" + t.TempDir(),
		// A request is judged by its answer, not its speed: a loaded
		// machine can stall a Redis call past the product's 100 ms.
		"-store-timeout=5s", "-message-timeout=10s",
	}, &out, &progress)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, progress.String(), out.String())
	}
	report := out.String()
	for _, want := range []string{"== first-write", "== replay", "== unprotected", "== targets", "completed: MEMORY USAGE"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	rows := 0
	for _, line := range strings.Split(report, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "median" {
			continue
		}
		rows++
		if errs := f[len(f)-1]; errs != "0" {
			t.Errorf("%s: %s errors", strings.Join(f[:2], " "), errs)
		}
	}
	if rows < 9 {
		t.Errorf("%d median rows, want one per scenario and server\n%s", rows, report)
	}
	if t.Failed() {
		t.Log(report)
	}
}

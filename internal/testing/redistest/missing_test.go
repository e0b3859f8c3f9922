package redistest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that notes how a helper ends the test, without
// ending this one.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Fatal(args ...any) { r.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any) { r.skip = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) SkipNow() { r.skip = "SkipNow"; runtime.Goexit() }

// TestMissingRedisServerFailsWithTheHint: with no redis-server to be found,
// a test needing one fails, never skips, and says how to install it.
func TestMissingRedisServerFailsWithTheHint(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("REDIS_SERVER", "")
	if _, err := Binary(); err == nil || err.Error() != InstallHint {
		t.Fatalf("Binary() = %v, want the install hint", err)
	}
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(r, Options{})
	}()
	<-done
	if r.skip != "" || !strings.Contains(r.fatal, "apt-get install redis-server") {
		t.Fatalf("Start without redis-server: fatal %q, skip %q", r.fatal, r.skip)
	}
}

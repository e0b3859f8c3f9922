// Package testwait is the one way tests wait for a condition another
// goroutine or process brings about: a record's state, a log line, a
// metric, a port. It polls; the bound only keeps a broken test from hanging
// and is long enough that a loaded machine never reaches it.
package testwait

import (
	"testing"
	"time"
)

// Bound is how long Until waits before it fails the test.
const Bound = 30 * time.Second

// interval is how often cond is asked.
const interval = 10 * time.Millisecond

// Until returns once cond reports true, asking it every 10 ms; after Bound
// it fails the test naming what.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, Bound)
		}
		time.Sleep(interval)
	}
}

// For is Until for a condition the test's own lines describe.
func For(t testing.TB, cond func() bool) {
	t.Helper()
	Until(t, "condition", cond)
}

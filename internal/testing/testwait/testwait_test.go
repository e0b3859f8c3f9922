package testwait

import (
	"sync/atomic"
	"testing"
)

// TestUntilAsksUntilTrue: Until returns as soon as cond holds, having asked
// it each time until then.
func TestUntilAsksUntilTrue(t *testing.T) {
	var asked atomic.Int32
	For(t, func() bool { return asked.Add(1) == 3 })
	if n := asked.Load(); n != 3 {
		t.Fatalf("cond asked %d times, want 3", n)
	}
}

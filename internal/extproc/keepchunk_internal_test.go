package extproc

import (
	"runtime"
	"testing"
)

// TestKeptBodyIsCopiedAboutOnce: a body that arrives in many chunks is
// copied about once as its buffer grows, so the buffers it outgrows, garbage
// the collector lets build up (--gc-percent), add about one body's worth of
// memory. With append's own growth (about 1.25× at a time for large slices)
// they came to four bodies' worth.
func TestKeptBodyIsCopiedAboutOnce(t *testing.T) {
	const size, chunk = 4 << 20, 1 << 10
	msg := make([]byte, chunk)
	for _, framed := range []bool{false, true} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var kept []byte
		for range size / chunk {
			kept = keepChunk(kept, msg, framed, false)
		}
		runtime.ReadMemStats(&after)
		allocated := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(kept))
		if allocated > 2.5 {
			t.Errorf("framed=%v: keeping a %d-byte body in %d-byte chunks allocated %.2f bytes per byte, want at most 2.5",
				framed, size, chunk, allocated)
		}
	}
}

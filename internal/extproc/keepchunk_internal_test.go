package extproc

import (
	"bytes"
	"runtime"
	"testing"
)

// keep keeps msg as the server does (takeRequestBody, storeResponseBytes),
// for a body that declares expect bytes, under no limit.
func keep(body, msg []byte, framed, compressed bool, expect int) []byte {
	n := len(msg)
	if framed {
		n += frameHeaderLen
	}
	return keepChunk(body, msg, framed, compressed, chunkCapacity(body, n, framed, expect, 1<<40))
}

// TestKeptBodyIsCopiedAboutOnce: a body that arrives in many chunks is
// copied about once as its buffer grows, and not at all when it declared
// its length, so the buffers it outgrows, garbage the collector lets build
// up (--gc-percent), add at most about one body's worth of memory. With
// append's own growth (about 1.25× at a time for large slices) they came
// to four bodies' worth: 5 bytes allocated per byte kept.
func TestKeptBodyIsCopiedAboutOnce(t *testing.T) {
	const size, chunk = 4 << 20, 1 << 10
	msg := make([]byte, chunk)
	for _, c := range []struct {
		framed  bool
		declare int
		most    float64
	}{{false, 0, 2.5}, {true, 0, 2.5}, {false, size, 1.1}} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var kept []byte
		for range size / chunk {
			kept = keep(kept, msg, c.framed, false, c.declare)
		}
		runtime.ReadMemStats(&after)
		allocated := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(kept))
		if allocated > c.most {
			t.Errorf("framed=%v, declared %d: keeping a %d-byte body in %d-byte chunks allocated %.2f bytes per byte, want at most %.1f",
				c.framed, c.declare, size, chunk, allocated, c.most)
		}
	}
}

// TestDeclaredLengthIsAHint: a declared length sizes the buffer, but a
// body longer than it is kept whole, one past the limit is not believed,
// and a first chunk that is the whole body is kept as it came.
func TestDeclaredLengthIsAHint(t *testing.T) {
	body := []byte("0123456789")
	if got := chunkCapacity(nil, 4, false, 10, 100); got != 10 {
		t.Errorf("a 10-byte body's first 4 bytes: capacity %d, want 10", got)
	}
	if got := chunkCapacity(nil, 4, false, 1000, 100); got != 4 {
		t.Errorf("a body declaring 1000 bytes under a limit of 100: capacity %d, want 4 (the chunk, as it came)", got)
	}
	if got := keep(nil, body, false, false, 10); &got[0] != &body[0] || cap(got) != len(body) {
		t.Error("a body whole in its first chunk was copied, or kept with room to write past it")
	}
	var kept []byte
	for i := range body {
		kept = keep(kept, body[i:i+1], false, false, 3) // declares less than it sends
	}
	if !bytes.Equal(kept, body) {
		t.Errorf("kept %q, want %q", kept, body)
	}
}

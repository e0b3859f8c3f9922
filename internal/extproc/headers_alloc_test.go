package extproc

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/norace"
)

// TestHeaderCopiesAllocateOnce: the request target's four values and a
// response's kept header values each take one allocation for all their
// values (keptHeaders one more for the slice), not one per value.
func TestHeaderCopiesAllocateOnce(t *testing.T) {
	// Under the race detector keptHeaders's strings.Builder is one
	// allocation more: -race implies -d=checkptr
	// (cmd/compile/internal/base/flag.go), under which a go:nocheckptr
	// function is never inlined (cmd/compile/internal/inline/inl.go,
	// "marked go:nocheckptr"), abi.NoEscape among them, through which the
	// Builder keeps its own address off the heap (strings/builder.go,
	// copyCheck).
	builder := 0
	if norace.RaceBuilt() {
		builder = 1
	}
	req := headerMap(hv(":authority", "api.example.com"), hv(":path", "/v1/orders"), hv(":method", "POST"),
		hv("content-type", "application/json"), hv("x-request-id", "5f0c6f1e-8a53-4d3a-9d2f-2b1d3c4e5f60"))
	var vals [len(targetHeaders)]string
	if n := testing.AllocsPerRun(100, func() { copyHeaders(req, targetHeaders[:], vals[:]) }); n != 1 {
		t.Errorf("copyHeaders: %v allocations, want 1", n)
	}
	resp := headerMap(hv(":status", "201"), hv("content-type", "application/json"), hv("location", "/v1/orders/1"))
	keep := func(n string) bool { return n != ":status" }
	var kept []idem.Header
	if n := testing.AllocsPerRun(100, func() { kept = keptHeaders(resp, keep, nil) }); n != float64(2+builder) {
		t.Errorf("keptHeaders: %v allocations, want %d", n, 2+builder)
	}
	if len(kept) != 2 {
		t.Fatalf("kept %q", kept)
	}
	var status int
	if n := testing.AllocsPerRun(100, func() {
		b, _ := headerBytes(resp, ":status")
		status = len(b)
		if isGRPCContentType(string(b)) {
			status = 0
		}
	}); n != 0 {
		t.Errorf("reading a value in place: %v allocations, want 0", n)
	}
	_ = status
}

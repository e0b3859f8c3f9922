package extprocwire

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// TestDecodeAllocations: a oneof member is allocated in one block with its
// message (and a headers message with its HeaderMap), so a body costs one
// allocation and a headers message four (the block, the headers' values
// and pointers, the one string of the message); before, the wrapper, the
// message and the HeaderMap were allocations of their own (two for a body,
// six for headers).
func TestDecodeAllocations(t *testing.T) {
	for _, c := range []struct {
		name string
		m    *extprocv3.ProcessingRequest
		want float64
	}{
		{"request body", bodyRequest(256, false), 1},
		{"response body", bodyRequest(1024, true), 1},
		{"response headers", responseHeadersRequest(), 4},
	} {
		wire := mustMarshal(c.m)
		var m extprocv3.ProcessingRequest
		got := testing.AllocsPerRun(100, func() {
			if err := unmarshalOwned(wire, &m); err != nil {
				t.Fatal(err)
			}
		})
		if got != c.want {
			t.Errorf("%s: %v allocations, want %v", c.name, got, c.want)
		}
	}
}

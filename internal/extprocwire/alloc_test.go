package extprocwire

import (
	"bytes"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// TestDecodeAllocations: a oneof member is allocated in one block with its
// message (and a headers message with its HeaderMap), so a body costs one
// allocation and a headers message four (the block, the headers' values
// and pointers, the one string of the message); before, the wrapper, the
// message and the HeaderMap were allocations of their own (two for a body,
// six for headers). The string values of a flat attributes Struct share
// one array of kinds (one allocation each before).
func TestDecodeAllocations(t *testing.T) {
	for _, c := range []struct {
		name string
		m    *extprocv3.ProcessingRequest
		want float64
	}{
		{"request body", bodyRequest(256, false), 1},
		{"response body", bodyRequest(1024, true), 1},
		{"response headers", responseHeadersRequest(), 4},
		{"request headers with attributes", typicalRequestHeaders(), 12}, // 14 before the string kinds shared an array
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

// TestSmallResponsesInOneAllocation: a reply below grpc-go's pooling
// threshold is one allocation when its bytes fit the block's own array,
// two when they do not (three before: the BufferSlice's array, the boxed
// SliceBuffer, the bytes), and of every size in between reads back as the
// message that was sent.
func TestSmallResponsesInOneAllocation(t *testing.T) {
	cont := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	c := NewCodec()
	if got := testing.AllocsPerRun(100, func() {
		data, err := c.Marshal(cont)
		if err != nil {
			t.Fatal(err)
		}
		data.Free()
	}); got != 1 {
		t.Errorf("continue reply: %v allocations, want 1", got)
	}
	for n := 0; n <= 2*smallResponseBytes+20; n++ {
		m := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Body: make([]byte, n)}}}
		data, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := data.Materialize(), mustMarshal(m); !bytes.Equal(got, want) {
			t.Fatalf("body of %d bytes: wrote %x, proto.Marshal %x", n, got, want)
		}
		if n == 2*smallResponseBytes {
			if got := testing.AllocsPerRun(100, func() { d, _ := c.Marshal(m); d.Free() }); got != 2 {
				t.Errorf("a %d-byte reply: %v allocations, want 2", n, got)
			}
		}
		data.Free()
	}
}

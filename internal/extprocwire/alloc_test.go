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

// TestCodecMarshalWritesEverySize: replies of every size around grpc-go's
// small-buffer cases read back as the message that was sent. (Putting a
// small reply's BufferSlice, SliceBuffer and bytes in one allocation was
// tried and dropped: one allocation instead of three, but twice the bytes,
// and no CPU saved in BenchmarkMarshal or the load tool.)
func TestCodecMarshalWritesEverySize(t *testing.T) {
	c := NewCodec()
	for n := 0; n <= 200; n++ {
		m := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Body: make([]byte, n)}}}
		data, err := c.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := data.Materialize(), mustMarshal(m); !bytes.Equal(got, want) {
			t.Fatalf("body of %d bytes: wrote %x, proto.Marshal %x", n, got, want)
		}
		data.Free()
	}
}

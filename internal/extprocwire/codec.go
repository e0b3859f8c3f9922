// Package extprocwire is a gRPC codec for the ext_proc server: it decodes
// ProcessingRequest and encodes ProcessingResponse by hand with protowire,
// into and from go-control-plane's own Go types, and leaves every other
// message (health, reflection, admin) to grpc-go's standard proto codec.
//
// go-control-plane's generated vtprotobuf code for these messages (SizeVT
// and the Strict marshalers such as MarshalToSizedBufferVTStrict; no
// MarshalVT, no UnmarshalVT) is compiled only under the vtprotobuf build
// tag, and a module cannot set a build tag for those who build it (go
// install module@version takes -tags from its caller only), so this package
// neither needs nor uses that code, with or without the tag.
// docs/performance.md ("gRPC codec") compares the two.
//
// Exactness is held by differential fuzz tests against proto.Unmarshal and
// proto.Marshal (codec_fuzz_test.go, their seeds in testdata run by go test):
// whatever the fast paths do not know goes to proto whole.
package extprocwire

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// Codec is a grpc-go encoding.CodecV2 named "proto", like the codec it
// stands in for.
type Codec struct {
	std encoding.CodecV2
}

// NewCodec returns the codec, falling back to the proto codec grpc-go
// registers (google.golang.org/grpc/encoding/proto).
func NewCodec() Codec {
	return Codec{std: encoding.GetCodecV2(grpcproto.Name)}
}

// ServerOption makes a gRPC server use the codec for every call
// (grpc.ForceServerCodecV2). The standard codec is registered under the
// same name, "proto", so a client's content-subtype picks nothing else.
func ServerOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(NewCodec())
}

// Name is the codec's content-subtype.
func (Codec) Name() string { return grpcproto.Name }

// Marshal encodes a ProcessingResponse by hand, anything else with the
// standard codec. The buffer follows grpc-go's encoding/proto
// codecV2.Marshal: a plain slice below mem.IsBelowBufferPoolingThreshold,
// else one from mem.DefaultBufferPool, returned to it when gRPC frees the
// BufferSlice after the write.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*extprocv3.ProcessingResponse)
	if !ok || m == nil {
		return c.std.Marshal(v)
	}
	var e encoder
	n, ok := e.response(m)
	if !ok {
		return c.std.Marshal(v)
	}
	if mem.IsBelowBufferPoolingThreshold(n) {
		b, err := e.appendResponse(make([]byte, 0, n), m)
		if err != nil {
			return c.std.Marshal(v)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(n)
	b, err := e.appendResponse((*buf)[:0], m)
	if err != nil {
		pool.Put(buf)
		return c.std.Marshal(v)
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes a ProcessingRequest by hand, anything else with the
// standard codec. The request is copied out of gRPC's buffers once
// (BufferSlice.Materialize) and its bytes and strings point into that copy;
// the standard codec copies into a pooled buffer, then copies every field
// out of it.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*extprocv3.ProcessingRequest)
	if !ok || m == nil {
		return c.std.Unmarshal(data, v)
	}
	return unmarshalOwned(data.Materialize(), m)
}

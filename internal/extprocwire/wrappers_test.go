package extprocwire

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
)

// The codec's fast paths as functions of bytes and messages, for the
// tests (the server reaches them through Codec).

// unmarshalRequest parses b into m exactly as proto.Unmarshal does (m is
// reset first; an error exactly when proto.Unmarshal errs). m keeps no
// reference to b.
func unmarshalRequest(b []byte, m *extprocv3.ProcessingRequest) error {
	return unmarshalOwned(append([]byte(nil), b...), m)
}

// marshalResponse encodes m; proto.Unmarshal reads it back proto.Equal to m,
// and its length is proto.Size(m). What the fast path does not write (unknown
// fields, typed_dynamic_metadata,
// streamed_immediate_response, a nil entry in a repeated field or a nil
// oneof member, invalid UTF-8 in a string) goes to proto.Marshal whole.
func marshalResponse(m *extprocv3.ProcessingResponse) ([]byte, error) {
	var e encoder
	n, ok := e.response(m)
	if !ok {
		return proto.Marshal(m)
	}
	b, err := e.appendResponse(make([]byte, 0, n), m)
	if err != nil {
		return proto.Marshal(m)
	}
	return b, nil
}

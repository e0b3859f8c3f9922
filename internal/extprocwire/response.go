package extprocwire

import (
	"unicode/utf8"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Field numbers are those of envoy's api/envoy/service/ext_proc/v3/
// external_processor.proto (ProcessingResponse, HeadersResponse,
// BodyResponse, TrailersResponse, CommonResponse, HeaderMutation,
// BodyMutation, ImmediateResponse, GrpcStatus), api/envoy/config/core/v3/
// base.proto (HeaderValueOption, HeaderValue, HeaderMap),
// api/envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto and
// api/envoy/type/v3/http_status.proto, as compiled into go-control-plane's
// struct tags (envoy v1.40.0 module, which also has ProcessingResponse
// fields 11 to 16 and StreamedBodyResponse). Fields are written in field-number
// order, as proto.Marshal writes them, a oneof after the other fields.

// encoder makes two passes over the same fields in the same order: the
// size pass (the methods without "append") records each nested message's
// length in pre-order, and the append pass reads them back for the length
// prefixes, so no length is computed twice. The lengths live in stack (no
// allocation for a response of up to len(stack) nested messages), then in
// more.
type encoder struct {
	stack [32]int
	n     int   // lengths recorded
	more  []int // lengths beyond stack
	next  int   // the next length the append pass reads
	err   error // from a sub-message left to proto.MarshalAppend
}

// response is the size pass over a ProcessingResponse: its encoded length,
// or false for what goes to proto.Marshal.
func (e *encoder) response(m *extprocv3.ProcessingResponse) (int, bool) {
	if !plain(m) || len(m.TypedDynamicMetadata) != 0 {
		return 0, false
	}
	n, ok := 0, true
	var s int
	if m.DynamicMetadata != nil {
		slot := e.open()
		n += e.closeMsg(slot, 8, proto.Size(m.DynamicMetadata))
	}
	if m.ModeOverride != nil {
		if s, ok = e.mode(9, m.ModeOverride); !ok {
			return 0, false
		}
		n += s
	}
	if m.OverrideMessageTimeout != nil {
		if s, ok = e.duration(10, m.OverrideMessageTimeout); !ok {
			return 0, false
		}
		n += s
	}
	//lint:ignore SA1019 a field proto.Marshal writes is written here too.
	n += sizeVarint(12, boolean(m.RequestDrain))
	if m.ServerWindowUpdate != nil {
		w := m.ServerWindowUpdate
		if !plain(w) {
			return 0, false
		}
		slot := e.open()
		n += e.closeMsg(slot, 14, sizeVarint(1, uint64(w.WindowIncrementDownstreamToSidestream))+
			sizeVarint(2, uint64(w.WindowIncrementUpstreamToSidestream)))
	}
	n += sizeVarint(15, boolean(m.RequestDrainRequests))
	n += sizeVarint(16, boolean(m.RequestDrainResponses))
	// The oneof last, where proto.Marshal writes it (internal/impl/
	// codec_message.go, makeCoderMethods: "marshal oneofs last").
	if s, ok = e.member(m); !ok {
		return 0, false
	}
	return n + s, true
}

// member is the size pass over the response oneof: its member's encoded
// length, or false for what goes to proto.Marshal.
func (e *encoder) member(m *extprocv3.ProcessingResponse) (s int, ok bool) {
	ok = true
	switch r := m.Response.(type) {
	case nil:
	case *extprocv3.ProcessingResponse_RequestHeaders:
		if r.RequestHeaders == nil {
			return 0, false
		}
		s, ok = e.common(1, r.RequestHeaders.Response, r.RequestHeaders)
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		if r.ResponseHeaders == nil {
			return 0, false
		}
		s, ok = e.common(2, r.ResponseHeaders.Response, r.ResponseHeaders)
	case *extprocv3.ProcessingResponse_RequestBody:
		if r.RequestBody == nil {
			return 0, false
		}
		s, ok = e.common(3, r.RequestBody.Response, r.RequestBody)
	case *extprocv3.ProcessingResponse_ResponseBody:
		if r.ResponseBody == nil {
			return 0, false
		}
		s, ok = e.common(4, r.ResponseBody.Response, r.ResponseBody)
	case *extprocv3.ProcessingResponse_RequestTrailers:
		if r.RequestTrailers == nil {
			return 0, false
		}
		s, ok = e.trailersResponse(5, r.RequestTrailers)
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		if r.ResponseTrailers == nil {
			return 0, false
		}
		s, ok = e.trailersResponse(6, r.ResponseTrailers)
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		if r.ImmediateResponse == nil {
			return 0, false
		}
		s, ok = e.immediate(7, r.ImmediateResponse)
	default: // streamed_immediate_response, or a nil wrapper
		return 0, false
	}
	return s, ok
}

func (e *encoder) appendResponse(b []byte, m *extprocv3.ProcessingResponse) ([]byte, error) {
	if m.DynamicMetadata != nil {
		b = e.appendStruct(b, 8, m.DynamicMetadata)
	}
	if m.ModeOverride != nil {
		b = e.appendMode(b, 9, m.ModeOverride)
	}
	if m.OverrideMessageTimeout != nil {
		b = e.appendDuration(b, 10, m.OverrideMessageTimeout)
	}
	//lint:ignore SA1019 a field proto.Marshal writes is written here too.
	b = appendVarint(b, 12, boolean(m.RequestDrain))
	if w := m.ServerWindowUpdate; w != nil {
		b = e.head(b, 14)
		b = appendVarint(b, 1, uint64(w.WindowIncrementDownstreamToSidestream))
		b = appendVarint(b, 2, uint64(w.WindowIncrementUpstreamToSidestream))
	}
	b = appendVarint(b, 15, boolean(m.RequestDrainRequests))
	b = appendVarint(b, 16, boolean(m.RequestDrainResponses))
	switch r := m.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		b = e.appendCommon(b, 1, r.RequestHeaders.Response)
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		b = e.appendCommon(b, 2, r.ResponseHeaders.Response)
	case *extprocv3.ProcessingResponse_RequestBody:
		b = e.appendCommon(b, 3, r.RequestBody.Response)
	case *extprocv3.ProcessingResponse_ResponseBody:
		b = e.appendCommon(b, 4, r.ResponseBody.Response)
	case *extprocv3.ProcessingResponse_RequestTrailers:
		b = e.appendTrailersResponse(b, 5, r.RequestTrailers)
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		b = e.appendTrailersResponse(b, 6, r.ResponseTrailers)
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		b = e.appendImmediate(b, 7, r.ImmediateResponse)
	}
	return b, e.err
}

func (e *encoder) trailersResponse(num protowire.Number, t *extprocv3.TrailersResponse) (int, bool) {
	if !plain(t) {
		return 0, false
	}
	slot := e.open()
	n := 0
	if t.HeaderMutation != nil {
		h, ok := e.headerMutation(1, t.HeaderMutation)
		if !ok {
			return 0, false
		}
		n = h
	}
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendTrailersResponse(b []byte, num protowire.Number, t *extprocv3.TrailersResponse) []byte {
	b = e.head(b, num)
	if t.HeaderMutation != nil {
		b = e.appendHeaderMutation(b, 1, t.HeaderMutation)
	}
	return b
}

func (e *encoder) immediate(num protowire.Number, ir *extprocv3.ImmediateResponse) (int, bool) {
	if !plain(ir) || !utf8.ValidString(ir.Details) {
		return 0, false
	}
	slot := e.open()
	n := 0
	if ir.Status != nil {
		s, ok := e.httpStatus(1, ir.Status)
		if !ok {
			return 0, false
		}
		n += s
	}
	if ir.Headers != nil {
		s, ok := e.headerMutation(2, ir.Headers)
		if !ok {
			return 0, false
		}
		n += s
	}
	n += sizeBytes(3, len(ir.Body))
	if ir.GrpcStatus != nil {
		if !plain(ir.GrpcStatus) {
			return 0, false
		}
		inner := e.open()
		n += e.closeMsg(inner, 4, sizeVarint(1, uint64(ir.GrpcStatus.Status)))
	}
	n += sizeBytes(5, len(ir.Details))
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendImmediate(b []byte, num protowire.Number, ir *extprocv3.ImmediateResponse) []byte {
	b = e.head(b, num)
	if ir.Status != nil {
		b = e.head(b, 1)
		b = appendVarint(b, 1, enum(int32(ir.Status.Code)))
	}
	if ir.Headers != nil {
		b = e.appendHeaderMutation(b, 2, ir.Headers)
	}
	b = appendBytes(b, 3, ir.Body)
	if ir.GrpcStatus != nil {
		b = e.head(b, 4)
		b = appendVarint(b, 1, uint64(ir.GrpcStatus.Status))
	}
	return appendString(b, 5, ir.Details)
}

func (e *encoder) httpStatus(num protowire.Number, s *typev3.HttpStatus) (int, bool) {
	if !plain(s) {
		return 0, false
	}
	slot := e.open()
	return e.closeMsg(slot, num, sizeVarint(1, enum(int32(s.Code)))), true
}

func (e *encoder) mode(num protowire.Number, m *procmodev3.ProcessingMode) (int, bool) {
	if !plain(m) {
		return 0, false
	}
	slot := e.open()
	n := sizeVarint(1, enum(int32(m.RequestHeaderMode))) + sizeVarint(2, enum(int32(m.ResponseHeaderMode))) +
		sizeVarint(3, enum(int32(m.RequestBodyMode))) + sizeVarint(4, enum(int32(m.ResponseBodyMode))) +
		sizeVarint(5, enum(int32(m.RequestTrailerMode))) + sizeVarint(6, enum(int32(m.ResponseTrailerMode)))
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendMode(b []byte, num protowire.Number, m *procmodev3.ProcessingMode) []byte {
	b = e.head(b, num)
	b = appendVarint(b, 1, enum(int32(m.RequestHeaderMode)))
	b = appendVarint(b, 2, enum(int32(m.ResponseHeaderMode)))
	b = appendVarint(b, 3, enum(int32(m.RequestBodyMode)))
	b = appendVarint(b, 4, enum(int32(m.ResponseBodyMode)))
	b = appendVarint(b, 5, enum(int32(m.RequestTrailerMode)))
	return appendVarint(b, 6, enum(int32(m.ResponseTrailerMode)))
}

// duration sizes a google.protobuf.Duration (seconds 1, nanos 2 in
// google/protobuf/duration.proto).
func (e *encoder) duration(num protowire.Number, d *durationpb.Duration) (int, bool) {
	if !plain(d) {
		return 0, false
	}
	slot := e.open()
	return e.closeMsg(slot, num, sizeVarint(1, uint64(d.Seconds))+sizeVarint(2, enum(d.Nanos))), true
}

func (e *encoder) appendDuration(b []byte, num protowire.Number, d *durationpb.Duration) []byte {
	b = e.head(b, num)
	b = appendVarint(b, 1, uint64(d.Seconds))
	return appendVarint(b, 2, enum(d.Nanos))
}

// appendStruct writes a google.protobuf.Struct through proto: sized by
// proto.Size in the size pass just before, so UseCachedSize holds (as in
// grpc-go's encoding/proto codecV2.Marshal).
func (e *encoder) appendStruct(b []byte, num protowire.Number, s *structpb.Struct) []byte {
	b = e.head(b, num)
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, s)
	if err != nil && e.err == nil {
		e.err = err
	}
	return b
}

package extprocwire

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
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
// struct tags (envoy v1.40.0 module; ProcessingResponse fields 11 to 16 and
// StreamedBodyResponse are newer than the envoy proto in the search index
// and are read from those tags only). Fields are written in field-number
// order, as proto.Marshal writes them, a oneof after the other fields.

// MarshalResponse encodes m; proto.Unmarshal reads it back proto.Equal to m,
// and its length is proto.Size(m). What the fast path does not write (unknown
// fields, typed_dynamic_metadata,
// streamed_immediate_response, a nil entry in a repeated field or a nil
// oneof member, invalid UTF-8 in a string) goes to proto.Marshal whole.
func MarshalResponse(m *extprocv3.ProcessingResponse) ([]byte, error) {
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

// open reserves the slot of a nested message's length in the size pass.
func (e *encoder) open() int {
	e.n++
	if e.n > len(e.stack) {
		e.more = append(e.more, 0)
	}
	return e.n - 1
}

// closeMsg records the nested message's content length n in its slot and
// returns the field's whole size (tag, length and content).
func (e *encoder) closeMsg(slot int, num protowire.Number, n int) int {
	if slot < len(e.stack) {
		e.stack[slot] = n
	} else {
		e.more[slot-len(e.stack)] = n
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

// head writes a nested message's tag and length in the append pass.
func (e *encoder) head(b []byte, num protowire.Number) []byte {
	var n int
	if e.next < len(e.stack) {
		n = e.stack[e.next]
	} else {
		n = e.more[e.next-len(e.stack)]
	}
	e.next++
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// plain reports that m carries no unknown fields, which only proto.Marshal
// writes back.
func plain(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) == 0 }

func sizeVarint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// enum is an enum's varint: a negative value is sign-extended to 64 bits.
func enum(v int32) uint64 { return uint64(int64(v)) }

func boolean(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

func sizeBytes(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendString(b []byte, num protowire.Number, v string) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, v)
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
	s = 0
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
	if !ok {
		return 0, false
	}
	return n + s, true
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

// common sizes a HeadersResponse or BodyResponse (outer, the same shape:
// field 1, a CommonResponse) as field num.
func (e *encoder) common(num protowire.Number, c *extprocv3.CommonResponse, outer proto.Message) (int, bool) {
	if !plain(outer) {
		return 0, false
	}
	slot := e.open()
	n := 0
	if c != nil {
		if !plain(c) {
			return 0, false
		}
		inner := e.open()
		s := sizeVarint(1, enum(int32(c.Status)))
		if c.HeaderMutation != nil {
			h, ok := e.headerMutation(2, c.HeaderMutation)
			if !ok {
				return 0, false
			}
			s += h
		}
		if c.BodyMutation != nil {
			h, ok := e.bodyMutation(3, c.BodyMutation)
			if !ok {
				return 0, false
			}
			s += h
		}
		if c.Trailers != nil {
			h, ok := e.headerMap(4, c.Trailers)
			if !ok {
				return 0, false
			}
			s += h
		}
		s += sizeVarint(5, boolean(c.ClearRouteCache))
		n = e.closeMsg(inner, 1, s)
	}
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendCommon(b []byte, num protowire.Number, c *extprocv3.CommonResponse) []byte {
	b = e.head(b, num)
	if c == nil {
		return b
	}
	b = e.head(b, 1)
	b = appendVarint(b, 1, enum(int32(c.Status)))
	if c.HeaderMutation != nil {
		b = e.appendHeaderMutation(b, 2, c.HeaderMutation)
	}
	if c.BodyMutation != nil {
		b = e.appendBodyMutation(b, 3, c.BodyMutation)
	}
	if c.Trailers != nil {
		b = e.appendHeaderMap(b, 4, c.Trailers)
	}
	return appendVarint(b, 5, boolean(c.ClearRouteCache))
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

func (e *encoder) headerMutation(num protowire.Number, h *extprocv3.HeaderMutation) (int, bool) {
	if !plain(h) {
		return 0, false
	}
	slot := e.open()
	n := 0
	for _, o := range h.SetHeaders {
		s, ok := e.headerValueOption(1, o)
		if !ok {
			return 0, false
		}
		n += s
	}
	for _, r := range h.RemoveHeaders {
		if !utf8.ValidString(r) {
			return 0, false
		}
		n += protowire.SizeTag(2) + protowire.SizeBytes(len(r)) // every element of a repeated field, empty or not
	}
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendHeaderMutation(b []byte, num protowire.Number, h *extprocv3.HeaderMutation) []byte {
	b = e.head(b, num)
	for _, o := range h.SetHeaders {
		b = e.appendHeaderValueOption(b, 1, o)
	}
	for _, r := range h.RemoveHeaders {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, r)
	}
	return b
}

func (e *encoder) headerValueOption(num protowire.Number, o *corev3.HeaderValueOption) (int, bool) {
	if o == nil || !plain(o) {
		return 0, false
	}
	slot := e.open()
	n := 0
	if o.Header != nil {
		s, ok := e.headerValue(1, o.Header)
		if !ok {
			return 0, false
		}
		n += s
	}
	// The deprecated append (a google.protobuf.BoolValue, value 1 in
	// wrappers.proto) is set on every header the server adds, since
	// Envoy's ext_proc reads it (internal/extproc reply.go, setHeader).
	//lint:ignore SA1019 the server sets it; see above.
	if a := o.Append; a != nil {
		if !plain(a) {
			return 0, false
		}
		inner := e.open()
		n += e.closeMsg(inner, 2, sizeVarint(1, boolean(a.Value)))
	}
	n += sizeVarint(3, enum(int32(o.AppendAction)))
	n += sizeVarint(4, boolean(o.KeepEmptyValue))
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendHeaderValueOption(b []byte, num protowire.Number, o *corev3.HeaderValueOption) []byte {
	b = e.head(b, num)
	if o.Header != nil {
		b = e.appendHeaderValue(b, 1, o.Header)
	}
	//lint:ignore SA1019 the server sets it (headerValueOption).
	if a := o.Append; a != nil {
		b = e.head(b, 2)
		b = appendVarint(b, 1, boolean(a.Value))
	}
	b = appendVarint(b, 3, enum(int32(o.AppendAction)))
	return appendVarint(b, 4, boolean(o.KeepEmptyValue))
}

func (e *encoder) headerValue(num protowire.Number, h *corev3.HeaderValue) (int, bool) {
	if h == nil || !plain(h) || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
		return 0, false
	}
	slot := e.open()
	return e.closeMsg(slot, num, sizeBytes(1, len(h.Key))+sizeBytes(2, len(h.Value))+sizeBytes(3, len(h.RawValue))), true
}

func (e *encoder) appendHeaderValue(b []byte, num protowire.Number, h *corev3.HeaderValue) []byte {
	b = e.head(b, num)
	b = appendString(b, 1, h.Key)
	b = appendString(b, 2, h.Value)
	return appendBytes(b, 3, h.RawValue)
}

func (e *encoder) headerMap(num protowire.Number, h *corev3.HeaderMap) (int, bool) {
	if !plain(h) {
		return 0, false
	}
	slot := e.open()
	n := 0
	for _, v := range h.Headers {
		s, ok := e.headerValue(1, v)
		if !ok {
			return 0, false
		}
		n += s
	}
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendHeaderMap(b []byte, num protowire.Number, h *corev3.HeaderMap) []byte {
	b = e.head(b, num)
	for _, v := range h.Headers {
		b = e.appendHeaderValue(b, 1, v)
	}
	return b
}

// bodyMutation sizes a BodyMutation. Its members are a oneof, so a set
// member is written even when empty or false (it has presence).
func (e *encoder) bodyMutation(num protowire.Number, bm *extprocv3.BodyMutation) (int, bool) {
	if !plain(bm) {
		return 0, false
	}
	slot := e.open()
	n := 0
	switch m := bm.Mutation.(type) {
	case nil:
	case *extprocv3.BodyMutation_Body:
		n = protowire.SizeTag(1) + protowire.SizeBytes(len(m.Body))
	case *extprocv3.BodyMutation_ClearBody:
		n = protowire.SizeTag(2) + 1
	case *extprocv3.BodyMutation_StreamedResponse:
		s, ok := e.streamedBody(3, m.StreamedResponse)
		if !ok {
			return 0, false
		}
		n = s
	default:
		return 0, false
	}
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendBodyMutation(b []byte, num protowire.Number, bm *extprocv3.BodyMutation) []byte {
	b = e.head(b, num)
	switch m := bm.Mutation.(type) {
	case *extprocv3.BodyMutation_Body:
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m.Body)
	case *extprocv3.BodyMutation_ClearBody:
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, boolean(m.ClearBody))
	case *extprocv3.BodyMutation_StreamedResponse:
		b = e.appendStreamedBody(b, 3, m.StreamedResponse)
	}
	return b
}

func (e *encoder) streamedBody(num protowire.Number, s *extprocv3.StreamedBodyResponse) (int, bool) {
	if s == nil || !plain(s) {
		return 0, false
	}
	slot := e.open()
	n := sizeBytes(1, len(s.Body)) + sizeVarint(2, boolean(s.EndOfStream)) +
		sizeVarint(3, boolean(s.EndOfStreamWithoutMessage)) + sizeVarint(4, boolean(s.GrpcMessageCompressed)) +
		sizeVarint(5, boolean(s.DrainComplete))
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendStreamedBody(b []byte, num protowire.Number, s *extprocv3.StreamedBodyResponse) []byte {
	b = e.head(b, num)
	b = appendBytes(b, 1, s.Body)
	b = appendVarint(b, 2, boolean(s.EndOfStream))
	b = appendVarint(b, 3, boolean(s.EndOfStreamWithoutMessage))
	b = appendVarint(b, 4, boolean(s.GrpcMessageCompressed))
	return appendVarint(b, 5, boolean(s.DrainComplete))
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

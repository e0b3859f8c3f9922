package extprocwire

import (
	"math"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Field numbers are those of envoy's api/envoy/service/ext_proc/v3/
// external_processor.proto (ProcessingRequest, HttpHeaders, HttpBody,
// HttpTrailers, ProtocolConfiguration) and api/envoy/config/core/v3/
// base.proto (HeaderMap, HeaderValue), as compiled into go-control-plane's
// struct tags (envoy v1.40.0 module; the flow-control messages, fields 12
// and 13, are newer than the envoy proto in the search index and are read
// from those tags only).

// UnmarshalRequest parses b into m exactly as proto.Unmarshal does (m is
// reset first; an error exactly when proto.Unmarshal errs). m keeps no
// reference to b.
func UnmarshalRequest(b []byte, m *extprocv3.ProcessingRequest) error {
	return unmarshalOwned(append([]byte(nil), b...), m)
}

// unmarshalOwned is UnmarshalRequest on bytes the caller gives away: m's
// bytes fields are sub-slices of own (capacity clipped) and its strings
// substrings of one copy of own, so a headers message costs a handful of
// allocations instead of three per header. Anything the fast path does not
// know (unknown or new fields, a wire type that does not match the field,
// invalid UTF-8, a malformed length, the deprecated group types) sends the
// whole message to proto.Unmarshal, which then decides.
func unmarshalOwned(own []byte, m *extprocv3.ProcessingRequest) error {
	m.Reset()
	d := decoder{own: own}
	if d.request(own, m) {
		return nil
	}
	return proto.Unmarshal(own, m)
}

// recursionLimit is proto.Unmarshal's depth budget. The generic decoder
// (google.golang.org/protobuf internal/impl/decode.go, unmarshalPointer,
// and codec_map.go, consumeMapOfMessage) spends one unit per message and
// one per map entry; the sub-messages handed to proto below get what is
// left at their depth, so that a deeply nested Struct fails here exactly
// when it fails there (TestDepthLimit).
const recursionLimit = protowire.DefaultRecursionLimit

type decoder struct {
	own []byte // the whole message; every bytes field is a sub-slice
	str string // own as a string, made at the first non-empty string field
	// spareMap is a HeaderMap allocated with a headers message (oneof), for
	// its headers field if the message has one.
	spareMap *corev3.HeaderMap
	// strKinds are the string kinds left for the flat Struct being decoded
	// (flatStruct), strLeft its entries not yet decoded.
	strKinds []structpb.Value_StringValue
	strLeft  int
}

// field is one parsed field: a varint's value or a length-delimited
// field's bytes (a sub-slice of the input, capacity to its end).
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	s   []byte
}

// next parses the field at the front of b, reporting false for anything
// but a valid tag with a varint, length-delimited or fixed64 value.
func next(b []byte) (f field, rest []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num > protowire.MaxValidNumber {
		return f, nil, false
	}
	b = b[n:]
	f.num, f.typ = num, typ
	switch typ {
	case protowire.VarintType:
		f.v, n = protowire.ConsumeVarint(b)
	case protowire.BytesType:
		f.s, n = protowire.ConsumeBytes(b)
	case protowire.Fixed64Type: // only Value.number_value takes one
		f.v, n = protowire.ConsumeFixed64(b)
	default:
		return f, nil, false
	}
	if n < 0 {
		return f, nil, false
	}
	return f, b[n:], true
}

func (f field) isBytes() bool  { return f.typ == protowire.BytesType }
func (f field) isVarint() bool { return f.typ == protowire.VarintType }

// bytesField is a proto3 bytes field's value: nil when empty, as the generic
// decoder leaves it, else s with its capacity clipped so that an append
// cannot run into the next field.
func bytesField(s []byte) []byte {
	if len(s) == 0 {
		return nil
	}
	return s[:len(s):len(s)]
}

// string is a proto3 string field's value: false for invalid UTF-8 (which
// proto.Unmarshal rejects in proto3 files). s must be a sub-slice of d.own
// reaching to its end of capacity, as next returns, so its offset is the
// difference of the capacities.
func (d *decoder) string(s []byte) (string, bool) {
	if !utf8.Valid(s) {
		return "", false
	}
	if len(s) == 0 {
		return "", true
	}
	if d.str == "" {
		d.str = string(d.own)
	}
	i := cap(d.own) - cap(s)
	return d.str[i : i+len(s)], true
}

func (d *decoder) request(b []byte, m *extprocv3.ProcessingRequest) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		switch {
		case f.num >= 2 && f.num <= 7 && f.isBytes():
			if !d.oneof(f, m) {
				return false
			}
		case f.num == 8 && f.isBytes():
			if m.MetadataContext == nil {
				m.MetadataContext = new(corev3.Metadata)
			}
			// config.core.v3.Metadata (maps of Struct and Any) is left to
			// proto; Merge keeps a repeated field's merge semantics. An
			// empty one, which Envoy sends on every message when it
			// forwards no namespace (source/extensions/filters/http/
			// ext_proc/ext_proc.cc, Filter::addDynamicMetadata), merges
			// nothing: proto is not called for it.
			if len(f.s) > 0 && (proto.UnmarshalOptions{Merge: true, RecursionLimit: recursionLimit - 1}).Unmarshal(f.s, m.MetadataContext) != nil {
				return false
			}
		case f.num == 9 && f.isBytes():
			if m.Attributes == nil {
				m.Attributes = make(map[string]*structpb.Struct, 1)
			}
			if !d.structEntry(f.s, m.Attributes, recursionLimit-2) {
				return false
			}
		case f.num == 10 && f.isVarint():
			m.ObservabilityMode = f.v != 0
		case f.num == 11 && f.isBytes():
			if m.ProtocolConfig == nil {
				m.ProtocolConfig = new(extprocv3.ProtocolConfiguration)
			}
			if !protocolConfig(f.s, m.ProtocolConfig) {
				return false
			}
		case f.num == 12 && f.isBytes():
			if m.FlowControlInit == nil {
				m.FlowControlInit = new(extprocv3.ProcessingRequest_FlowControlInit)
			}
			if !flowControlInit(f.s, m.FlowControlInit) {
				return false
			}
		case f.num == 13 && f.isBytes():
			if m.ClientWindowUpdate == nil {
				m.ClientWindowUpdate = new(extprocv3.ProcessingRequest_ClientWindowUpdate)
			}
			if !clientWindowUpdate(f.s, m.ClientWindowUpdate) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// oneof decodes one member of the request oneof. As in the generic decoder
// (internal/impl/codec_field.go, initOneofFieldCoders), a member that is
// already set merges the new bytes into its message; another member
// replaces it. A new member is allocated in one block with its message
// (and a headers message with the HeaderMap it will likely hold, handed to
// headers through spareMap): one allocation instead of two or three.
func (d *decoder) oneof(f field, m *extprocv3.ProcessingRequest) bool {
	switch f.num {
	case 2:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_RequestHeaders)
		if w == nil {
			all := new(struct {
				w  extprocv3.ProcessingRequest_RequestHeaders
				h  extprocv3.HttpHeaders
				hm corev3.HeaderMap
			})
			w = &all.w
			w.RequestHeaders, d.spareMap = &all.h, &all.hm
		}
		if w.RequestHeaders == nil {
			w.RequestHeaders = new(extprocv3.HttpHeaders)
		}
		m.Request = w
		return d.headers(f.s, w.RequestHeaders)
	case 3:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_ResponseHeaders)
		if w == nil {
			all := new(struct {
				w  extprocv3.ProcessingRequest_ResponseHeaders
				h  extprocv3.HttpHeaders
				hm corev3.HeaderMap
			})
			w = &all.w
			w.ResponseHeaders, d.spareMap = &all.h, &all.hm
		}
		if w.ResponseHeaders == nil {
			w.ResponseHeaders = new(extprocv3.HttpHeaders)
		}
		m.Request = w
		return d.headers(f.s, w.ResponseHeaders)
	case 4:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_RequestBody)
		if w == nil {
			both := new(struct {
				w extprocv3.ProcessingRequest_RequestBody
				b extprocv3.HttpBody
			})
			w = &both.w
			w.RequestBody = &both.b
		}
		if w.RequestBody == nil {
			w.RequestBody = new(extprocv3.HttpBody)
		}
		m.Request = w
		return body(f.s, w.RequestBody)
	case 5:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_ResponseBody)
		if w == nil {
			both := new(struct {
				w extprocv3.ProcessingRequest_ResponseBody
				b extprocv3.HttpBody
			})
			w = &both.w
			w.ResponseBody = &both.b
		}
		if w.ResponseBody == nil {
			w.ResponseBody = new(extprocv3.HttpBody)
		}
		m.Request = w
		return body(f.s, w.ResponseBody)
	case 6:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_RequestTrailers)
		if w == nil {
			w = new(extprocv3.ProcessingRequest_RequestTrailers)
		}
		if w.RequestTrailers == nil {
			w.RequestTrailers = new(extprocv3.HttpTrailers)
		}
		m.Request = w
		return d.trailers(f.s, w.RequestTrailers)
	case 7:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_ResponseTrailers)
		if w == nil {
			w = new(extprocv3.ProcessingRequest_ResponseTrailers)
		}
		if w.ResponseTrailers == nil {
			w.ResponseTrailers = new(extprocv3.HttpTrailers)
		}
		m.Request = w
		return d.trailers(f.s, w.ResponseTrailers)
	}
	return false
}

func (d *decoder) headers(b []byte, h *extprocv3.HttpHeaders) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		switch {
		case f.num == 1 && f.isBytes():
			if h.Headers == nil {
				h.Headers, d.spareMap = d.spareMap, nil
			}
			if h.Headers == nil {
				h.Headers = new(corev3.HeaderMap)
			}
			if !d.headerMap(f.s, h.Headers) {
				return false
			}
		case f.num == 2 && f.isBytes(): // deprecated, still read by internal/extproc for older Envoys
			//lint:ignore SA1019 a field proto.Unmarshal reads is read here too.
			if h.Attributes == nil {
				//lint:ignore SA1019 as above.
				h.Attributes = make(map[string]*structpb.Struct, 1)
			}
			//lint:ignore SA1019 as above.
			if !d.structEntry(f.s, h.Attributes, recursionLimit-3) {
				return false
			}
		case f.num == 3 && f.isVarint():
			h.EndOfStream = f.v != 0
		default:
			return false
		}
	}
	return true
}

func (d *decoder) trailers(b []byte, t *extprocv3.HttpTrailers) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok || f.num != 1 || !f.isBytes() {
			return false
		}
		b = rest
		if t.Trailers == nil {
			t.Trailers = new(corev3.HeaderMap)
		}
		if !d.headerMap(f.s, t.Trailers) {
			return false
		}
	}
	return true
}

// headerMap appends b's headers to hm.Headers (a repeated field appends on
// merge), all of them in one backing array counted first.
func (d *decoder) headerMap(b []byte, hm *corev3.HeaderMap) bool {
	n := 0
	for p := b; len(p) > 0; {
		f, rest, ok := next(p)
		if !ok || f.num != 1 || !f.isBytes() {
			return false
		}
		p = rest
		n++
	}
	if n == 0 {
		return true
	}
	vals := make([]corev3.HeaderValue, n)
	if hm.Headers == nil {
		hm.Headers = make([]*corev3.HeaderValue, 0, n)
	}
	for i := range vals {
		f, rest, _ := next(b)
		b = rest
		if !d.headerValue(f.s, &vals[i]) {
			return false
		}
		hm.Headers = append(hm.Headers, &vals[i])
	}
	return true
}

// headerValue decodes key (1), value (2) and raw_value (3); a repeated
// scalar field keeps its last value.
func (d *decoder) headerValue(b []byte, hv *corev3.HeaderValue) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok || !f.isBytes() {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			if hv.Key, ok = d.string(f.s); !ok {
				return false
			}
		case 2:
			if hv.Value, ok = d.string(f.s); !ok {
				return false
			}
		case 3:
			hv.RawValue = bytesField(f.s)
		default:
			return false
		}
	}
	return true
}

func body(b []byte, hb *extprocv3.HttpBody) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok {
			return false
		}
		b = rest
		switch {
		case f.num == 1 && f.isBytes():
			hb.Body = bytesField(f.s)
		case f.num == 2 && f.isVarint():
			hb.EndOfStream = f.v != 0
		case f.num == 3 && f.isVarint():
			hb.EndOfStreamWithoutMessage = f.v != 0
		case f.num == 4 && f.isVarint():
			hb.GrpcMessageCompressed = f.v != 0
		case f.num == 5 && f.isVarint():
			hb.DrainComplete = f.v != 0
		default:
			return false
		}
	}
	return true
}

// structEntry decodes one map<string, google.protobuf.Struct> entry into
// into. As in the generic decoder (codec_map.go, consumeMapOfMessage) an
// entry's missing key is "", its missing value an empty Struct, a value
// given twice in one entry merges, and a later entry for the same key
// replaces the earlier one. A flat Struct (flatStruct), the shape of
// Envoy's attributes, is decoded here; any other is left to proto, with
// the depth budget left at the entry (limit).
func (d *decoder) structEntry(b []byte, into map[string]*structpb.Struct, limit int) bool {
	var key string
	val := new(structpb.Struct)
	seen := false
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok || !f.isBytes() {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			if key, ok = d.string(f.s); !ok {
				return false
			}
		case 2:
			if !seen && d.flatStruct(f.s, val) {
				seen = true
				continue
			}
			if !seen {
				val.Reset() // what flatStruct filled before it gave up
			}
			seen = true
			if (proto.UnmarshalOptions{Merge: true, RecursionLimit: limit}).Unmarshal(f.s, val) != nil {
				return false
			}
		default:
			return false
		}
	}
	into[key] = val
	return true
}

func protocolConfig(b []byte, pc *extprocv3.ProtocolConfiguration) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok || !f.isVarint() {
			return false
		}
		b = rest
		switch f.num {
		case 1: // an open enum keeps any value, truncated to int32 as the generic decoder does
			pc.RequestBodyMode = bodySendMode(f.v)
		case 2:
			pc.ResponseBodyMode = bodySendMode(f.v)
		case 3:
			pc.SendBodyWithoutWaitingForHeaderResponse = f.v != 0
		default:
			return false
		}
	}
	return true
}

func flowControlInit(b []byte, fc *extprocv3.ProcessingRequest_FlowControlInit) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok || !f.isVarint() {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			fc.InitialWindowDownstreamToSidestream = int64(f.v)
		case 2:
			fc.InitialWindowSidestreamToUpstream = int64(f.v)
		case 3:
			fc.InitialWindowUpstreamToSidestream = int64(f.v)
		case 4:
			fc.InitialWindowSidestreamToDownstream = int64(f.v)
		default:
			return false
		}
	}
	return true
}

func clientWindowUpdate(b []byte, cw *extprocv3.ProcessingRequest_ClientWindowUpdate) bool {
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok || !f.isVarint() {
			return false
		}
		b = rest
		switch f.num {
		case 1:
			cw.WindowIncrementSidestreamToUpstream = int64(f.v)
		case 2:
			cw.WindowIncrementSidestreamToDownstream = int64(f.v)
		default:
			return false
		}
	}
	return true
}

// bodySendMode is an open enum's value as the generic decoder keeps it: any
// number, truncated to int32.
func bodySendMode(v uint64) procmodev3.ProcessingMode_BodySendMode {
	return procmodev3.ProcessingMode_BodySendMode(int32(v))
}

// flatStruct decodes the Struct Envoy sends as attributes
// (google/protobuf/struct.proto: Struct.fields 1, a map of Value; Value's
// kind a oneof of null_value 1, number_value 2, string_value 3, bool_value
// 4, struct_value 5, list_value 6) when every value is a scalar set once:
// the Values share one array and the strings are substrings of the
// message. Anything else (a nested Struct or list, a Value or map entry
// with a field twice, an unknown field) reports false for proto to decode.
func (d *decoder) flatStruct(b []byte, s *structpb.Struct) bool {
	n := 0
	for p := b; len(p) > 0; n++ {
		f, rest, ok := next(p)
		if !ok || f.num != 1 || !f.isBytes() {
			return false
		}
		p = rest
	}
	if n == 0 {
		return true
	}
	vals := make([]structpb.Value, n)
	s.Fields = make(map[string]*structpb.Value, n)
	d.strKinds = nil // this Struct's string kinds share one array, made at the first
	for i := range vals {
		f, rest, _ := next(b)
		b = rest
		d.strLeft = n - i
		key, ok := d.flatEntry(f.s, &vals[i])
		if !ok {
			return false
		}
		s.Fields[key] = &vals[i] // a later entry for the same key replaces it, as in proto
	}
	return true
}

// flatEntry decodes one map<string, Value> entry holding its key and its
// value at most once each (a missing key is "", a missing value an empty
// Value, as in proto).
func (d *decoder) flatEntry(b []byte, v *structpb.Value) (string, bool) {
	var key string
	var haveKey, haveValue bool
	for len(b) > 0 {
		f, rest, ok := next(b)
		if !ok || !f.isBytes() {
			return "", false
		}
		b = rest
		switch {
		case f.num == 1 && !haveKey:
			haveKey = true
			if key, ok = d.string(f.s); !ok {
				return "", false
			}
		case f.num == 2 && !haveValue:
			haveValue = true
			if !d.flatValue(f.s, v) {
				return "", false
			}
		default:
			return "", false
		}
	}
	return key, true
}

// flatValue decodes a Value with at most one field, a scalar kind.
func (d *decoder) flatValue(b []byte, v *structpb.Value) bool {
	if len(b) == 0 {
		return true
	}
	f, rest, ok := next(b)
	if !ok || len(rest) != 0 {
		return false
	}
	switch {
	case f.num == 1 && f.isVarint(): // an open enum, truncated to int32 as in proto
		v.Kind = &structpb.Value_NullValue{NullValue: structpb.NullValue(int32(f.v))}
	case f.num == 2 && f.typ == protowire.Fixed64Type:
		v.Kind = &structpb.Value_NumberValue{NumberValue: math.Float64frombits(f.v)}
	case f.num == 3 && f.isBytes():
		str, ok := d.string(f.s)
		if !ok {
			return false
		}
		if len(d.strKinds) == 0 {
			// room for the string values among this Struct's entries yet
			// to decode: one allocation instead of one per value
			d.strKinds = make([]structpb.Value_StringValue, max(d.strLeft, 1))
		}
		k := &d.strKinds[0]
		d.strKinds = d.strKinds[1:]
		k.StringValue = str
		v.Kind = k
	case f.num == 4 && f.isVarint():
		v.Kind = &structpb.Value_BoolValue{BoolValue: f.v != 0}
	default:
		return false
	}
	return true
}

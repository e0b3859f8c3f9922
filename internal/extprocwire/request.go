package extprocwire

import (
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
// struct tags (envoy v1.40.0 module, which also has the flow-control
// messages, fields 12 and 13).

// unmarshalOwned is unmarshalRequest on bytes the caller gives away: m's
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
		f, rest := next(b)
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
		w = withHeaders(d, w, func(w *extprocv3.ProcessingRequest_RequestHeaders) **extprocv3.HttpHeaders { return &w.RequestHeaders })
		m.Request = w
		return d.headers(f.s, w.RequestHeaders)
	case 3:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_ResponseHeaders)
		w = withHeaders(d, w, func(w *extprocv3.ProcessingRequest_ResponseHeaders) **extprocv3.HttpHeaders {
			return &w.ResponseHeaders
		})
		m.Request = w
		return d.headers(f.s, w.ResponseHeaders)
	case 4:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_RequestBody)
		w = withMessage(w, func(w *extprocv3.ProcessingRequest_RequestBody) **extprocv3.HttpBody { return &w.RequestBody })
		m.Request = w
		return body(f.s, w.RequestBody)
	case 5:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_ResponseBody)
		w = withMessage(w, func(w *extprocv3.ProcessingRequest_ResponseBody) **extprocv3.HttpBody { return &w.ResponseBody })
		m.Request = w
		return body(f.s, w.ResponseBody)
	case 6:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_RequestTrailers)
		w = withMessage(w, func(w *extprocv3.ProcessingRequest_RequestTrailers) **extprocv3.HttpTrailers {
			return &w.RequestTrailers
		})
		m.Request = w
		return d.trailers(f.s, w.RequestTrailers)
	case 7:
		w, _ := m.Request.(*extprocv3.ProcessingRequest_ResponseTrailers)
		w = withMessage(w, func(w *extprocv3.ProcessingRequest_ResponseTrailers) **extprocv3.HttpTrailers {
			return &w.ResponseTrailers
		})
		m.Request = w
		return d.trailers(f.s, w.ResponseTrailers)
	}
	return false
}

// withHeaders is withMessage for a headers member, whose block holds the
// HeaderMap its message will likely hold too, left in d.spareMap.
func withHeaders[W any](d *decoder, w *W, msg func(*W) **extprocv3.HttpHeaders) *W {
	if w == nil {
		all := new(struct {
			w  W
			h  extprocv3.HttpHeaders
			hm corev3.HeaderMap
		})
		w = &all.w
		*msg(w), d.spareMap = &all.h, &all.hm
	}
	return withMessage(w, msg)
}

// withMessage returns the oneof member w with its message, the field msg
// points to, set: for no member, a new one allocated in one block with its
// message.
func withMessage[W, M any](w *W, msg func(*W) **M) *W {
	if w == nil {
		both := new(struct {
			w W
			m M
		})
		w = &both.w
		*msg(w) = &both.m
	}
	if m := msg(w); *m == nil {
		*m = new(M)
	}
	return w
}

func protocolConfig(b []byte, pc *extprocv3.ProtocolConfiguration) bool {
	return varints(b, func(num protowire.Number, v uint64) bool {
		switch num {
		case 1: // an open enum keeps any value, truncated to int32 as the generic decoder does
			pc.RequestBodyMode = bodySendMode(v)
		case 2:
			pc.ResponseBodyMode = bodySendMode(v)
		case 3:
			pc.SendBodyWithoutWaitingForHeaderResponse = v != 0
		default:
			return false
		}
		return true
	})
}

func flowControlInit(b []byte, fc *extprocv3.ProcessingRequest_FlowControlInit) bool {
	return int64s(b, &fc.InitialWindowDownstreamToSidestream, &fc.InitialWindowSidestreamToUpstream,
		&fc.InitialWindowUpstreamToSidestream, &fc.InitialWindowSidestreamToDownstream)
}

func clientWindowUpdate(b []byte, cw *extprocv3.ProcessingRequest_ClientWindowUpdate) bool {
	return int64s(b, &cw.WindowIncrementSidestreamToUpstream, &cw.WindowIncrementSidestreamToDownstream)
}

// bodySendMode is an open enum's value as the generic decoder keeps it: any
// number, truncated to int32.
func bodySendMode(v uint64) procmodev3.ProcessingMode_BodySendMode {
	return procmodev3.ProcessingMode_BodySendMode(int32(v))
}

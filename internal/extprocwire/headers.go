package extprocwire

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The headers family: HttpHeaders, HttpTrailers, HeaderMap and HeaderValue
// read from a request, and the HeadersResponse and BodyResponse common part
// (CommonResponse, HeaderMutation, HeaderValueOption) written in a response.
// Field numbers as in request.go and response.go.

func (d *decoder) headers(b []byte, h *extprocv3.HttpHeaders) bool {
	for len(b) > 0 {
		f, rest := next(b)
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
		f, rest := next(b)
		if f.num != 1 || !f.isBytes() {
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
	n, ok := repeated(b, 1)
	if !ok || n == 0 {
		return ok
	}
	vals := make([]corev3.HeaderValue, n)
	if hm.Headers == nil {
		hm.Headers = make([]*corev3.HeaderValue, 0, n)
	}
	for i := range vals {
		f, rest := next(b)
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
		f, rest := next(b)
		b = rest
		var ok bool
		switch {
		case f.num == 1 && f.isBytes():
			hv.Key, ok = d.string(f.s)
		case f.num == 2 && f.isBytes():
			hv.Value, ok = d.string(f.s)
		case f.num == 3 && f.isBytes():
			hv.RawValue, ok = bytesField(f.s), true
		}
		if !ok {
			return false
		}
	}
	return true
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

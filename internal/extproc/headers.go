package extproc

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// attributesKey is the key under which Envoy's ext_proc filter puts the
// attributes it was asked to send (ext_proc.cc, the filter's name).
const attributesKey = "envoy.filters.http.ext_proc"

// headerValue returns a header's value. Current Envoy sends raw_value bytes
// and leaves value empty; older versions and other clients send value.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// headerList converts a HeaderMap, keeping order and repeated names. Envoy
// already sends names in lower case.
func headerList(m *corev3.HeaderMap) []idem.Header {
	hs := m.GetHeaders()
	out := make([]idem.Header, 0, len(hs))
	for _, h := range hs {
		out = append(out, idem.Header{Name: h.GetKey(), Value: headerValue(h)})
	}
	return out
}

// findHeader returns the first value of name in m and whether it was
// present. A request's headers are read this way, one name at a time, so
// that only the values the server uses are copied out of the message.
func findHeader(m *corev3.HeaderMap, name string) (string, bool) {
	for _, h := range m.GetHeaders() {
		if h.GetKey() == name {
			return headerValue(h), true
		}
	}
	return "", false
}

// countHeader returns how many field lines named name m holds. Envoy sends
// each line of a repeated header as its own HeaderValue: its header map
// joins repeated lines only for the inline headers it knows
// (source/common/http/header_map_impl.cc HeaderMapImpl::insertByKey, which
// appends to an existing entry only after a static lookup hit), and
// MutationUtils::headersToProto (ext_proc/mutation_utils.cc) adds one
// HeaderValue per entry it iterates.
func countHeader(m *corev3.HeaderMap, name string) int {
	n := 0
	for _, h := range m.GetHeaders() {
		if h.GetKey() == name {
			n++
		}
	}
	return n
}

// keptHeaders appends to into the headers of m whose names keep accepts,
// in order: a response's headers are copied only when the record will
// keep them.
func keptHeaders(m *corev3.HeaderMap, keep func(name string) bool, into []idem.Header) []idem.Header {
	for _, h := range m.GetHeaders() {
		if keep(h.GetKey()) {
			into = append(into, idem.Header{Name: h.GetKey(), Value: headerValue(h)})
		}
	}
	return into
}

// selectHeaders converts the headers of m named in names (few, see
// policy.Policy.FingerprintHeaders), keeping their order and repeats: what
// a request's fingerprint reads of its headers.
func selectHeaders(m *corev3.HeaderMap, names []string) []idem.Header {
	var out []idem.Header
	for _, h := range m.GetHeaders() {
		for _, n := range names {
			if h.GetKey() == n {
				out = append(out, idem.Header{Name: n, Value: headerValue(h)})
				break
			}
		}
	}
	return out
}

// firstHeader returns the first value of name and whether it was present.
func firstHeader(hs []idem.Header, name string) (string, bool) {
	for _, h := range hs {
		if h.Name == name {
			return h.Value, true
		}
	}
	return "", false
}

// attributes returns the attribute struct Envoy sent with a message: in
// ProcessingRequest.attributes (current), or in the deprecated
// HttpHeaders.attributes (older versions).
func attributes(req *extprocv3.ProcessingRequest) *structpb.Struct {
	if a := req.GetAttributes()[attributesKey]; a != nil {
		return a
	}
	var hh *extprocv3.HttpHeaders
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		hh = r.RequestHeaders
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		hh = r.ResponseHeaders
	}
	//lint:ignore SA1019 older Envoys sent attributes here; still read for them.
	return hh.GetAttributes()[attributesKey]
}

// attrString reads one attribute as a string. Envoy encodes CEL values as
// protobuf Values: strings as strings, integers (response.flags is a bit
// vector) as numbers.
func attrString(a *structpb.Struct, name string) string {
	return valueString(a.GetFields()[name])
}

// attrUint reads a numeric attribute such as response.flags; 0 if absent.
func attrUint(a *structpb.Struct, name string) uint64 {
	n := a.GetFields()[name].GetNumberValue()
	if n <= 0 {
		return 0
	}
	return uint64(n)
}

func valueString(v *structpb.Value) string {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue
	case *structpb.Value_NumberValue:
		return strconv.FormatFloat(k.NumberValue, 'f', -1, 64)
	case *structpb.Value_BoolValue:
		return strconv.FormatBool(k.BoolValue)
	}
	return ""
}

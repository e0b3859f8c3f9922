package extproc

import (
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// attributesKey is the key under which Envoy's ext_proc filter puts the
// attributes it was asked to send (ext_proc.cc, the filter's name).
const attributesKey = "envoy.filters.http.ext_proc"

// headerList converts a HeaderMap, keeping order and repeated names. Envoy
// already sends names in lower case.
func headerList(m *corev3.HeaderMap) []idem.Header {
	return keptHeaders(m, func(string) bool { return true }, nil)
}

// headerBytes returns the first value of name in m and whether it was
// present, without copying it out of the message: for a value only read
// (compared, parsed) while the message is at hand, never kept.
func headerBytes(m *corev3.HeaderMap, name string) ([]byte, bool) {
	for _, h := range m.GetHeaders() {
		if h.GetKey() == name {
			return headerValue(h), true
		}
	}
	return nil, false
}

// copyHeaders sets vals[i] to the first value of names[i] in m, all
// copied out of the message into one string (keptHeaders: one allocation
// for all the values a request's headers phase keeps, instead of one
// each), and returns which were present, bit i for names[i]. At most 8
// names, and 8 lines of them before a second allocation.
func copyHeaders(m *corev3.HeaderMap, names []string, vals []string) (present uint8) {
	var few [8]idem.Header
	for _, h := range keptHeaders(m, func(n string) bool { return slices.Contains(names, n) }, few[:0]) {
		if i := slices.Index(names, h.Name); present&(1<<i) == 0 {
			present |= 1 << i
			vals[i] = h.Value
		}
	}
	return present
}

// keptHeaders appends to into the headers of m whose names keep accepts,
// in order: a response's headers are copied only when the record will
// keep them, and their values into one string (one allocation, not one
// per header).
func keptHeaders(m *corev3.HeaderMap, keep func(name string) bool, into []idem.Header) []idem.Header {
	hs := m.GetHeaders()
	// at holds the kept lines' indexes, then where each value ends in the
	// one string they are copied into: keep is asked once per line.
	var few [16]int
	at, total := few[:0], 0
	for i, h := range hs {
		if keep(h.GetKey()) {
			at = append(at, i)
			total += len(h.GetRawValue()) + len(h.GetValue())
		}
	}
	into = slices.Grow(into, len(at))
	var b strings.Builder
	b.Grow(total)
	first := len(into)
	for j, i := range at {
		b.Write(headerValue(hs[i]))
		at[j] = b.Len()
		into = append(into, idem.Header{Name: hs[i].GetKey()})
	}
	all, start := b.String(), 0
	for j, end := range at {
		into[first+j].Value, start = all[start:end], end
	}
	return into
}

// headerValue is h's value: raw_value, else value, which current Envoy
// does not send (envoyFacts.Header).
func headerValue(h *corev3.HeaderValue) []byte {
	if raw := h.GetRawValue(); len(raw) > 0 {
		return raw
	}
	return []byte(h.GetValue())
}

// attrString reads one attribute as a string. Envoy encodes CEL values as
// protobuf Values: strings as strings, integers (response.flags is a bit
// vector) as numbers.
func attrString(a *structpb.Struct, name string) string {
	return valueString(a.GetFields()[name])
}

// attrUint reads a numeric attribute such as response.flags; 0 if absent.
func attrUint(a *structpb.Struct, name string) uint64 {
	return uint64(max(a.GetFields()[name].GetNumberValue(), 0))
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

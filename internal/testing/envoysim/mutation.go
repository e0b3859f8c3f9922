package envoysim

import (
	"fmt"
	"strings"

	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// checkResult is the mutation checker's verdict
// (filters/common/mutation_rules).
type checkResult uint8

const (
	checkOK checkResult = iota
	checkIgnore
	checkFail
)

// check applies HeaderMutationRules as Envoy's default checker does: the
// routing headers (host, :authority, :method, :scheme) need
// allow_all_routing, x-envoy-* needs allow_envoy, disallow_system forbids
// every ":" header, and a denied change is ignored unless disallow_is_error.
func check(rules *mutationrulesv3.HeaderMutationRules, name string, remove bool) checkResult {
	denied := checkIgnore
	if rules.GetDisallowIsError().GetValue() {
		denied = checkFail
	}
	if rules.GetDisallowAll().GetValue() {
		return denied
	}
	if remove && (strings.HasPrefix(name, ":") || name == "host") {
		return checkIgnore // system headers are never removed
	}
	switch {
	case name == "host" || name == ":authority" || name == ":method" || name == ":scheme":
		if !rules.GetAllowAllRouting().GetValue() {
			return denied
		}
	case strings.HasPrefix(name, "x-envoy-"):
		if !rules.GetAllowEnvoy().GetValue() {
			return denied
		}
	case strings.HasPrefix(name, ":"):
		if rules.GetDisallowSystem().GetValue() {
			return denied
		}
	}
	return checkOK
}

// envoyStatus is an error whose text is the absl::Status message Envoy
// gives the same failure, spelt as Envoy spells it.
type envoyStatus string

func (e envoyStatus) Error() string { return string(e) }

var errBothValues error = envoyStatus("Only one of value or raw_value in the HeaderValue message should be set.")

// Envoy's header map limits: the connection manager's max_headers_count and
// max_request_headers_kb defaults (Http::DEFAULT_MAX_HEADERS_COUNT 100,
// DEFAULT_MAX_REQUEST_HEADERS_KB 60; the fixture of ext_proc's
// mutation_utils_test.cc TestHeaderMapImplWithOverrides uses them).
const (
	DefaultMaxHeadersCount = 100
	DefaultMaxHeadersKB    = 60
)

// headerLimits are the limits of the header map a mutation applies to.
type headerLimits struct{ count, kb int }

// byteSize is HeaderMap::byteSize(): the bytes of every key and value,
// pseudo-headers included.
func byteSize(hs []Header) int {
	n := 0
	for _, h := range hs {
		n += len(h.Name) + len(h.Value)
	}
	return n
}

// applyMutation applies a HeaderMutation as the filter does, with its
// configured rules and limits.
func (x *exchange) applyMutation(hs []Header, m *extprocv3.HeaderMutation) ([]Header, error) {
	return applyMutation(hs, m, x.f.cfg.GetMutationRules(), headerLimits{x.f.opts.MaxHeadersCount, x.f.opts.MaxHeadersKB})
}

// applyMutation applies a HeaderMutation to hs as
// MutationUtils::applyHeaderMutations (ext_proc/mutation_utils.cc) does, in
// its order:
//  1. responseHeaderSizeCheck: more remove_headers or set_headers than the
//     map's max header count rejects the whole mutation before any change;
//  2. removals, each name checked by headerNameIsValid;
//  3. sets: value and raw_value both set is an error; raw_value is the value
//     (runtime send_header_raw_value); a name that is not an RFC 9110 token
//     or a value with a control character other than HTAB (or DEL) is an
//     error (HeaderUtility::headerNameIsValid / headerValueIsValid); only
//     the deprecated BoolValue append counts (false overwrites): the
//     append_action field is not read;
//  4. headerMutationResultCheck: a result over the map's count or size limit
//     is an error, after the changes were made.
//
// The error texts are Envoy's (they become the local reply's details). An
// error stops the walk where it happened; what was applied stays in the
// returned headers (the caller decides whether that matters: a CONTINUE
// reply fails the request, an immediate response goes out as it is).
func applyMutation(hs []Header, m *extprocv3.HeaderMutation, rules *mutationrulesv3.HeaderMutationRules, lim headerLimits) ([]Header, error) {
	if lim.count <= 0 {
		lim.count = DefaultMaxHeadersCount
	}
	if lim.kb <= 0 {
		lim.kb = DefaultMaxHeadersKB
	}
	if len(m.GetRemoveHeaders()) > lim.count || len(m.GetSetHeaders()) > lim.count {
		return hs, envoyStatus(fmt.Sprintf("Header mutation remove header count %d or set header count %d exceed the HCM header countlimit %d",
			len(m.GetRemoveHeaders()), len(m.GetSetHeaders()), lim.count))
	}
	for _, name := range m.GetRemoveHeaders() {
		if !validHeaderName(name) {
			return hs, envoyStatus("Invalid character in remove_headers mutation.")
		}
		name = strings.ToLower(name)
		switch check(rules, name, true) {
		case checkFail:
			return hs, envoyStatus(fmt.Sprintf("Invalid attempt to remove %s", name))
		case checkOK:
			hs = remove(hs, name)
		}
	}
	for _, sh := range m.GetSetHeaders() {
		h := sh.GetHeader()
		if h == nil {
			continue
		}
		if h.GetValue() != "" && len(h.GetRawValue()) > 0 {
			return hs, errBothValues
		}
		value := string(h.GetRawValue())
		if !validHeaderName(h.GetKey()) || !validHeaderValue(value) {
			return hs, envoyStatus("Invalid character in set_headers mutation.")
		}
		name := strings.ToLower(h.GetKey())
		switch check(rules, name, false) {
		case checkFail:
			return hs, envoyStatus(fmt.Sprintf("Invalid attempt to modify %s", name))
		case checkIgnore:
			continue
		}
		//lint:ignore SA1019 Envoy's ext_proc reads the deprecated append field, and only it.
		if !sh.GetAppend().GetValue() {
			hs = remove(hs, name)
		}
		hs = append(hs, Header{Name: name, Value: value})
	}
	if byteSize(hs) > lim.kb*1024 || len(hs) > lim.count {
		return hs, envoyStatus(fmt.Sprintf("Header mutation causes end result header count %d or header size %d bytes, exceeding the count limit %d or the size limit %d kilobytes",
			len(hs), byteSize(hs), lim.count, lim.kb))
	}
	return hs, nil
}

// validHeaderName is HeaderUtility::headerNameIsValid: a pseudo-header
// name, or a non-empty RFC 9110 token in any case (upper case is allowed
// for names set by filters).
func validHeaderName(name string) bool {
	name = strings.TrimPrefix(name, ":")
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// validHeaderValue is HeaderUtility::headerValueIsValid, nghttp2's
// nghttp2_check_header_value: HTAB, visible ASCII, space and bytes 0x80 and
// up; every other control character, and DEL, is refused.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c != '\t' && (c < 0x20 || c == 0x7f) {
			return false
		}
	}
	return true
}

func remove(hs []Header, name string) []Header {
	out := hs[:0:0]
	for _, h := range hs {
		if h.Name != name {
			out = append(out, h)
		}
	}
	return out
}

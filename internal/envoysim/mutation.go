package envoysim

import (
	"errors"
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

var errBothValues = errors.New("only one of value or raw_value in the HeaderValue message should be set")

// applyMutation applies a HeaderMutation to hs as
// MutationUtils::applyHeaderMutations does: removals first, then sets;
// raw_value is the value (value alone yields an empty header); append_action
// when non-zero, else the BoolValue append (false overwrites).
func applyMutation(hs []Header, m *extprocv3.HeaderMutation, rules *mutationrulesv3.HeaderMutationRules) ([]Header, error) {
	for _, name := range m.GetRemoveHeaders() {
		name = strings.ToLower(name)
		switch check(rules, name, true) {
		case checkFail:
			return hs, fmt.Errorf("invalid attempt to remove %s", name)
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
		name, value := strings.ToLower(h.GetKey()), string(h.GetRawValue())
		if name == "" || strings.ContainsAny(value, "\r\n\x00") {
			return hs, errors.New("invalid character in set_headers mutation")
		}
		switch check(rules, name, false) {
		case checkFail:
			return hs, fmt.Errorf("invalid attempt to modify %s", name)
		case checkIgnore:
			continue
		}
		_, exists := Get(hs, name)
		//lint:ignore SA1019 Envoy's ext_proc still reads the deprecated append field.
		appendValue := sh.GetAppend().GetValue()
		switch sh.GetAppendAction() {
		case 0: // APPEND_IF_EXISTS_OR_ADD: ext_proc falls back to "append"
		case 1: // ADD_IF_ABSENT
			if exists {
				continue
			}
			appendValue = true
		case 2: // OVERWRITE_IF_EXISTS_OR_ADD
			appendValue = false
		case 3: // OVERWRITE_IF_EXISTS
			if !exists {
				continue
			}
			appendValue = false
		default:
			return hs, fmt.Errorf("invalid append_action value %s", name)
		}
		if !appendValue {
			hs = remove(hs, name)
		}
		hs = append(hs, Header{Name: name, Value: value})
	}
	return hs, nil
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

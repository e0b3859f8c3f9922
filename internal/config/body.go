package config

import (
	"fmt"
	"slices"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// The body options: keys, matches and fingerprints drawn from a
// JSON body, and JSON-RPC answers (docs/mcp.md).

// mcpSessionHeader never scopes nor fingerprints (policy.MCPSessionHeader).
const mcpSessionHeader = policy.MCPSessionHeader

// pointer parses one RFC 6901 pointer of the file.
func (b *builder) pointer(v scalar, path string) jsonpointer.Pointer {
	p, err := jsonpointer.Parse(v.Value)
	if err != nil {
		b.errorf(v.Line, path, "%q is not a JSON Pointer (RFC 6901, such as /params/name): %v", v.Value, err)
	}
	return p
}

// pointers parses a list of pointers; an empty list is nil, as if it were
// not there.
func (b *builder) pointers(v scalars, path string) []jsonpointer.Pointer {
	var out []jsonpointer.Pointer
	for i, s := range v.Items {
		out = append(out, b.pointer(s, fmt.Sprintf("%s[%d]", path, i)))
	}
	return out
}

// jsonMatch parses match.json: every criterion a pointer with equals or
// one_of.
func (b *builder) jsonMatch(cs []jsonCriterion, path string) []policy.JSONCriterion {
	var out []policy.JSONCriterion
	for i, c := range cs {
		at := b.entry(path+".json", i)
		if !c.Pointer.Set {
			b.errorf(firstSet(c.Equals, scalar{Line: c.OneOf.Line, Set: c.OneOf.Set}), at+".pointer", "missing; name the member the criterion reads")
			continue
		}
		crit := policy.JSONCriterion{Pointer: b.pointer(c.Pointer, at+".pointer")}
		switch {
		case c.Equals.Set && c.OneOf.Set:
			b.errorf(c.Equals.Line, at, "set one of equals and one_of")
		case c.Equals.Set:
			crit.OneOf = []string{c.Equals.Value}
		case c.OneOf.Set && len(c.OneOf.Items) > 0:
			for _, v := range c.OneOf.Items {
				crit.OneOf = append(crit.OneOf, v.Value)
			}
		default:
			b.errorf(c.Pointer.Line, at, "equals or one_of is required: the string value(s) the member must have")
		}
		out = append(out, crit)
	}
	return out
}

// bodyKey parses key.from, key.pointer and key.derive.
func (b *builder) bodyKey(r *policy.BodyKeyRules, s *settings, path string) {
	k := &s.Key
	if k.From.Set {
		r.KeySources = nil
		for i, v := range k.From.Items {
			src := oneOf(b, v, fmt.Sprintf("%s.key.from[%d]", path, i), keySources)
			if slices.Contains(r.KeySources, src) {
				b.errorf(v.Line, fmt.Sprintf("%s.key.from[%d]", path, i), "%q is listed twice", v.Value)
			}
			r.KeySources = append(r.KeySources, src)
		}
		if len(r.KeySources) == 0 {
			b.errorf(k.From.Line, path+".key.from", "empty; name header, body, derived or mcp_param")
		}
	}
	if k.Pointer.Set {
		r.KeyPointer = b.pointer(k.Pointer, path+".key.pointer")
		if r.KeyPointer.Len() == 0 {
			b.errorf(k.Pointer.Line, path+".key.pointer", "the whole body is not a key; name a member")
		}
	}
	if k.Param.Set {
		r.KeyParam = b.pointer(k.Param, path+".key.param")
		if _, err := jsonpointer.Parse(k.Param.Value); err == nil && (len(r.KeyParamPath()) == 0 || !prefixOf(policy.ArgumentsPointer, r.KeyParam)) {
			b.errorf(k.Param.Line, path+".key.param", "%q is not a tool parameter: name one under /params/arguments, such as /params/arguments/idempotency_key", k.Param.Value)
		}
	}
	if k.Derive.Set {
		r.KeyDerive = b.pointers(k.Derive, path+".key.derive")
		if len(r.KeyDerive) == 0 {
			b.errorf(k.Derive.Line, path+".key.derive", "empty; name the members whose hash is the key")
		}
	}
}

// fingerprintPointers parses fingerprint.include and fingerprint.exclude.
func (b *builder) fingerprintPointers(r *policy.BodyRules, s *settings, path string) {
	if v := s.Fingerprint.Include; v.Set {
		r.FingerprintInclude = b.pointers(v, path+".fingerprint.include")
	}
	if v := s.Fingerprint.Exclude; v.Set {
		r.FingerprintExclude = b.pointers(v, path+".fingerprint.exclude")
	}
}

// checkBody rejects the body options' impossible combinations, on the
// policy as built.
func (b *builder) checkBody(p *policy.Policy, s, defaults *settings, path string, at func(v ...scalar) int) {
	listAt := func(l scalars) scalar { return scalar{Line: l.Line, Set: l.Set} }
	keyFromAt := at(listAt(s.Key.From), listAt(defaults.Key.From))
	if p.KeyFrom(policy.KeyFromBody) && p.KeyPointer.Len() == 0 {
		b.errorf(keyFromAt, path+".key.pointer", "required with key.from: body (the member that carries the key, such as /idempotency_key)")
	}
	if !p.KeyFrom(policy.KeyFromBody) && (s.Key.Pointer.Set || defaults.Key.Pointer.Set) {
		b.errorf(at(s.Key.Pointer, defaults.Key.Pointer), path+".key.pointer", "only used with key.from: body")
	}
	if p.KeyFrom(policy.KeyFromMCPParam) && p.KeyParam.Len() == 0 {
		b.errorf(keyFromAt, path+".key.param", "required with key.from: mcp_param (the tool parameter that carries the key, such as /params/arguments/idempotency_key)")
	}
	if p.KeyFrom(policy.KeyFromMCPParam) && p.Answers != policy.AnswersJSONRPC {
		b.errorf(keyFromAt, path+".key.from", "mcp_param applies to MCP servers only: set answers: jsonrpc")
	}
	if !p.KeyFrom(policy.KeyFromMCPParam) && (s.Key.Param.Set || defaults.Key.Param.Set) {
		b.errorf(at(s.Key.Param, defaults.Key.Param), path+".key.param", "only used with key.from: mcp_param")
	}
	if p.KeyFrom(policy.KeyFromDerived) && len(p.KeyDerive) == 0 {
		b.errorf(keyFromAt, path+".key.derive", "required with key.from: derived (the members whose hash is the key, such as [/params/name, /params/arguments])")
	}
	if !p.KeyFrom(policy.KeyFromDerived) && (s.Key.Derive.Set || defaults.Key.Derive.Set) {
		b.errorf(at(listAt(s.Key.Derive), listAt(defaults.Key.Derive)), path+".key.derive", "only used with key.from: derived")
	}
	if !p.KeyFrom(policy.KeyFromHeader) && s.Key.Header.Set {
		b.errorf(s.Key.Header.Line, path+".key.header", "only used when key.from lists header")
	}
	fpAt := at(listAt(s.Fingerprint.Include), listAt(s.Fingerprint.Exclude), listAt(defaults.Fingerprint.Include), listAt(defaults.Fingerprint.Exclude))
	if (len(p.FingerprintInclude) > 0 || len(p.FingerprintExclude) > 0) && !p.FingerprintJSON {
		b.errorf(fpAt, path+".fingerprint.json", "must be true with fingerprint.include or fingerprint.exclude (pointers address a JSON body)")
	}
	if len(p.FingerprintInclude) > 0 {
		// Exclude wins over Include for the same value (fingerprint.JSONOptions):
		// an exclude pointer at or above an included value would drop it,
		// and one outside every included value changes nothing. Either is a
		// mistake.
		for _, e := range p.FingerprintExclude {
			inside := false
			for _, in := range p.FingerprintInclude {
				if prefixOf(e, in) {
					b.errorf(fpAt, path+".fingerprint.exclude", "%q removes the included value %q: the two lists contradict", e.String(), in.String())
				}
				if prefixOf(in, e) && in.Len() < e.Len() {
					inside = true
				}
			}
			if !inside {
				b.errorf(fpAt, path+".fingerprint.exclude", "%q is inside no fingerprint.include value, so it changes nothing", e.String())
			}
		}
	}
	if p.Scope.Source == policy.ScopeHeader && p.Scope.Header == mcpSessionHeader {
		b.errorf(at(s.Scope.Header, defaults.Scope.Header), path+".scope.header",
			"%s must not scope keys: an MCP agent that reconnects gets a new session and must still be recognised", mcpSessionHeader)
	}
	if slices.Contains(p.FingerprintHeaders, mcpSessionHeader) {
		b.errorf(at(listAt(s.Fingerprint.Headers), listAt(defaults.Fingerprint.Headers)), path+".fingerprint.headers",
			"%s must not take part in the fingerprint: a retry after a reconnect comes in a new session", mcpSessionHeader)
	}
}

// prefixOf reports whether a's tokens start b's.
func prefixOf(a, b jsonpointer.Pointer) bool {
	at, bt := a.Tokens(), b.Tokens()
	return len(at) <= len(bt) && slices.Equal(at, bt[:len(at)])
}

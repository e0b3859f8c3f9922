package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// apply sets on p what s says, group by group as policy.Policy holds them;
// every mistake is collected.
func (b *builder) apply(p *policy.Policy, s *settings, path string) {
	b.key(&p.KeyRules, s, path)
	b.scope(p, &s.Scope, path+".scope")
	b.bodies(&p.BodyRules, s, path)
	b.compression(&p.Compression, s, path)
	b.durability(&p.DurabilityRules, s, path)
	b.rollout(&p.RolloutRules, s, path)
	b.responses(&p.Responses, s, path)
	b.bodyKey(&p.KeyRules.BodyKeyRules, s, path)
	b.fingerprintPointers(&p.BodyRules, s, path)
	if v := s.Answers; v.Set {
		p.Answers = oneOf(b, v, path+".answers", answerModes)
	}
	if v := s.MCPHeaders; v.Set {
		p.MCPHeaders = oneOf(b, v, path+".mcp_headers", mcpHeaderModes)
	}
	b.tools(&p.Tools, &s.Tools, path+".tools")
}

// tools parses the tools group: tools.protect, tools.hint_ttl,
// tools.hint_cache_size.
func (b *builder) tools(r *policy.ToolRules, s *toolsCfg, path string) {
	if v := s.Protect; v.Set {
		r.Protect = oneOf(b, v, path+".protect", toolsProtects)
	}
	if v := s.HintTTL; v.Set {
		b.duration(&r.HintTTL, v, path+".hint_ttl", time.Second)
	}
	if v := s.Advertise; v.Set {
		b.boolean(&r.AdvertiseIdempotent, v, path+".advertise_idempotent")
	}
	if v := s.HintCacheSize; v.Set {
		n, err := strconv.Atoi(strings.TrimSpace(v.Value))
		if err != nil || n < 1 || n > maxToolHintCacheSize {
			b.errorf(v.Line, path+".hint_cache_size", "%q is not a number of tools from 1 to %d", v.Value, maxToolHintCacheSize)
		} else {
			r.HintCacheSize = n
		}
	}
}

// maxToolHintCacheSize bounds tools.hint_cache_size: the cache is held in
// memory by every server, a few hundred bytes a tool.
const maxToolHintCacheSize = 1 << 20

// checkTools rejects a tools group where it cannot apply.
func (b *builder) checkTools(p *policy.Policy, s, defaults *settings, path string, at func(v ...scalar) int) {
	t, d := &s.Tools, &defaults.Tools
	if p.Tools.Protect != policy.ToolsAll && p.Answers != policy.AnswersJSONRPC {
		b.errorf(at(t.Protect, d.Protect), path+".tools.protect", "applies to MCP servers only: set answers: jsonrpc")
	}
	if p.Tools.AdvertiseIdempotent && p.Tools.Protect != policy.ToolsUnlessHinted {
		b.errorf(at(t.Advertise, d.Advertise), path+".tools.advertise_idempotent",
			"needs tools.protect: unless_hinted (the server reads the tools/list answers it rewrites)")
	}
	if p.Tools.AdvertiseIdempotent && !sameArgumentsSameKey(&p.KeyRules) {
		b.errorf(at(t.Advertise, d.Advertise), path+".tools.advertise_idempotent",
			"idempotentHint promises that \"calling the tool repeatedly with the same arguments will have no additional effect\" (MCP 2026-07-28 schema.ts, ToolAnnotations), which holds only if every call has a key and equal arguments mean an equal key: set key.required: true without key.warn_until, or key.from: [derived] with key.derive: [/params/name, /params/arguments]")
	}
	if p.Tools.Protect != policy.ToolsUnlessHinted && !p.KeyFrom(policy.KeyFromMCPParam) && (t.HintTTL.Set || t.HintCacheSize.Set) {
		b.errorf(at(t.HintTTL, t.HintCacheSize), path+".tools",
			"hint_ttl and hint_cache_size need tools.protect: unless_hinted or key.from: mcp_param (they size what it learns)")
	}
}

// sameArgumentsSameKey reports whether a policy's tools/call requests
// cannot run twice for the same arguments, as idempotentHint promises: the
// key is required with no grace period (a call without one is refused,
// never run unprotected), or it is derived from the
// tool's name and arguments alone, so that a call with the same arguments
// is the same operation whatever else differs (the JSON-RPC id, _meta).
func sameArgumentsSameKey(r *policy.KeyRules) bool {
	if r.KeyRequired && r.KeyWarnUntil.IsZero() {
		return true
	}
	if !slices.Equal(r.KeySources, []policy.KeySource{policy.KeyFromDerived}) {
		return false
	}
	derive := make([]string, len(r.KeyDerive))
	for i, p := range r.KeyDerive {
		derive[i] = p.String()
	}
	slices.Sort(derive)
	return slices.Equal(derive, []string{"/params/arguments", "/params/name"})
}

// key parses the key group: key.header, key.required, key.max_length,
// key.warn_until.
func (b *builder) key(r *policy.KeyRules, s *settings, path string) {
	if v := s.Key.Header; v.Set {
		h := strings.ToLower(strings.TrimSpace(v.Value))
		if !methodPattern.MatchString(h) { // a header name is a token too
			b.errorf(v.Line, path+".key.header", "%q is not a header name", v.Value)
		}
		r.KeyHeader = h
	}
	if v := s.Key.Required; v.Set {
		b.boolean(&r.KeyRequired, v, path+".key.required")
	}
	if v := s.Key.MaxLength; v.Set {
		n, err := strconv.Atoi(v.Value)
		if err != nil || n < 1 || n > idem.MaxKeyLength {
			b.errorf(v.Line, path+".key.max_length", "%q is not a length from 1 to %d", v.Value, idem.MaxKeyLength)
		} else {
			r.MaxKeyLength = n
		}
	}
	if v := s.Key.WarnUntil; v.Set {
		r.KeyWarnUntil = b.date(v, path+".key.warn_until")
	}
}

// bodies parses the bodies group: max_request_body, max_stored_body,
// fingerprint, stored_headers.
func (b *builder) bodies(r *policy.BodyRules, s *settings, path string) {
	if v := s.MaxRequestBody; v.Set {
		b.size(&r.MaxRequestBody, v, path+".max_request_body")
	}
	if v := s.MaxStoredBody; v.Set {
		b.size(&r.MaxStoredBody, v, path+".max_stored_body")
	}
	if v := s.Fingerprint.Headers; v.Set {
		names := make([]string, 0, len(v.Items))
		for i, h := range v.Items {
			if !methodPattern.MatchString(h.Value) || strings.HasPrefix(h.Value, ":") {
				b.errorf(h.Line, fmt.Sprintf("%s.fingerprint.headers[%d]", path, i), "%q is not a header name", h.Value)
			}
			names = append(names, h.Value)
		}
		r.FingerprintHeaders = fingerprint.Normalize(names)
	}
	if v := s.Fingerprint.JSON; v.Set {
		b.boolean(&r.FingerprintJSON, v, path+".fingerprint.json")
	}
	if v := s.StoredHeaders.Deny; v.Set {
		for i, h := range v.Items {
			if !methodPattern.MatchString(h.Value) {
				b.errorf(h.Line, fmt.Sprintf("%s.stored_headers.deny[%d]", path, i), "%q is not a header name", h.Value)
			}
			r.StoredHeaderDeny = append(r.StoredHeaderDeny, strings.ToLower(h.Value))
		}
	}
}

// durability parses the durability group: retention, lease,
// on_lease_expiry, store_failure, durability, durability_replicas,
// durability_timeout, encrypt.
func (b *builder) durability(r *policy.DurabilityRules, s *settings, path string) {
	if v := s.Retention; v.Set {
		b.duration(&r.Retention, v, path+".retention", time.Second)
	}
	if v := s.Lease; v.Set {
		b.duration(&r.Lease, v, path+".lease", 100*time.Millisecond)
	}
	if v := s.OnLeaseExpiry; v.Set {
		r.LeaseExpiry = oneOf(b, v, path+".on_lease_expiry", leaseExpiries)
	}
	if v := s.StoreFailure; v.Set {
		r.FailureMode = oneOf(b, v, path+".store_failure", failureModes)
	}
	if v := s.Durability; v.Set {
		r.Durability = oneOf(b, v, path+".durability", durabilities)
	}
	if v := s.DurabilityReps; v.Set {
		n, err := strconv.Atoi(v.Value)
		if err != nil || n < 1 || n > 16 {
			b.errorf(v.Line, path+".durability_replicas", "%q is not a replica count from 1 to 16", v.Value)
		} else {
			r.DurabilityReplicas = n
		}
	}
	if v := s.DurabilityWait; v.Set {
		b.duration(&r.DurabilityTimeout, v, path+".durability_timeout", time.Millisecond)
	}
	if v := s.Encrypt; v.Set {
		b.boolean(&r.Encrypt, v, path+".encrypt")
	}
}

// rollout parses the rollout group: enforcement, shadow_header,
// adopt_shadow_records.
func (b *builder) rollout(r *policy.RolloutRules, s *settings, path string) {
	if v := s.Enforcement; v.Set {
		e, ok := enforcements.parse(v.Value)
		if !ok {
			b.errorf(v.Line, path+".enforcement", "%q is not off, shadow or enforce", v.Value)
		}
		r.Enforcement = e
	}
	if v := s.ShadowHeader; v.Set {
		h := strings.ToLower(strings.TrimSpace(v.Value))
		if h != "" && (!methodPattern.MatchString(h) || policy.ReservedHeader(h)) {
			b.errorf(v.Line, path+".shadow_header", "%q is not a header name a response may carry", v.Value)
		}
		r.ShadowHeader = h
	}
	if v := s.AdoptShadow; v.Set {
		b.boolean(&r.AdoptShadowRecords, v, path+".adopt_shadow_records")
	}
}

// responses parses the responses group: responses, on_stream_reset,
// retry_after, wait_for_in_flight.
func (b *builder) responses(r *policy.Responses, s *settings, path string) {
	if len(s.Responses) > 0 {
		rules := make([]idem.ResponseRule, 0, len(s.Responses))
		for i := range s.Responses {
			rules = append(rules, b.responseRules(&s.Responses[i], b.entry(path+".responses", i))...)
		}
		// The policy's rules come first; the defaults cover the rest.
		r.ResponseRules = append(rules, idem.DefaultResponseRules()...)
	}
	if v := s.OnStreamReset; v.Set {
		switch a, ok := idem.ParseAction(v.Value); {
		case ok && (a == idem.ActionUnknown || a == idem.ActionRelease):
			r.OnStreamReset = a
		default:
			b.errorf(v.Line, path+".on_stream_reset", "%q is not unknown or release (with no response there is nothing to store)", v.Value)
		}
	}
	if v := s.RetryAfter; v.Set {
		b.duration(&r.RetryAfter, v, path+".retry_after", time.Second)
	}
	if v := s.WaitForInFlight; v.Set {
		b.duration(&r.WaitForInFlight, v, path+".wait_for_in_flight", 0)
	}
}

package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// apply sets on p every field s names, reporting malformed values, group
// by group in the order of the fields (the errors come in that order).
func (b *builder) apply(p *policy.Policy, s *settings, path string) {
	b.applyKey(p, s, path)
	b.scope(p, &s.Scope, path+".scope")
	b.applyLifetimes(p, s, path)
	b.applyStorage(p, s, path)
	b.applyRollout(p, s, path)
	b.applyResponses(p, s, path)
}

// applyKey reads key: the header, whether it is required, its length and
// the end of its grace period.
func (b *builder) applyKey(p *policy.Policy, s *settings, path string) {
	if v := s.Key.Header; v.Set {
		h := strings.ToLower(strings.TrimSpace(v.Value))
		if !methodPattern.MatchString(h) { // a header name is a token too
			b.errorf(v.Line, path+".key.header", "%q is not a header name", v.Value)
		}
		p.KeyHeader = h
	}
	if v := s.Key.Required; v.Set {
		p.KeyRequired = b.boolean(v, path+".key.required")
	}
	if v := s.Key.MaxLength; v.Set {
		n, err := strconv.Atoi(v.Value)
		if err != nil || n < 1 || n > idem.MaxKeyLength {
			b.errorf(v.Line, path+".key.max_length", "%q is not a length from 1 to %d", v.Value, idem.MaxKeyLength)
		}
		p.MaxKeyLength = n
	}
	if v := s.Key.WarnUntil; v.Set {
		p.KeyWarnUntil = b.date(v, path+".key.warn_until")
	}
}

// applyLifetimes reads how long records, leases and waits last.
func (b *builder) applyLifetimes(p *policy.Policy, s *settings, path string) {
	if v := s.Retention; v.Set {
		p.Retention = b.duration(v, path+".retention", time.Second)
	}
	if v := s.Lease; v.Set {
		p.Lease = b.duration(v, path+".lease", 100*time.Millisecond)
	}
	if v := s.RetryAfter; v.Set {
		p.RetryAfter = b.duration(v, path+".retry_after", time.Second)
	}
	if v := s.WaitForInFlight; v.Set {
		p.WaitForInFlight = b.duration(v, path+".wait_for_in_flight", 0)
	}
}

// applyStorage reads what is kept and how: the body bounds, the store
// failure mode, the fingerprinted headers, durability and encryption.
func (b *builder) applyStorage(p *policy.Policy, s *settings, path string) {
	if v := s.MaxRequestBody; v.Set {
		p.MaxRequestBody = b.size(v, path+".max_request_body")
	}
	if v := s.MaxStoredBody; v.Set {
		p.MaxStoredBody = b.size(v, path+".max_stored_body")
	}
	if v := s.StoreFailure; v.Set {
		p.FailureMode = oneOf(b, v, path+".store_failure", []string{"fail_closed", "fail_open"},
			[]policy.FailureMode{policy.FailClosed, policy.FailOpen})
	}
	if v := s.Fingerprint.Headers; v.Set {
		names := make([]string, 0, len(v.Items))
		for i, h := range v.Items {
			if !methodPattern.MatchString(h.Value) || strings.HasPrefix(h.Value, ":") {
				b.errorf(h.Line, fmt.Sprintf("%s.fingerprint.headers[%d]", path, i), "%q is not a header name", h.Value)
			}
			names = append(names, h.Value)
		}
		p.FingerprintHeaders = fingerprint.Normalize(names)
	}
	if v := s.Durability; v.Set {
		p.Durability = oneOf(b, v, path+".durability", []string{"async", "replicated"},
			[]policy.Durability{policy.DurabilityAsync, policy.DurabilityReplicated})
	}
	if v := s.DurabilityReps; v.Set {
		n, err := strconv.Atoi(v.Value)
		if err != nil || n < 1 || n > 16 {
			b.errorf(v.Line, path+".durability_replicas", "%q is not a replica count from 1 to 16", v.Value)
		}
		p.DurabilityReplicas = n
	}
	if v := s.DurabilityWait; v.Set {
		p.DurabilityTimeout = b.duration(v, path+".durability_timeout", time.Millisecond)
	}
	if v := s.Encrypt; v.Set {
		p.Encrypt = b.boolean(v, path+".encrypt")
	}
}

// applyRollout reads the enforcement mode and the shadow settings.
func (b *builder) applyRollout(p *policy.Policy, s *settings, path string) {
	if v := s.Enforcement; v.Set {
		switch v.Value {
		case "enforce":
			p.Enforcement = policy.EnforcementEnforce
		case "shadow":
			p.Enforcement = policy.EnforcementShadow
		case "off":
			p.Enforcement = policy.EnforcementOff
		default:
			b.errorf(v.Line, path+".enforcement", "%q is not off, shadow or enforce", v.Value)
		}
	}
	if v := s.ShadowHeader; v.Set {
		h := strings.ToLower(strings.TrimSpace(v.Value))
		if h != "" && (!methodPattern.MatchString(h) || policy.ReservedHeader(h)) {
			b.errorf(v.Line, path+".shadow_header", "%q is not a header name a response may carry", v.Value)
		}
		p.ShadowHeader = h
	}
	if v := s.AdoptShadow; v.Set {
		p.AdoptShadowRecords = b.boolean(v, path+".adopt_shadow_records")
	}
}

// applyResponses reads what happens to responses: JSON fingerprints, the
// response rules, the outcome of a reset stream or an expired lease, and
// the headers never stored.
func (b *builder) applyResponses(p *policy.Policy, s *settings, path string) {
	if v := s.Fingerprint.JSON; v.Set {
		p.FingerprintJSON = b.boolean(v, path+".fingerprint.json")
	}
	if len(s.Responses) > 0 {
		rules := make([]idem.ResponseRule, 0, len(s.Responses))
		for i := range s.Responses {
			rules = append(rules, b.responseRules(&s.Responses[i], fmt.Sprintf("%s.responses[%d]", path, i))...)
		}
		// The policy's rules come first; the defaults cover the rest.
		p.ResponseRules = append(rules, idem.DefaultResponseRules()...)
	}
	if v := s.OnStreamReset; v.Set {
		switch a, ok := idem.ParseAction(v.Value); {
		case ok && (a == idem.ActionUnknown || a == idem.ActionRelease):
			p.OnStreamReset = a
		default:
			b.errorf(v.Line, path+".on_stream_reset", "%q is not unknown or release (with no response there is nothing to store)", v.Value)
		}
	}
	if v := s.OnLeaseExpiry; v.Set {
		p.LeaseExpiry = oneOf(b, v, path+".on_lease_expiry", []string{"unknown", "reexecute"},
			[]idem.LeaseExpiry{idem.LeaseExpiryUnknown, idem.LeaseExpiryReexecute})
	}
	if v := s.StoredHeaders.Deny; v.Set {
		for i, h := range v.Items {
			if !methodPattern.MatchString(h.Value) {
				b.errorf(h.Line, fmt.Sprintf("%s.stored_headers.deny[%d]", path, i), "%q is not a header name", h.Value)
			}
			p.StoredHeaderDeny = append(p.StoredHeaderDeny, strings.ToLower(h.Value))
		}
	}
}

func (b *builder) scope(p *policy.Policy, s *scopeSettings, path string) {
	if !s.From.Set {
		if s.Header.Set || s.Metadata.Namespace.Set || s.Metadata.Path.Set {
			b.errorf(firstSet(s.Header, s.Metadata.Namespace), path+".from", "missing; say where the scope comes from")
		}
		return
	}
	sc := policy.Scope{}
	switch s.From.Value {
	case "authority":
		sc.Source = policy.ScopeAuthority
	case "none":
		sc.Source = policy.ScopeNone
	case "principal":
		sc.Source = policy.ScopePrincipal
		if v := s.PeerIdentity; v.Set {
			sc.PeerIdentity = oneOf(b, v, path+".peer_identity", []string{"uri_san", "dns_san", "subject"},
				[]policy.PeerIdentity{policy.PeerURISAN, policy.PeerDNSSAN, policy.PeerSubject})
		}
	case "header":
		sc.Source = policy.ScopeHeader
		if !s.Header.Set || !methodPattern.MatchString(s.Header.Value) {
			b.errorf(s.From.Line, path+".header", "a header name is required with from: header")
		}
		sc.Header = strings.ToLower(s.Header.Value)
	case "metadata":
		sc.Source = policy.ScopeMetadata
		if !s.Metadata.Namespace.Set || s.Metadata.Namespace.Value == "" || len(s.Metadata.Path.Items) == 0 {
			b.errorf(s.From.Line, path+".metadata", "namespace and path are required with from: metadata")
		}
		sc.Namespace = s.Metadata.Namespace.Value
		for _, seg := range s.Metadata.Path.Items {
			sc.Path = append(sc.Path, seg.Value)
		}
	default:
		b.errorf(s.From.Line, path+".from", "%q is not one of authority, none, header, metadata, principal", s.From.Value)
	}
	if sc.Source != policy.ScopePrincipal && s.PeerIdentity.Set {
		b.errorf(s.PeerIdentity.Line, path+".peer_identity", "only used with from: principal")
	}
	if sc.Source != policy.ScopeHeader && s.Header.Set {
		b.errorf(s.Header.Line, path+".header", "only used with from: header")
	}
	if sc.Source != policy.ScopeMetadata && (s.Metadata.Namespace.Set || s.Metadata.Path.Set) {
		b.errorf(firstSet(s.Metadata.Namespace, scalar{Line: s.Metadata.Path.Line, Set: s.Metadata.Path.Set}), path+".metadata", "only used with from: metadata")
	}
	p.Scope = sc
}

var origins = map[string][]idem.Origin{
	"upstream":         {idem.OriginUpstream},
	"envoy_not_sent":   {idem.OriginNotSent},
	"envoy_maybe_sent": {idem.OriginMaybeSent},
	"any":              {idem.OriginUpstream, idem.OriginNotSent, idem.OriginMaybeSent},
}

func (b *builder) responseRules(r *responseRule, path string) []idem.ResponseRule {
	line := firstSet(r.Status, r.Origin, r.Action)
	lo, hi := 100, 599
	if r.Status.Set {
		var ok bool
		if lo, hi, ok = statusRange(r.Status.Value); !ok {
			b.errorf(r.Status.Line, path+".status", "%q is not a status (503), a class (5xx) or a range (500-504)", r.Status.Value)
		}
	}
	action, ok := idem.ParseAction(r.Action.Value)
	if !ok {
		b.errorf(line, path+".action", "%q is not store, release or unknown", r.Action.Value)
	}
	originName := "upstream"
	if r.Origin.Set {
		originName = r.Origin.Value
	}
	os, ok := origins[originName]
	if !ok {
		b.errorf(r.Origin.Line, path+".origin", "%q is not upstream, envoy_not_sent, envoy_maybe_sent or any", originName)
	}
	out := make([]idem.ResponseRule, 0, len(os))
	for _, o := range os {
		out = append(out, idem.ResponseRule{Origin: o, MinStatus: lo, MaxStatus: hi, Action: action})
	}
	return out
}

func statusRange(s string) (lo, hi int, ok bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	if len(s) == 3 && strings.HasSuffix(s, "xx") && s[0] >= '1' && s[0] <= '5' {
		c := int(s[0]-'0') * 100
		return c, c + 99, true
	}
	a, bPart, isRange := strings.Cut(s, "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi = lo
	var err2 error
	if isRange {
		hi, err2 = strconv.Atoi(strings.TrimSpace(bPart))
	}
	if err1 != nil || err2 != nil || lo < 100 || hi > 599 || lo > hi {
		return 0, 0, false
	}
	return lo, hi, true
}

package config

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Marshal writes set as a policy file: every setting in force spelt out in
// each policy (nothing left to defaults:), in the file's own keys, since
// it fills the very document type Parse reads. Parse of the result yields
// set again. A policy's responses are its own rules: the built-in ones
// (idem.DefaultResponseRules) always follow them and are not written. A
// set Parse could not have made (a rule Parse cannot express, the default
// policy out of place) is an error rather than a file that means
// something else.
func Marshal(set *policy.Set) ([]byte, error) {
	doc, err := unparse(set)
	if err != nil {
		return nil, err
	}
	return encodeYAML(doc)
}

// unparse is Parse backwards: the document that yields set.
func unparse(set *policy.Set) (*document, error) {
	doc := &document{Policies: []namedPolicy{}}
	var errs []error
	hasDefault := false
	for i, p := range set.Policies {
		var s settings
		if err := unapply(&s, p); err != nil {
			errs = append(errs, fmt.Errorf("policy %q: %w", p.Name, err))
		}
		m, err := unmatch(&p.Match)
		if err != nil {
			errs = append(errs, fmt.Errorf("policy %q: %w", p.Name, err))
		}
		if p.Name == policy.DefaultPolicyName {
			if i != len(set.Policies)-1 {
				errs = append(errs, fmt.Errorf("policy %q: the default policy must come last", p.Name))
			}
			hasDefault = true
			doc.DefaultPolicy = defaultPolicy{Enabled: boolScalar(true), Match: m, settings: s}
			continue
		}
		doc.Policies = append(doc.Policies, namedPolicy{Name: str(p.Name), Match: m, settings: s})
	}
	if !hasDefault {
		doc.DefaultPolicy.Enabled = boolScalar(false)
	}
	doc.Homes = unhomes(set.Homes)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return doc, nil
}

// The constructors below make the scalars Marshal fills: a string is
// written as YAML writes strings (quoted when it would read as something
// else), a number or a boolean plain.

func str(s string) scalar              { return scalar{Value: s, Set: true} }
func boolScalar(b bool) scalar         { return scalar{Value: strconv.FormatBool(b), Set: true, Tag: "!!bool"} }
func intScalar(n int) scalar           { return scalar{Value: strconv.Itoa(n), Set: true, Tag: "!!int"} }
func durScalar(d time.Duration) scalar { return str(shortDuration(d)) }
func sizeScalar(n int) scalar          { return str(sizeName(n)) }

func list(items []string) scalars {
	out := scalars{Set: true, Items: make([]scalar, 0, len(items))}
	for _, s := range items {
		out.Items = append(out.Items, str(s))
	}
	return out
}

func pointerList(ps []jsonpointer.Pointer) scalars {
	out := scalars{Set: true, Items: make([]scalar, 0, len(ps))}
	for _, p := range ps {
		out.Items = append(out.Items, str(p.String()))
	}
	return out
}

// unmatch writes a match: the criteria it has, none it lacks.
func unmatch(m *policy.Match) (match, error) {
	var out match
	if len(m.RouteNames) > 0 {
		out.RouteNames = list(m.RouteNames)
	}
	if len(m.Hosts) > 0 {
		out.Hosts = list(m.Hosts)
	}
	if len(m.Methods) > 0 {
		out.Methods = list(m.Methods)
	}
	if m.PathExact != "" {
		out.Path.Exact = str(m.PathExact)
	}
	if m.PathPrefix != "" {
		out.Path.Prefix = str(m.PathPrefix)
	}
	if m.PathRegex != nil {
		out.Path.Regex = str(m.PathRegex.String())
	}
	for _, c := range m.JSON {
		if len(c.OneOf) == 0 {
			return out, fmt.Errorf("match.json %q has no value to equal", c.Pointer.String())
		}
		out.JSON = append(out.JSON, jsonCriterion{Pointer: str(c.Pointer.String()), OneOf: list(c.OneOf)})
	}
	return out, nil
}

// unapply is apply backwards: it fills s with every setting of p, each
// one the file may carry in p's combination (key.pointer only when the key
// comes from the body, durability_timeout only when replicated, ...).
func unapply(s *settings, p *policy.Policy) error {
	var errs errList
	unapplyKey(s, p, &errs)
	unapplyScope(s, p, &errs)
	// bodies
	s.MaxRequestBody = sizeScalar(p.MaxRequestBody)
	s.MaxStoredBody = sizeScalar(p.MaxStoredBody)
	s.Fingerprint = fingerprintCfg{
		Headers: list(p.FingerprintHeaders),
		JSON:    boolScalar(p.FingerprintJSON),
		Include: pointerList(p.FingerprintInclude),
		Exclude: pointerList(p.FingerprintExclude),
	}
	s.StoredHeaders.Deny = list(p.StoredHeaderDeny)
	s.Compression.Mode = errs.keep(compressionModes.name(p.Compression.Mode))
	if p.Compression.Dictionary != "" {
		s.Compression.Dictionary = str(p.Compression.Dictionary)
	}
	if len(p.Compression.PreviousDictionaries) > 0 {
		s.Compression.PreviousDictionaries = list(p.Compression.PreviousDictionaries)
	}

	// durability
	s.Retention = durScalar(p.Retention)
	s.Lease = durScalar(p.Lease)
	s.OnLeaseExpiry = errs.keep(leaseExpiries.name(p.LeaseExpiry))
	s.StoreFailure = errs.keep(failureModes.name(p.FailureMode))
	s.Durability = errs.keep(durabilities.name(p.Durability))
	if p.Durability == policy.DurabilityReplicated {
		n, wait := p.WaitReplicas()
		s.DurabilityReps = intScalar(n)
		s.DurabilityWait = durScalar(wait)
	}
	s.Encrypt = boolScalar(p.Encrypt)

	// rollout
	s.Enforcement = errs.keep(enforcements.name(p.Enforcement))
	s.ShadowHeader = str(p.ShadowHeader)
	s.AdoptShadow = boolScalar(p.AdoptShadowRecords)

	// responses
	rules, err := unresponses(p.ResponseRules)
	errs.add(err)
	s.Responses = rules
	s.OnStreamReset = str(p.OnStreamReset.String())
	s.RetryAfter = durScalar(p.RetryAfter)
	s.WaitForInFlight = durScalar(p.WaitForInFlight)

	s.Answers = errs.keep(answerModes.name(p.Answers))
	if p.Answers == policy.AnswersJSONRPC {
		s.MCPHeaders = errs.keep(mcpHeaderModes.name(p.MCPHeaders))
		s.Tools.Protect = errs.keep(toolsProtects.name(p.Tools.Protect))
		if p.Tools.Protect == policy.ToolsUnlessHinted {
			s.Tools.HintTTL = durScalar(p.Tools.HintTTL)
			s.Tools.HintCacheSize = intScalar(p.Tools.HintCacheSize)
			s.Tools.Advertise = boolScalar(p.Tools.AdvertiseIdempotent)
		}
	}
	return errors.Join(errs...)
}

// errList gathers the errors of one policy's unapply.
type errList []error

func (e *errList) add(err error) {
	if err != nil {
		*e = append(*e, err)
	}
}

// keep returns v, keeping err.
func (e *errList) keep(v scalar, err error) scalar {
	e.add(err)
	return v
}

// unapplyKey writes the key group.
func unapplyKey(s *settings, p *policy.Policy, errs *errList) {
	from := p.KeySources
	if len(from) == 0 {
		from = []policy.KeySource{policy.KeyFromHeader}
	}
	s.Key.From = scalars{Set: true}
	for _, src := range from {
		s.Key.From.Items = append(s.Key.From.Items, errs.keep(keySources.name(src)))
	}
	if p.KeyFrom(policy.KeyFromHeader) {
		s.Key.Header = str(p.KeyHeader)
	}
	if p.KeyFrom(policy.KeyFromBody) {
		s.Key.Pointer = str(p.KeyPointer.String())
	}
	if p.KeyFrom(policy.KeyFromDerived) {
		s.Key.Derive = pointerList(p.KeyDerive)
	}
	if p.KeyFrom(policy.KeyFromMCPParam) {
		s.Key.Param = str(p.KeyParam.String())
	}
	s.Key.Required = boolScalar(p.KeyRequired)
	s.Key.MaxLength = intScalar(p.MaxKeyLength)
	if !p.KeyWarnUntil.IsZero() {
		s.Key.WarnUntil = str(p.KeyWarnUntil.Format(time.RFC3339Nano))
	}

}

// unapplyScope writes the scope group.
func unapplyScope(s *settings, p *policy.Policy, errs *errList) {
	sc := &p.Scope
	s.Scope.From = errs.keep(scopeSources.name(sc.Source))
	switch sc.Source {
	case policy.ScopeHeader:
		s.Scope.Header = str(sc.Header)
	case policy.ScopeMetadata:
		s.Scope.Metadata = metadataRef{Namespace: str(sc.Namespace), Path: list(sc.Path)}
	case policy.ScopePrincipal:
		s.Scope.PeerIdentity = errs.keep(peerIdentities.name(sc.PeerIdentity))
	}
}

// unresponses writes a policy's own response rules: those before the
// built-in ones, which Parse appends to every policy's list. The three
// rules `origin: any` stands for are written as one again.
func unresponses(rules []idem.ResponseRule) ([]responseRule, error) {
	builtin := idem.DefaultResponseRules()
	n := len(rules) - len(builtin)
	if n < 0 || !slices.Equal(rules[n:], builtin) {
		return nil, errors.New("responses: the rules do not end with the built-in ones, which a file cannot leave out")
	}
	out := []responseRule{}
	own := rules[:n]
	for i := 0; i < len(own); i++ {
		r := own[i]
		if r.MinStatus < 100 || r.MaxStatus > 599 || r.MinStatus > r.MaxStatus {
			return nil, fmt.Errorf("responses: status %d-%d is outside 100-599, which a file cannot write", r.MinStatus, r.MaxStatus)
		}
		origin := ""
		if all := origins["any"]; i+len(all) <= len(own) && sameExceptOrigin(own[i:i+len(all)], all) {
			origin, i = "any", i+len(all)-1
		} else {
			for name, group := range origins {
				if len(group) == 1 && group[0] == r.Origin {
					origin = name
				}
			}
		}
		if origin == "" {
			return nil, fmt.Errorf("responses: origin %v has no name in the file", r.Origin)
		}
		out = append(out, responseRule{Status: statusScalar(r.MinStatus, r.MaxStatus), Origin: str(origin), Action: str(r.Action.String())})
	}
	return out, nil
}

// sameExceptOrigin reports whether rules are one status range and action
// for each of origins, in order.
func sameExceptOrigin(rules []idem.ResponseRule, origins []idem.Origin) bool {
	for i, r := range rules {
		if r.Origin != origins[i] || r.MinStatus != rules[0].MinStatus || r.MaxStatus != rules[0].MaxStatus || r.Action != rules[0].Action {
			return false
		}
	}
	return true
}

// statusScalar writes a status range as statusRange reads it: 503, 5xx
// or 500-504.
func statusScalar(lo, hi int) scalar {
	switch {
	case lo == hi:
		return intScalar(lo)
	case lo%100 == 0 && hi == lo+99:
		return str(strconv.Itoa(lo/100) + "xx")
	}
	return str(fmt.Sprintf("%d-%d", lo, hi))
}

// sizeName writes a byte count in the largest unit size reads that
// divides it.
func sizeName(n int) string {
	for _, u := range []struct {
		name string
		size int
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.Itoa(n/u.size) + u.name
		}
	}
	return strconv.Itoa(n)
}

// Describe writes what decides the answer a request gets under p, as
// Marshal writes it (the file's own keys and spelling) and one line per
// setting: its name, match, key, scope, fingerprint, retention,
// store_failure, wait_for_in_flight, enforcement, answers and its own
// response rules (the built-in ones follow them). The rest of its
// settings (lease, body limits, durability, ...) are Marshal's to print.
func Describe(p *policy.Policy) ([]byte, error) {
	var s settings
	err := unapply(&s, p)
	m, merr := unmatch(&p.Match)
	if err := errors.Join(err, merr); err != nil {
		return nil, fmt.Errorf("config: policy %q: %w", p.Name, err)
	}
	sum := struct {
		Name            scalar         `yaml:"name"`
		Match           match          `yaml:"match,flow"`
		Key             keySettings    `yaml:"key,flow"`
		Scope           scopeSettings  `yaml:"scope,flow"`
		Fingerprint     fingerprintCfg `yaml:"fingerprint,flow"`
		Retention       scalar         `yaml:"retention"`
		StoreFailure    scalar         `yaml:"store_failure"`
		WaitForInFlight scalar         `yaml:"wait_for_in_flight"`
		Enforcement     scalar         `yaml:"enforcement"`
		Answers         scalar         `yaml:"answers"`
		Responses       []responseRule `yaml:"responses,flow"`
	}{str(p.Name), m, s.Key, s.Scope, s.Fingerprint, s.Retention, s.StoreFailure, s.WaitForInFlight, s.Enforcement, s.Answers, s.Responses}
	return encodeYAML(sum)
}

// encodeYAML writes v as the policy files this package prints are
// written: YAML indented by two spaces.
func encodeYAML(v any) ([]byte, error) {
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return out.Bytes(), nil
}

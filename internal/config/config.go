// Package config reads the policy configuration file: YAML, validated
// strictly (an unknown field, a bad duration, an invalid regex or an
// impossible combination is an error naming the file, line and field; one
// load reports every mistake it finds, in file order), and turned into a
// policy.Set. Watcher reloads it on change.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/safefile"
)

// maxPolicyFile caps the policy file: the annotated example is 20 KiB, and
// a file of thousands of policies still fits.
const maxPolicyFile = 4 << 20

// Load reads and validates the configuration file at path.
func Load(path string) (*policy.Set, error) {
	data, err := safefile.Read(path, maxPolicyFile)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data)
}

// Parse validates a configuration document; name is used in messages. An
// empty document, a key without a value and a second document are refused
// as signs of a file cut short (checkComplete), and so is a document that
// leaves nothing protected unless it says `policies: []`.
func Parse(name string, data []byte) (*policy.Set, error) {
	set, _, err := parse(name, data)
	return set, err
}

func parse(name string, data []byte) (*policy.Set, shape, error) {
	sh, root, found, err := checkComplete(name, data)
	if err != nil {
		return nil, sh, err
	}
	var doc document
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	x := newNodeIndex(root)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, sh, yamlError(name, err)
		}
		// yaml.v3 decodes the rest of the document after each of these
		// mistakes: the checks below see all of it, so one unknown field
		// does not hide the mistakes elsewhere.
		found = append(found, decodeProblems(name, te, x)...)
		if len(te.Errors) == 0 { // never from yaml.v3; still a refusal
			found = append(found, problem{err: fmt.Errorf("%s: %w", name, err)})
		}
	}
	b := newBuilder(name, found, x.dropped(found))
	set := b.build(&doc)
	if err := b.errs.join(); err != nil {
		return nil, sh, err
	}
	if len(set.Policies) == 0 && !sh.explicitlyEmpty {
		return nil, sh, fmt.Errorf("%s: no policy and default_policy.enabled: false would protect nothing; "+
			"write `policies: []` to mean it", name)
	}
	return set, sh, nil
}

// linePrefix matches the "line N: " yaml.v3 starts its messages with.
var linePrefix = regexp.MustCompile(`^(?:yaml: )?line (\d+): `)

// yamlError rewrites an error that stops yaml.v3 (a document that is not
// YAML: "yaml: line 7: did not find expected key") as "file:7: did not
// find expected key". The mistakes it decodes on after are a TypeError,
// which decodeProblems reports instead.
func yamlError(name string, err error) error {
	m := hideContents(strings.TrimSpace(err.Error()))
	if sm := linePrefix.FindStringSubmatch(m); sm != nil {
		return fmt.Errorf("%s:%s: %s", name, sm[1], m[len(sm[0]):])
	}
	return fmt.Errorf("%s: %s", name, strings.TrimPrefix(m, "yaml: "))
}

// builder turns a document into policies, collecting every mistake.
type builder struct {
	file string
	errs problems
	// unset are the parts of the document that mistakes found while
	// decoding left undecoded (problem.unset).
	unset []string
	// dropped are the list entries decoding left out (nodeIndex.dropped).
	dropped map[string][]int
	// dictLines is the line that names each dictionary file (the last
	// one, when several do).
	dictLines map[string]int
}

// newBuilder starts a build with the mistakes found while decoding.
func newBuilder(file string, found problems, dropped map[string][]int) *builder {
	b := &builder{file: file, errs: found, dropped: dropped, dictLines: map[string]int{}}
	for _, p := range found {
		if p.unset != "" {
			b.unset = append(b.unset, p.unset)
		}
	}
	return b
}

func (b *builder) errorf(line int, path, format string, args ...any) {
	for _, u := range b.unset {
		if path == u || strings.HasPrefix(path, u+".") || strings.HasPrefix(path, u+"[") {
			return // that mistake again, reported as found while decoding
		}
	}
	b.errs = append(b.errs, problem{line: line, err: fmt.Errorf("%s:%d: %s: %s", b.file, line, path, fmt.Sprintf(format, args...))})
}

// entry is the path of the i-th decoded entry of the list at path, counted
// in the file: the entries decoding left out (reported already) are not in
// the decoded list, and the entries after them moved up.
func (b *builder) entry(list string, i int) string {
	for _, d := range b.dropped[list] { // in file order
		if d <= i {
			i++
		}
	}
	return fmt.Sprintf("%s[%d]", list, i)
}

// Names become part of every record's id; keep them stable and plain.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func (b *builder) build(doc *document) *policy.Set {
	base := policy.Default()
	b.apply(base, &doc.Defaults, "defaults")
	set := &policy.Set{}
	var paths []string // of each policy of set, for codecs' messages
	seen := map[string]string{}
	for i, np := range doc.Policies {
		path := b.entry("policies", i)
		p := clone(base)
		switch {
		case !np.Name.Set:
			b.errorf(firstLine(&np), path+".name", "missing; every policy needs a unique name")
		case !namePattern.MatchString(np.Name.Value) || np.Name.Value == policy.DefaultPolicyName:
			b.errorf(np.Name.Line, path+".name", "%q must be 1 to 63 lower-case letters, digits, '.', '_' or '-', start with a letter or a digit, and not be %q", np.Name.Value, policy.DefaultPolicyName)
		default:
			if prev, dup := seen[np.Name.Value]; dup {
				b.errorf(np.Name.Line, path+".name", "%q is already the name of %s", np.Name.Value, prev)
			}
			seen[np.Name.Value] = path
		}
		p.Name = np.Name.Value
		p.Match = b.match(&np.Match, path+".match", np.Name.Line)
		if isEmptyMatch(&p.Match) {
			b.errorf(np.Name.Line, path+".match", "empty; name at least one of route_names, hosts, methods or path (a policy that matches everything would protect reads too)")
		}
		b.apply(p, &np.settings, path)
		b.check(p, &np.settings, &doc.Defaults, path, np.Name.Line)
		fill(p)
		set.Policies = append(set.Policies, p)
		paths = append(paths, path)
	}
	dp := &doc.DefaultPolicy
	enabled := true
	if dp.Enabled.Set {
		v, err := strconv.ParseBool(dp.Enabled.Value)
		if err != nil {
			b.errorf(dp.Enabled.Line, "default_policy.enabled", "%q is not true or false", dp.Enabled.Value)
		}
		enabled = v
	}
	p := clone(base)
	p.Name = policy.DefaultPolicyName
	if m := b.match(&dp.Match, "default_policy.match", dp.Enabled.Line); !isEmptyMatch(&m) {
		p.Match = m
	} else {
		p.Match.JSON = m.JSON // body criteria on the default methods
	}
	b.apply(p, &dp.settings, "default_policy")
	b.check(p, &dp.settings, &doc.Defaults, "default_policy", dp.Enabled.Line)
	fill(p)
	if enabled {
		set.Policies = append(set.Policies, p)
		paths = append(paths, "default_policy")
	}
	b.codecs(set, paths)
	set.Homes = b.homes(&doc.Homes)
	for _, p := range set.Policies {
		p.Homes = set.Homes
	}
	return set
}

// fill writes into p the defaults that apply where a setting is left out
// but that the built-in policy cannot hold, since they depend on another
// setting (durability_replicas and durability_timeout exist only with
// durability: replicated): the policy then says what is in force (config
// check prints it), and a file that writes them out means the same policy.
func fill(p *policy.Policy) {
	if p.Durability == policy.DurabilityReplicated {
		p.DurabilityReplicas, p.DurabilityTimeout = p.WaitReplicas()
	}
	p.OmitContinuation()
	p.PrepareTools()
}

func firstLine(np *namedPolicy) int {
	for _, l := range []int{np.Match.Methods.Line, np.Match.Hosts.Line, np.Match.RouteNames.Line, np.Match.Path.Prefix.Line, np.Retention.Line} {
		if l > 0 {
			return l
		}
	}
	return 0
}

func clone(p *policy.Policy) *policy.Policy {
	c := *p
	c.FingerprintHeaders = slices.Clone(p.FingerprintHeaders)
	c.ResponseRules = slices.Clone(p.ResponseRules)
	c.StoredHeaderDeny = slices.Clone(p.StoredHeaderDeny)
	c.KeySources = slices.Clone(p.KeySources)
	c.KeyDerive = slices.Clone(p.KeyDerive)
	c.FingerprintInclude = slices.Clone(p.FingerprintInclude)
	c.FingerprintExclude = slices.Clone(p.FingerprintExclude)
	c.Compression.PreviousDictionaries = slices.Clone(p.Compression.PreviousDictionaries)
	return &c
}

func isEmptyMatch(m *policy.Match) bool {
	return len(m.RouteNames) == 0 && len(m.Hosts) == 0 && len(m.Methods) == 0 &&
		m.PathExact == "" && m.PathPrefix == "" && m.PathRegex == nil
}

// methodPattern is an RFC 9110 token, the form of a method.
var methodPattern = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

func (b *builder) match(m *match, path string, line int) policy.Match {
	var out policy.Match
	for i, v := range m.RouteNames.Items {
		if v.Value == "" {
			b.errorf(v.Line, fmt.Sprintf("%s.route_names[%d]", path, i), "empty")
		}
		out.RouteNames = append(out.RouteNames, v.Value)
	}
	for i, v := range m.Hosts.Items {
		h := strings.ToLower(v.Value)
		if h == "" || h == "*" || h == "*." || (strings.Contains(h, "*") && !strings.HasPrefix(h, "*.")) || strings.Count(h, "*") > 1 {
			b.errorf(v.Line, fmt.Sprintf("%s.hosts[%d]", path, i), "%q is neither a host name nor a \"*.suffix\" wildcard", v.Value)
		}
		out.Hosts = append(out.Hosts, h)
	}
	for i, v := range m.Methods.Items {
		if !methodPattern.MatchString(v.Value) {
			b.errorf(v.Line, fmt.Sprintf("%s.methods[%d]", path, i), "%q is not an HTTP method", v.Value)
		}
		out.Methods = append(out.Methods, strings.ToUpper(v.Value))
	}
	pm := &m.Path
	n := 0
	for _, s := range []scalar{pm.Exact, pm.Prefix, pm.Regex} {
		if s.Set {
			n++
		}
	}
	if n > 1 {
		b.errorf(firstSet(pm.Exact, pm.Prefix, pm.Regex), path+".path", "set only one of exact, prefix and regex")
	}
	if pm.Exact.Set {
		if !strings.HasPrefix(pm.Exact.Value, "/") {
			b.errorf(pm.Exact.Line, path+".path.exact", "%q does not start with /", pm.Exact.Value)
		}
		out.PathExact = pm.Exact.Value
	}
	if pm.Prefix.Set {
		if !strings.HasPrefix(pm.Prefix.Value, "/") {
			b.errorf(pm.Prefix.Line, path+".path.prefix", "%q does not start with /", pm.Prefix.Value)
		}
		out.PathPrefix = pm.Prefix.Value
	}
	if pm.Regex.Set {
		re, err := regexp.Compile(pm.Regex.Value)
		if err != nil {
			b.errorf(pm.Regex.Line, path+".path.regex", "invalid regular expression: %v", err)
		}
		out.PathRegex = re
	}
	out.JSON = b.jsonMatch(m.JSON, path)
	return out
}

func firstSet(ss ...scalar) int {
	for _, s := range ss {
		if s.Set {
			return s.Line
		}
	}
	return 0
}

// apply sets on p every field s names, reporting malformed values.
func (b *builder) scope(p *policy.Policy, s *scopeSettings, path string) {
	if !s.From.Set {
		if s.Header.Set || s.Metadata.Namespace.Set || s.Metadata.Path.Set {
			b.errorf(firstSet(s.Header, s.Metadata.Namespace), path+".from", "missing; say where the scope comes from")
		}
		return
	}
	sc := policy.Scope{Source: oneOf(b, s.From, path+".from", scopeSources)}
	switch sc.Source {
	case policy.ScopePrincipal:
		if v := s.PeerIdentity; v.Set {
			sc.PeerIdentity = oneOf(b, v, path+".peer_identity", peerIdentities)
		}
	case policy.ScopeHeader:
		if !s.Header.Set || !methodPattern.MatchString(s.Header.Value) {
			b.errorf(s.From.Line, path+".header", "a header name is required with from: header")
		}
		sc.Header = strings.ToLower(s.Header.Value)
	case policy.ScopeMetadata:
		if !s.Metadata.Namespace.Set || s.Metadata.Namespace.Value == "" || len(s.Metadata.Path.Items) == 0 {
			b.errorf(s.From.Line, path+".metadata", "namespace and path are required with from: metadata")
		}
		sc.Namespace = s.Metadata.Namespace.Value
		for _, seg := range s.Metadata.Path.Items {
			sc.Path = append(sc.Path, seg.Value)
		}
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

// check rejects combinations that cannot work, on the policy as built.
func (b *builder) check(p *policy.Policy, s, defaults *settings, path string, line int) {
	at := func(v ...scalar) int {
		if l := firstSet(v...); l > 0 {
			return l
		}
		return line
	}
	if p.MCPHeaders != policy.MCPHeadersCheck && p.Answers != policy.AnswersJSONRPC {
		b.errorf(at(s.MCPHeaders, defaults.MCPHeaders), path+".mcp_headers", "applies to MCP servers only: set answers: jsonrpc")
	}
	b.checkTools(p, s, defaults, path, at)
	if p.Lease >= p.Retention {
		// An in-flight record lives for the retention: a lease outliving it
		// would free the key while the first attempt still runs.
		b.errorf(at(s.Lease, s.Retention, defaults.Lease, defaults.Retention), path+".lease",
			"%s must be shorter than retention %s", shortDuration(p.Lease), shortDuration(p.Retention))
	}
	if p.WaitForInFlight >= p.Retention {
		b.errorf(at(s.WaitForInFlight, defaults.WaitForInFlight), path+".wait_for_in_flight",
			"%s must be shorter than retention %s", shortDuration(p.WaitForInFlight), shortDuration(p.Retention))
	}
	if p.Durability == policy.DurabilityReplicated {
		if _, wait := p.WaitReplicas(); wait >= time.Second {
			b.errorf(at(s.DurabilityWait, defaults.DurabilityWait), path+".durability_timeout",
				"%v leaves no room under Envoy's message_timeout: the reservation waits for it while Envoy waits", wait)
		}
	} else if s.DurabilityReps.Set || s.DurabilityWait.Set || defaults.DurabilityReps.Set || defaults.DurabilityWait.Set {
		b.errorf(at(s.DurabilityReps, s.DurabilityWait, defaults.DurabilityReps, defaults.DurabilityWait), path+".durability",
			"durability_replicas and durability_timeout need durability: replicated")
	}
	if !p.KeyWarnUntil.IsZero() && !p.KeyRequired {
		b.errorf(at(s.Key.WarnUntil, defaults.Key.WarnUntil), path+".key.warn_until",
			"only used with key.required: true (it ends the grace period of a required key)")
	}
	if p.AdoptShadowRecords && p.Enforcement != policy.EnforcementEnforce {
		b.errorf(at(s.AdoptShadow, defaults.AdoptShadow), path+".adopt_shadow_records",
			"only used with enforcement: enforce (it lets an enforcing policy replay what its shadow phase stored)")
	}
	b.checkBody(p, s, defaults, path, at)
	if p.MaxRequestBody == 0 {
		b.errorf(at(s.MaxRequestBody, defaults.MaxRequestBody), path+".max_request_body",
			"must be positive: a request body must be read whole to be fingerprinted")
	}
}

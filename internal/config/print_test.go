package config

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// printCases are files that take each option in each of its forms, and
// values that YAML would read as something else when written plain.
var printCases = map[string]string{
	"homes in three regions": `
policies:
  - name: orders
    match: {methods: [POST], path: {prefix: /orders}}
    scope: {from: header, header: x-tenant}
homes:
  epoch: 4
  default: eu-west
  key_clock_skew: 30s
  rules:
    - {scopes: [acme, 'us-*'], region: us-east}
    - {scopes: [globex], region: ap-south, moved_from: eu-west, moved_at: '2026-11-30T10:00:00Z'}
    - {scopes: [initech], region: us-east, moved_from: ap-south, moved_at: '2026-12-01T08:00:00Z', lost: true}
`,
	"compression": `
policies:
  - name: trained
    match: {methods: [POST]}
    compression:
      dictionary: testdata/orders-40002.zdict
      previous_dictionaries: [testdata/orders-40001.zdict]
  - name: off
    match: {methods: [PUT]}
    compression: {mode: off}
`,
	"every scope and key source": `
defaults:
  retention: 1h30m
  lease: 1500ms
  max_stored_body: 1536
  stored_headers: {deny: [Set-Cookie, x-secret]}
policies:
  - name: regex
    match: {hosts: [API.example.com, '*.example.com:8443'], path: {regex: '^/v[0-9]+/(orders|charges)$'}}
    key: {required: true, warn_until: 2026-03-01}
    scope: {from: principal, peer_identity: dns_san}
    durability: replicated
  - name: offset
    match: {methods: [post], path: {exact: /a}}
    key: {required: true, warn_until: '2026-03-01T09:00:00.5+02:00', header: X-Key, max_length: 64}
    scope: {from: metadata, metadata: {namespace: envoy.filters.http.jwt_authn, path: [jwt_payload, sub]}}
    durability: replicated
    durability_replicas: 2
    durability_timeout: 80ms
    store_failure: fail_open
    on_lease_expiry: reexecute
    on_stream_reset: release
  - name: body
    match:
      route_names: ['true', 'null', '~', '123', 'yes', '0x1F', '- a', '#x']
      json:
        - {pointer: /method, equals: tools/call}
        - {pointer: /a~1b, one_of: ['1', 'no', "it's"]}
    key: {from: [mcp_param, body, derived], param: /params/arguments/payment/idempotency_key, pointer: /idempotency_key, derive: [/params/name, /params/arguments]}
    scope: {from: none}
    fingerprint: {json: true, headers: [X-B, x-a], include: [/params], exclude: [/params/_meta]}
    answers: jsonrpc
    tools: {protect: unless_hinted, hint_ttl: 90s, hint_cache_size: 100}
  - name: rollout
    match: {path: {prefix: /null}}
    enforcement: shadow
    shadow_header: idempotency-shadow
    scope: {from: header, header: X-Tenant}
    wait_for_in_flight: 2s
    retry_after: 3s
    max_request_body: 4KiB
    encrypt: true
    responses:
      - {status: 503, action: release}
      - {status: 5xx, origin: any, action: unknown}
      - {status: 400-404, origin: envoy_not_sent, action: store}
      - {status: 200, origin: envoy_maybe_sent, action: release}
  - name: adopted
    match: {methods: [PUT]}
    adopt_shadow_records: true
    fingerprint: {headers: []}
    responses: []
default_policy:
  enabled: true
  match: {json: [{pointer: /kind, equals: write}]}
  answers: jsonrpc
  tools: {protect: unless_hinted}
`,
	"no default policy": `
policies:
  - name: only
    match: {methods: [POST]}
default_policy: {enabled: false}
`,
	"no listed policy":  "policies: []\n",
	"nothing protected": "policies: []\ndefault_policy: {enabled: false}\n",
	"defaults apply to the default policy": `
defaults:
  key: {from: [derived], derive: [/x]}
  fingerprint: {json: true}
  durability: replicated
`,
}

// TestMarshalRoundTrips: what Marshal writes, Parse reads back as the same
// policies, for the shipped example and for each form of each option.
func TestMarshalRoundTrips(t *testing.T) {
	cases := casesWithExample(t)
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			want, err := Parse("in.yaml", []byte(doc))
			if err != nil {
				t.Fatalf("the case does not load: %v", err)
			}
			roundTrip(t, want)
		})
	}
}

func roundTrip(t *testing.T, want *policy.Set) {
	t.Helper()
	out, err := Marshal(want)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	got, err := Parse("printed.yaml", out)
	if err != nil {
		t.Fatalf("the printout does not load: %v\n%s", err, out)
	}
	if reflect.DeepEqual(got, want) {
		return
	}
	if len(got.Policies) != len(want.Policies) {
		t.Fatalf("%d policies printed and read back, want %d\n%s", len(got.Policies), len(want.Policies), out)
	}
	for i := range want.Policies {
		if !reflect.DeepEqual(got.Policies[i], want.Policies[i]) {
			t.Errorf("policy %q differs once printed and read back:\n got %+v\nwant %+v", want.Policies[i].Name, *got.Policies[i], *want.Policies[i])
		}
	}
	t.Logf("printout:\n%s", out)
}

// TestMarshalWritesEveryOption walks the file's schema (the yaml tags Parse
// reads) and finds each option of a policy set in some printout of
// printCases and the example: an option added to the file cannot be left
// out of `config check`. Only what Parse reads as another option's
// spelling is never written.
func TestMarshalWritesEveryOption(t *testing.T) {
	never := map[string]string{
		"match.json.equals": "read as one_of with one value, and written so",
	}
	docs := []string{}
	for _, d := range printCases {
		docs = append(docs, d)
	}
	ex, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, string(ex))
	written := map[string]bool{}
	for _, d := range docs {
		set, err := Parse("in.yaml", []byte(d))
		if err != nil {
			t.Fatal(err)
		}
		doc, err := unparse(set)
		if err != nil {
			t.Fatal(err)
		}
		marks := map[string]bool{}
		setPaths(reflect.ValueOf(doc).Elem(), "", marks)
		for p := range marks {
			written[generic(p)] = true
		}
	}
	var all []string
	leafPaths(reflect.TypeFor[document](), "", &all)
	if len(all) < 40 {
		t.Fatalf("found only %d options: has the schema's shape changed?", len(all))
	}
	for _, p := range all {
		if strings.HasPrefix(p, "defaults.") {
			continue // every setting is written in each policy
		}
		g := generic(p)
		if why, ok := never[g]; ok {
			if written[g] {
				t.Errorf("%s is written, though %s", p, why)
			}
			continue
		}
		if !written[g] {
			t.Errorf("no printout writes %s", p)
		}
	}
}

// generic names an option of a policy alike for a listed policy and the
// default policy, which hold the same settings and match; name and enabled
// stay their own.
func generic(path string) string {
	if path == "policies.name" || path == "default_policy.enabled" {
		return path
	}
	return strings.TrimPrefix(strings.TrimPrefix(path, "policies."), "default_policy.")
}

var leafType = map[reflect.Type]bool{reflect.TypeFor[scalar](): true, reflect.TypeFor[scalars](): true}

// leafPaths appends the dotted yaml path of every option under t.
func leafPaths(t reflect.Type, prefix string, out *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		path := prefix + tag
		if opts == "inline" {
			path = strings.TrimSuffix(prefix, ".")
		}
		switch ft := f.Type; {
		case leafType[ft]:
			*out = append(*out, path)
		case ft.Kind() == reflect.Slice:
			leafPaths(ft.Elem(), path+".", out)
		case ft.Kind() == reflect.Struct:
			if path == "" {
				leafPaths(ft, "", out)
			} else {
				leafPaths(ft, path+".", out)
			}
		}
	}
}

// setPaths marks the dotted yaml path of every option v sets.
func setPaths(v reflect.Value, prefix string, out map[string]bool) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		path := prefix + tag
		if opts == "inline" {
			path = strings.TrimSuffix(prefix, ".")
		}
		fv := v.Field(i)
		switch ft := f.Type; {
		case ft == reflect.TypeFor[scalar]():
			if fv.FieldByName("Set").Bool() {
				out[path] = true
			}
		case ft == reflect.TypeFor[scalars]():
			if fv.FieldByName("Set").Bool() {
				out[path] = true
			}
		case ft.Kind() == reflect.Slice:
			for j := range fv.Len() {
				setPaths(fv.Index(j), path+".", out)
			}
		case ft.Kind() == reflect.Struct:
			if path == "" {
				setPaths(fv, "", out)
			} else {
				setPaths(fv, path+".", out)
			}
		}
	}
}

// TestMarshalRefusesWhatAFileCannotSay: a set no file could produce is an
// error, never a printout that loads as other policies.
func TestMarshalRefusesWhatAFileCannotSay(t *testing.T) {
	noBuiltin := policy.Default()
	noBuiltin.Name = "x"
	noBuiltin.ResponseRules = []idem.ResponseRule{{Origin: idem.OriginUpstream, MinStatus: 100, MaxStatus: 599, Action: idem.ActionStore}}
	wide := policy.Default()
	wide.Name = "y"
	wide.ResponseRules = append([]idem.ResponseRule{{Origin: idem.OriginNotSent, MinStatus: 0, MaxStatus: 999, Action: idem.ActionStore}}, idem.DefaultResponseRules()...)
	for name, tc := range map[string]struct {
		set  *policy.Set
		want string
	}{
		"without the built-in rules": {&policy.Set{Policies: []*policy.Policy{noBuiltin}}, "do not end with the built-in ones"},
		"a status no file writes":    {&policy.Set{Policies: []*policy.Policy{wide}}, "outside 100-599"},
		"the default policy first":   {&policy.Set{Policies: []*policy.Policy{policy.Default(), wide}}, "must come last"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Marshal(tc.set); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Marshal: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestDurabilityDefaultsAreInForce: a replicated policy that names neither
// durability_replicas nor durability_timeout holds the values the store
// uses (1 and 50ms), so that config check shows them.
func TestDurabilityDefaultsAreInForce(t *testing.T) {
	set, err := Parse("in.yaml", []byte("defaults: {durability: replicated}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := set.Policies[0]
	if p.DurabilityReplicas != policy.DefaultDurabilityReplicas || p.DurabilityTimeout != policy.DefaultDurabilityTimeout {
		t.Fatalf("replicas %d, timeout %v; want %d and %v", p.DurabilityReplicas, p.DurabilityTimeout,
			policy.DefaultDurabilityReplicas, policy.DefaultDurabilityTimeout)
	}
}

// TestDescribeLoadsAsTheSameSettings: for each policy of printCases and the
// example, Describe writes one line per setting it covers, and those lines,
// loaded as a policy file, give a policy with the same match, key, scope,
// fingerprint, retention, store failure, waiting, enforcement, answers and
// response rules: it says what the policy in force does, in the file's own
// words.
func TestDescribeLoadsAsTheSameSettings(t *testing.T) {
	cases := casesWithExample(t)
	type described struct {
		Match                                  policy.Match
		Key                                    policy.KeyRules
		Scope                                  policy.Scope
		FingerprintHeaders                     []string
		FingerprintJSON                        bool
		FingerprintInclude, FingerprintExclude any
		Retention, WaitForInFlight             any
		FailureMode                            policy.FailureMode
		Enforcement                            policy.Enforcement
		Answers                                policy.Answers
		ResponseRules                          []idem.ResponseRule
	}
	what := func(p *policy.Policy) described {
		return described{p.Match, p.KeyRules, p.Scope, p.FingerprintHeaders, p.FingerprintJSON, p.FingerprintInclude,
			p.FingerprintExclude, p.Retention, p.WaitForInFlight, p.FailureMode, p.Enforcement, p.Answers, p.ResponseRules}
	}
	n := 0
	for name, doc := range cases {
		set, err := Parse("in.yaml", []byte(doc))
		if err != nil {
			t.Fatalf("%s: the case does not load: %v", name, err)
		}
		for _, p := range set.Policies {
			out, err := Describe(p)
			if err != nil {
				t.Fatalf("%s: Describe(%q): %v", name, p.Name, err)
			}
			lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			if len(lines) != 11 {
				t.Errorf("%s: policy %q: %d lines, want one per setting (11):\n%s", name, p.Name, len(lines), out)
			}
			// Loaded back: a listed policy, or the default policy under
			// its own key (a listed policy cannot be named default).
			file := "policies:\n"
			for i, l := range lines {
				if i == 0 {
					file += "  - " + l + "\n"
				} else {
					file += "    " + l + "\n"
				}
			}
			file += "default_policy: {enabled: false}\n"
			if p.Name == policy.DefaultPolicyName {
				file = "policies: []\ndefault_policy:\n  enabled: true\n"
				for _, l := range lines[1:] {
					file += "  " + l + "\n"
				}
			}
			back, err := Parse("described.yaml", []byte(file))
			if err != nil {
				t.Errorf("%s: policy %q: the description does not load: %v\n%s", name, p.Name, err, file)
				continue
			}
			if got, want := what(back.Policies[0]), what(p); !reflect.DeepEqual(got, want) {
				t.Errorf("%s: policy %q: described as\n%s\nwhich loads as %+v\nwant %+v", name, p.Name, out, got, want)
			}
			n++
		}
	}
	if n < 10 {
		t.Fatalf("only %d policies described", n)
	}
}

// casesWithExample is printCases and the shipped example, by name.
func casesWithExample(t *testing.T) map[string]string {
	t.Helper()
	cases := map[string]string{}
	for k, v := range printCases {
		cases[k] = v
	}
	ex, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	cases["example"] = string(ex)
	return cases
}

// TestHomesPrintedWhole: config check shows the homes map as it is
// judged: key_clock_skew even at its default, and moved_at to the
// fraction of a second the file gave.
func TestHomesPrintedWhole(t *testing.T) {
	set, err := Parse("in.yaml", []byte(`
policies: []
homes:
  epoch: 2
  default: eu
  rules:
    - {scopes: [acme], region: us, moved_from: eu, moved_at: '2026-11-30T10:00:00.25+01:00'}
`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"key_clock_skew: 1m", "moved_at: \"2026-11-30T09:00:00.25Z\""} {
		if !strings.Contains(string(out), want) {
			t.Errorf("config check prints no %q:\n%s", want, out)
		}
	}
	again, err := Parse("out.yaml", out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := again.Homes.Rules[0].MovedAt, set.Homes.Rules[0].MovedAt; !got.Equal(want) {
		t.Errorf("moved_at read back %v, want %v", got, want)
	}
}

package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/compress"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

const example = "../../examples/policies.yaml"

func TestExampleConfigLoads(t *testing.T) {
	set, err := Load(example)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, p := range set.Policies {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "payments,orders,internal,mcp-tools,default" {
		t.Fatalf("policies %v", names)
	}
	pay := set.Policies[0]
	if !pay.KeyRequired || pay.MaxKeyLength != 64 || pay.Retention != 72*time.Hour || !pay.FingerprintJSON ||
		pay.Scope.Source != policy.ScopeMetadata || pay.Scope.Namespace != "envoy.filters.http.jwt_authn" ||
		strings.Join(pay.Scope.Path, ".") != "jwt_payload.sub" || pay.WaitForInFlight != 2*time.Second ||
		strings.Join(pay.FingerprintHeaders, ",") != "content-type,x-api-version" || pay.Lease != 30*time.Second ||
		!pay.Encrypt {
		t.Fatalf("payments = %+v", pay)
	}
	if n, d := pay.WaitReplicas(); n != 1 || d != policy.DefaultDurabilityTimeout {
		t.Fatalf("payments durability = %d replicas, %v", n, d)
	}
	if a := idem.DecideResponse(pay.ResponseRules, idem.OriginUpstream, 503); a != idem.ActionUnknown {
		t.Fatalf("payments 503 -> %v, want unknown", a)
	}
	if a := idem.DecideResponse(pay.ResponseRules, idem.OriginUpstream, 429); a != idem.ActionRelease {
		t.Fatalf("payments 429 -> %v, want the default release", a)
	}
	if !pay.Match.Matches(policy.Request{Method: "POST", Authority: "eu.pay.example.com:443", Path: "/v1/charges/abc"}) {
		t.Fatal("payments should match a charge")
	}
	if set.Policies[1].FailureMode != policy.FailOpen || set.Policies[1].Scope.Header != "x-tenant-id" {
		t.Fatalf("orders = %+v", set.Policies[1])
	}
	if set.Policies[2].LeaseExpiry != idem.LeaseExpiryReexecute || set.Policies[2].Scope.Source != policy.ScopePrincipal {
		t.Fatalf("internal = %+v", set.Policies[2])
	}
	if d := set.Policies[4]; d.Name != "default" || d.KeyRequired || d.Scope.Source != policy.ScopeAuthority {
		t.Fatalf("default = %+v", d)
	}
	for _, p := range set.Policies {
		if p.Enforcement != policy.EnforcementEnforce || p.ShadowHeader != "" || p.AdoptShadowRecords || !p.KeyWarnUntil.IsZero() {
			t.Fatalf("%s: the example's rollout settings are the defaults: %+v", p.Name, p)
		}
	}
}

// TestExplicitlyEmptyListIsTheDefault: `policies: []` names no policy of
// its own, so the default policy alone protects.
func TestExplicitlyEmptyListIsTheDefault(t *testing.T) {
	set, err := Parse("empty.yaml", []byte("policies: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Policies) != 1 || set.Policies[0].Name != "default" {
		t.Fatalf("%+v", set.Policies)
	}
	got, want := *set.Policies[0], *policy.Default()
	if got.Retention != want.Retention || got.Lease != want.Lease || strings.Join(got.Match.Methods, ",") != "POST,PATCH" {
		t.Fatalf("%+v", got)
	}
}

func TestDefaultsApplyToEveryPolicy(t *testing.T) {
	set, err := Parse("c.yaml", []byte(`
defaults:
  retention: 1h
  key: {required: true}
policies:
  - name: a
    match: {methods: [POST]}
    retention: 2h
default_policy:
  enabled: false
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Policies) != 1 {
		t.Fatalf("default_policy.enabled: false kept %d policies", len(set.Policies))
	}
	if p := set.Policies[0]; p.Retention != 2*time.Hour || !p.KeyRequired {
		t.Fatalf("%+v", p)
	}
}

// TestMistakesNameFileLineAndField: each kind of mistake stops the load with
// a message naming the file, the line and the field.
func TestMistakesNameFileLineAndField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "policies:\n  - name: a\n    match: {methods: [POST]}\n    retentoin: 1h\n", []string{"bad.yaml:4:", "policies[0].retentoin: unknown field; did you mean retention?"}},
		{"unknown nested field", "defaults:\n  key:\n    requierd: true\n", []string{"bad.yaml:3:", "defaults.key.requierd: unknown field; did you mean required?"}},
		{"unknown top-level field", "polices: []\n", []string{"bad.yaml:1:", "polices: unknown field; did you mean policies?"}},
		{"unknown field like no other", "defaults:\n  colour: blue\n", []string{"bad.yaml:2:", "defaults.colour: unknown field"}},
		{"mapping where a value belongs", "defaults:\n  retention: {hours: 2}\n", []string{"bad.yaml:2:", "defaults.retention: expected a single value, found a mapping"}},
		{"value where a mapping belongs", "defaults:\n  key: Idempotency-Key\n", []string{"bad.yaml:2:", "defaults.key: expected a mapping, found a scalar"}},
		{"mapping where a list belongs", "defaults:\n  responses: {status: 500, action: store}\n", []string{"bad.yaml:2:", "defaults.responses: expected a list, found a mapping"}},
		{"bad duration", "defaults:\n  lease: 30 seconds\n", []string{"bad.yaml:2:", "defaults.lease", `"30 seconds" is not a duration`}},
		{"duration too small", "defaults:\n  retry_after: 10ms\n", []string{"bad.yaml:2:", "defaults.retry_after", "minimum"}},
		{"bad regex", "policies:\n  - name: a\n    match:\n      path: {regex: '^/v1/(orders'}\n", []string{"bad.yaml:4:", "policies[0].match.path.regex", "invalid regular expression"}},
		{"two path matchers", "policies:\n  - name: a\n    match:\n      path: {prefix: /a, exact: /a}\n", []string{"bad.yaml:4:", "policies[0].match.path", "only one"}},
		{"lease outlives retention", "policies:\n  - name: a\n    match: {methods: [POST]}\n    retention: 10s\n    lease: 30s\n", []string{"bad.yaml:5:", "policies[0].lease", "shorter than retention"}},
		{"lease from defaults outlives retention", "defaults:\n  lease: 2h\n  retention: 1h\n", []string{"bad.yaml:2:", "default_policy.lease"}},
		{"header scope without header", "policies:\n  - name: a\n    match: {methods: [POST]}\n    scope: {from: header}\n", []string{"bad.yaml:4:", "policies[0].scope.header", "required"}},
		{"metadata scope without path", "defaults:\n  scope:\n    from: metadata\n    metadata: {namespace: envoy.filters.http.jwt_authn}\n", []string{"bad.yaml:3:", "defaults.scope.metadata"}},
		{"header given to another scope", "defaults:\n  scope: {from: principal, header: x-tenant}\n", []string{"bad.yaml:2:", "defaults.scope.header", "only used with from: header"}},
		{"unknown scope", "defaults:\n  scope: {from: cookie}\n", []string{"bad.yaml:2:", "defaults.scope.from", `"cookie"`}},
		{"bad peer identity", "defaults:\n  scope: {from: principal, peer_identity: spiffe}\n", []string{"bad.yaml:2:", "defaults.scope.peer_identity", `"spiffe"`}},
		{"peer identity given to another scope", "defaults:\n  scope: {from: header, header: x-t, peer_identity: dns_san}\n", []string{"bad.yaml:2:", "defaults.scope.peer_identity", "only used with from: principal"}},
		{"missing name", "policies:\n  - match: {methods: [POST]}\n", []string{"bad.yaml:2:", "policies[0].name", "missing"}},
		{"duplicate name", "policies:\n  - name: a\n    match: {methods: [POST]}\n  - name: a\n    match: {methods: [PUT]}\n", []string{"bad.yaml:4:", "policies[1].name", "already"}},
		{"reserved name", "policies:\n  - name: default\n    match: {methods: [POST]}\n", []string{"bad.yaml:2:", "policies[0].name"}},
		{"empty match", "policies:\n  - name: a\n", []string{"bad.yaml:2:", "policies[0].match", "empty"}},
		{"bad host", "policies:\n  - name: a\n    match: {hosts: ['api.*.com']}\n", []string{"bad.yaml:3:", "policies[0].match.hosts[0]"}},
		{"bad method", "policies:\n  - name: a\n    match: {methods: ['PO ST']}\n", []string{"bad.yaml:3:", "policies[0].match.methods[0]"}},
		{"bad status", "defaults:\n  responses:\n    - {status: 6xx, action: store}\n", []string{"bad.yaml:3:", "defaults.responses[0].status"}},
		{"bad action", "defaults:\n  responses:\n    - {status: 500, action: keep}\n", []string{"bad.yaml:3:", "defaults.responses[0].action"}},
		{"bad origin", "defaults:\n  responses:\n    - {status: 500, origin: proxy, action: store}\n", []string{"bad.yaml:3:", "defaults.responses[0].origin"}},
		{"store on stream reset", "defaults:\n  on_stream_reset: store\n", []string{"bad.yaml:2:", "defaults.on_stream_reset"}},
		{"bad lease expiry", "defaults:\n  on_lease_expiry: retry\n", []string{"bad.yaml:2:", "defaults.on_lease_expiry"}},
		{"bad failure mode", "defaults:\n  store_failure: open\n", []string{"bad.yaml:2:", "defaults.store_failure"}},
		{"bad size", "defaults:\n  max_stored_body: 1MB\n", []string{"bad.yaml:2:", "defaults.max_stored_body"}},
		{"zero request body", "defaults:\n  max_request_body: 0\n", []string{"bad.yaml:2:", "max_request_body", "positive"}},
		{"key length over 255", "defaults:\n  key: {max_length: 300}\n", []string{"bad.yaml:2:", "defaults.key.max_length"}},
		{"bad boolean", "defaults:\n  key: {required: yes please}\n", []string{"bad.yaml:2:", "defaults.key.required"}},
		{"list where a value belongs", "defaults:\n  lease: [30s]\n", []string{"bad.yaml:2:", "defaults.lease: expected a single value, found a list"}},
		{"bad durability", "defaults:\n  durability: quorum\n", []string{"bad.yaml:2:", "defaults.durability"}},
		{"durability replicas without replicated", "defaults:\n  durability_replicas: 2\n", []string{"bad.yaml:2:", ".durability", "need durability: replicated"}},
		{"durability wait too long", "defaults:\n  durability: replicated\n  durability_timeout: 2s\n", []string{"bad.yaml:3:", "durability_timeout"}},
		{"bad enforcement", "defaults:\n  enforcement: audit\n", []string{"bad.yaml:2:", "defaults.enforcement", `"audit" is not off, shadow or enforce`}},
		{"bad shadow header", "defaults:\n  shadow_header: 'x shadow'\n", []string{"bad.yaml:2:", "defaults.shadow_header"}},
		{"envoy's shadow header", "defaults:\n  shadow_header: x-envoy-shadow\n", []string{"bad.yaml:2:", "defaults.shadow_header"}},
		{"bad warn_until", "defaults:\n  key: {required: true, warn_until: next monday}\n", []string{"bad.yaml:2:", "defaults.key.warn_until", "RFC 3339"}},
		{"warn_until without required", "policies:\n  - name: a\n    match: {methods: [POST]}\n    key:\n      warn_until: 2026-03-01\n", []string{"bad.yaml:5:", "policies[0].key.warn_until", "key.required: true"}},
		{"adopt in shadow", "policies:\n  - name: a\n    match: {methods: [POST]}\n    enforcement: shadow\n    adopt_shadow_records: true\n", []string{"bad.yaml:5:", "policies[0].adopt_shadow_records", "enforcement: enforce"}},
		{"bad compression mode", "defaults:\n  compression: {mode: gzip}\n", []string{"bad.yaml:2:", "defaults.compression.mode", `"gzip" is not one of auto, zstd, s2, off`}},
		{"s2 with a trained dictionary", "policies:\n  - name: a\n    match: {methods: [POST]}\n    compression:\n      mode: s2\n      dictionary: testdata/orders-40002.zdict\n",
			[]string{"bad.yaml:6:", "policies[0].compression", "testdata/orders-40002.zdict is a zstd dictionary, which S2 cannot use"}},
		{"missing dictionary", "policies:\n  - name: a\n    match: {methods: [POST]}\n    compression:\n      dictionary: testdata/none.zdict\n",
			[]string{"bad.yaml:5:", "policies[0].compression.dictionary", "testdata/none.zdict", "no such file"}},
		{"not a dictionary", "defaults:\n  compression:\n    previous_dictionaries: [testdata/three-mistakes.yaml]\n",
			[]string{"bad.yaml:3:", "default_policy.compression.previous_dictionaries[0]", "not a zstd dictionary"}},
		{"empty dictionary name", "defaults:\n  compression: {dictionary: ''}\n", []string{"bad.yaml:2:", "defaults.compression.dictionary", "empty"}},
		{"tools on an HTTP policy", "policies:\n  - name: a\n    match: {methods: [POST]}\n    tools: {protect: unless_hinted}\n", []string{"bad.yaml:4:", "policies[0].tools.protect", "answers: jsonrpc"}},
		{"bad tools.protect", "defaults:\n  answers: jsonrpc\n  tools: {protect: hinted}\n", []string{"bad.yaml:3:", "defaults.tools.protect", `"hinted" is not`}},
		{"hint_ttl without unless_hinted", "policies:\n  - name: a\n    match: {methods: [POST]}\n    answers: jsonrpc\n    tools:\n      hint_ttl: 1m\n", []string{"bad.yaml:6:", "policies[0].tools", "tools.protect: unless_hinted"}},
		{"bad hint_cache_size", "defaults:\n  answers: jsonrpc\n  tools: {protect: unless_hinted, hint_cache_size: 0}\n", []string{"bad.yaml:3:", "defaults.tools.hint_cache_size", "from 1 to"}},
		{"short hint_ttl", "defaults:\n  answers: jsonrpc\n  tools: {protect: unless_hinted, hint_ttl: 10ms}\n", []string{"bad.yaml:3:", "defaults.tools.hint_ttl", "minimum"}},
		{"advertise without unless_hinted", "policies:\n  - name: a\n    match: {methods: [POST]}\n    answers: jsonrpc\n    tools:\n      advertise_idempotent: true\n", []string{"bad.yaml:6:", "policies[0].tools.advertise_idempotent", "unless_hinted"}},
		{"advertise with an optional header key", "policies:\n  - name: a\n    match: {methods: [POST]}\n    answers: jsonrpc\n    tools:\n      protect: unless_hinted\n      advertise_idempotent: true\n",
			[]string{"bad.yaml:7:", "policies[0].tools.advertise_idempotent", "same arguments", "key.required: true"}},
		{"advertise with a required key in its grace period", "defaults:\n  answers: jsonrpc\n  key: {required: true, warn_until: 2030-01-01}\n  tools: {protect: unless_hinted, advertise_idempotent: true}\n",
			[]string{"bad.yaml:4:", "default_policy.tools.advertise_idempotent", "without key.warn_until"}},
		{"advertise with a key derived from more than the arguments", "defaults:\n  answers: jsonrpc\n  key: {from: [derived], derive: [/params/name, /params/arguments, /id]}\n  tools: {protect: unless_hinted, advertise_idempotent: true}\n",
			[]string{"bad.yaml:4:", "default_policy.tools.advertise_idempotent"}},
		{"advertise with a header key before the derived one", "defaults:\n  answers: jsonrpc\n  key: {from: [header, derived], derive: [/params/name, /params/arguments]}\n  tools: {protect: unless_hinted, advertise_idempotent: true}\n",
			[]string{"bad.yaml:4:", "default_policy.tools.advertise_idempotent"}},
		{"mcp_headers on an HTTP policy", "policies:\n  - name: a\n    match: {methods: [POST]}\n    mcp_headers: trust\n", []string{"bad.yaml:4:", "policies[0].mcp_headers", "answers: jsonrpc"}},
		{"mcp_param without key.param", "policies:\n  - name: a\n    match: {methods: [POST]}\n    answers: jsonrpc\n    key: {from: [mcp_param]}\n", []string{"bad.yaml:5:", "policies[0].key.param", "required"}},
		{"key.param outside the arguments", "policies:\n  - name: a\n    match: {methods: [POST]}\n    answers: jsonrpc\n    key: {from: [mcp_param], param: /params/name}\n", []string{"bad.yaml:5:", "policies[0].key.param", "under /params/arguments"}},
		{"key.param the arguments themselves", "policies:\n  - name: a\n    match: {methods: [POST]}\n    answers: jsonrpc\n    key: {from: [mcp_param], param: /params/arguments}\n", []string{"bad.yaml:5:", "policies[0].key.param", "under /params/arguments"}},
		{"key.param a bare name", "policies:\n  - name: a\n    match: {methods: [POST]}\n    answers: jsonrpc\n    key: {from: [mcp_param], param: idempotency_key}\n", []string{"bad.yaml:5:", "policies[0].key.param", "not a JSON Pointer"}},
		{"not YAML", "defaults: [\n", []string{"bad.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestAllMistakesReportedTogether(t *testing.T) {
	_, err := Parse("bad.yaml", []byte("defaults:\n  lease: soon\n  retention: later\n  store_failure: maybe\n"))
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{"defaults.lease", "defaults.retention", "defaults.store_failure"} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q lacks %s", err, w)
		}
	}
}

// TestWrongValueReportedAlone: a value that does not parse is one mistake,
// reported once; the checks that compare settings do not go on to judge
// the zero it would leave (`lease: 30s must be shorter than retention 0s`
// for every policy after `retention: later`).
func TestWrongValueReportedAlone(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"duration", "defaults:\n  retention: later\n", "bad.yaml:2: defaults.retention: \"later\" is not a duration"},
		{"duration in a policy", "policies:\n  - name: a\n    match: {methods: [POST]}\n    lease: 2 min\n", "bad.yaml:4: policies[0].lease: \"2 min\" is not a duration"},
		{"size", "defaults:\n  max_request_body: 1MB\n", "bad.yaml:2: defaults.max_request_body: \"1MB\" is not a size"},
		{"duration below the minimum", "defaults:\n  retention: 500ms\n", "bad.yaml:2: defaults.retention: 500ms is below the minimum 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if lines := strings.Split(err.Error(), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], tc.want) {
				t.Fatalf("want the one line\n\t%s…\ngot:\n%v", tc.want, err)
			}
		})
	}
}

// TestEveryMistakeInOneLoad: unrelated mistakes in different parts of the
// file (an unknown field in one policy, a bad duration in another, an
// unknown field in default_policy) are all reported by one load, in file
// order, each naming its line and its path, so that fixing a file takes one
// run rather than one per mistake.
func TestEveryMistakeInOneLoad(t *testing.T) {
	doc, err := os.ReadFile("testdata/three-mistakes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse("bad.yaml", doc)
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		"bad.yaml:5: policies[0].match.path.pathprefix: unknown field; did you mean prefix?",
		`bad.yaml:8: policies[1].retention: "2 days" is not a duration`,
		"bad.yaml:11: default_policy.retentoin: unknown field; did you mean retention?",
	}
	wantMistakes(t, err, want)
}

// TestDecodingMistakesDoNotStopTheChecks: a key with no value, a value of
// the wrong kind and an unknown field are found while the file is decoded;
// the rest of the file is still checked and its mistakes reported with
// them, and a field found wrong while decoding is reported once (not again
// as "missing" by the checks that find it unset).
func TestDecodingMistakesDoNotStopTheChecks(t *testing.T) {
	_, err := Parse("bad.yaml", []byte(`policies:
  - name:
    match: {methods: [POST]}
    retentoin: 1h
  - name: [b]
    match: {methods: [POST], path: {regex: '(orders'}}
defaults:
  lease: 2 min
`))
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		"bad.yaml:2: policies[0].name: no value",
		"bad.yaml:4: policies[0].retentoin: unknown field; did you mean retention?",
		"bad.yaml:5: policies[1].name: expected a single value, found a list",
		"bad.yaml:6: policies[1].match.path.regex: invalid regular expression",
		`bad.yaml:8: defaults.lease: "2 min" is not a duration`,
	}
	wantMistakes(t, err, want)
}

// TestMistakesAfterAnEntryLeftOut: yaml.v3 leaves out of a list an entry
// it cannot decode (null, not a mapping, a key twice); the mistakes of the
// entries after it are still named by their place in the file, not by
// their place in what was decoded.
func TestMistakesAfterAnEntryLeftOut(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"a policy that is a value", `policies:
  - orders
  - name: b
    match: {methods: [POST]}
    lease: soon
`, []string{"bad.yaml:2: policies[0]: expected a mapping, found a scalar", `bad.yaml:5: policies[1].lease: "soon" is not a duration`}},
		{"a policy with no value", `policies:
  -
  - name: b
    match: {methods: [POST]}
  - name: b
    match: {methods: [PUT]}
`, []string{"bad.yaml:2: policies[0]: no value", `bad.yaml:5: policies[2].name: "b" is already the name of policies[1]`}},
		{"a policy with a key twice", `policies:
  - name: a
    match: {methods: [POST]}
    lease: 1s
    lease: 2s
  - name: b
    match: {methods: [POST]}
    lease: soon
`, []string{"bad.yaml:5: policies[0].lease: already defined at line 4", `bad.yaml:8: policies[1].lease: "soon" is not a duration`}},
		{"a response rule that is a list", `defaults:
  responses:
    - [500, store]
    - {status: 6xx, action: store}
`, []string{"bad.yaml:3: defaults.responses[0]: expected a mapping, found a list", "bad.yaml:4: defaults.responses[1].status"}},
		{"a body criterion with a key twice", `policies:
  - name: a
    match:
      methods: [POST]
      json:
        - {pointer: /method, equals: a, equals: b}
        - {pointer: method, equals: tools/call}
`, []string{"bad.yaml:6: policies[0].match.json[0].equals: already defined at line 6", `bad.yaml:7: policies[0].match.json[1].pointer: "method" is not a JSON Pointer`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			wantMistakes(t, err, tc.want)
		})
	}
}

// TestUnknownFieldInAMergedMapping: a key yaml.v3 finds unknown through a
// merge (`<<: *anchor`) is where the anchor is written; reported there by
// path, and again, without one, for the policy that merges it.
func TestUnknownFieldInAMergedMapping(t *testing.T) {
	_, err := Parse("bad.yaml", []byte(`defaults: &d
  retentoin: 1h
policies:
  - name: a
    match: {methods: [POST]}
    <<: *d
`))
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:2: defaults.retentoin: unknown field; did you mean retention?") {
		t.Fatalf("error %v", err)
	}
}

func TestSuggest(t *testing.T) {
	known := fieldsOf("config.namedPolicy")
	if !slices.Contains(known, "name") || !slices.Contains(known, "retention") || !slices.Contains(known, "answers") {
		t.Fatalf("the keys of a policy, its inline settings included: %v", known)
	}
	for unknown, want := range map[string]string{
		"retentoin":      "retention", // letters swapped
		"retension":      "retention",
		"retryAfter":     "retry_after", // case and '_'
		"retry-after":    "retry_after",
		"nam":            "name",
		"mach":           "match",
		"lease_duration": "lease", // a key within it
		"timeout":        "",
		"colour":         "",
		"enabled":        "", // a default_policy key, not a policy's
	} {
		if got := suggest(unknown, known); got != want {
			t.Errorf("suggest(%q) = %q, want %q", unknown, got, want)
		}
	}
	if got := suggest("pathprefix", fieldsOf("config.pathMatch")); got != "prefix" {
		t.Errorf("suggest(pathprefix) = %q, want prefix", got)
	}
	if got := fieldsOf("config.nothing"); got != nil {
		t.Errorf("fieldsOf an unknown type = %v", got)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("error %v", err)
	}
}

// TestRolloutSettings: enforcement, shadow_header, key.warn_until (a date
// or a date-time) and adopt_shadow_records, and the record key space each
// enforcement level uses.
func TestRolloutSettings(t *testing.T) {
	set, err := Parse("rollout.yaml", []byte(`
defaults:
  enforcement: shadow
  shadow_header: Idempotency-Shadow
policies:
  - name: watched
    match: {methods: [POST]}
  - name: warned
    match: {methods: [PUT]}
    enforcement: enforce
    key: {required: true, warn_until: 2026-03-01}
  - name: timed
    match: {methods: [PATCH]}
    enforcement: enforce
    adopt_shadow_records: true
    key: {required: true, warn_until: "2026-03-01T09:30:00+01:00"}
default_policy:
  enforcement: off     # unquoted: YAML 1.1 would read a boolean; the value is taken as written
`))
	if err != nil {
		t.Fatal(err)
	}
	watched, warned, timed, def := set.Policies[0], set.Policies[1], set.Policies[2], set.Policies[3]
	if watched.Enforcement != policy.EnforcementShadow || watched.ShadowHeader != "idempotency-shadow" ||
		watched.RecordNamespace() != "watched#shadow" {
		t.Fatalf("watched = %v %q %q", watched.Enforcement, watched.ShadowHeader, watched.RecordNamespace())
	}
	if want := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC); !warned.KeyWarnUntil.Equal(want) ||
		warned.Enforcement != policy.EnforcementEnforce || warned.RecordNamespace() != "warned" {
		t.Fatalf("warned = %v %v %q", warned.KeyWarnUntil, warned.Enforcement, warned.RecordNamespace())
	}
	if !warned.KeyGrace(time.Date(2026, 2, 28, 23, 59, 59, 0, time.UTC)) || warned.KeyGrace(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatal("the grace period should end at the first instant of the date")
	}
	if want := time.Date(2026, 3, 1, 8, 30, 0, 0, time.UTC); !timed.KeyWarnUntil.Equal(want) || timed.RecordNamespace() != "timed#shadow" {
		t.Fatalf("timed = %v %q", timed.KeyWarnUntil, timed.RecordNamespace())
	}
	if def.Enforcement != policy.EnforcementOff || def.Enforcement.String() != "off" {
		t.Fatalf("default = %v", def.Enforcement)
	}
	if d := policy.Default(); d.Enforcement != policy.EnforcementEnforce || d.RecordNamespace() != "default" || d.ShadowHeader != "" {
		t.Fatalf("the built-in default must enforce in its own key space: %v %q", d.Enforcement, d.RecordNamespace())
	}
}

// TestPeerIdentity: scope.peer_identity picks the certificate field a
// principal scope reads; uri_san when unset.
func TestPeerIdentity(t *testing.T) {
	for doc, want := range map[string]policy.PeerIdentity{
		"defaults:\n  scope: {from: principal}\n":                         policy.PeerURISAN,
		"defaults:\n  scope: {from: principal, peer_identity: uri_san}\n": policy.PeerURISAN,
		"defaults:\n  scope: {from: principal, peer_identity: dns_san}\n": policy.PeerDNSSAN,
		"defaults:\n  scope: {from: principal, peer_identity: subject}\n": policy.PeerSubject,
	} {
		set, err := Parse("p.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if got := set.Policies[len(set.Policies)-1].Scope.PeerIdentity; got != want {
			t.Errorf("%q: peer identity %v, want %v", doc, got, want)
		}
	}
}

// wantMistakes checks that err names one mistake a line, each line
// starting with its want, in order.
func wantMistakes(t *testing.T, err error, want []string) {
	t.Helper()
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Errorf("%d lines, want one per mistake (%d):\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if i >= len(lines) || !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: want it to start with\n\t%s\nthe error:\n%v", i+1, w, err)
		}
	}
}

// TestCompression: the compression group gives each policy its codec,
// shared by policies that name the same dictionaries, and two
// dictionaries with one id are a mistake at the line that names the
// second.
func TestCompression(t *testing.T) {
	set, err := Parse("p.yaml", []byte(`
policies:
  - name: trained
    match: {methods: [POST]}
    compression:
      dictionary: testdata/orders-40002.zdict
      previous_dictionaries: [testdata/orders-40001.zdict]
  - name: also-trained
    match: {methods: [PUT]}
    compression:
      dictionary: testdata/orders-40002.zdict
      previous_dictionaries: [testdata/orders-40001.zdict]
  - name: off
    match: {methods: [PATCH]}
    compression: {mode: off}
`))
	if err != nil {
		t.Fatal(err)
	}
	trained, also, off, def := set.Policies[0], set.Policies[1], set.Policies[2], set.Policies[3]
	if trained.Compression.Codec == nil || trained.Compression.Codec != also.Compression.Codec {
		t.Fatal("policies naming the same dictionaries do not share a codec")
	}
	if off.Compression.Mode != compress.Off || def.Compression.Mode != compress.Auto || def.Compression.Codec == nil || off.Compression.Codec == nil {
		t.Fatalf("off %+v, default %+v", off.Compression, def.Compression)
	}
	r := idem.Response{Status: 200, Body: []byte(strings.Repeat(`{"id":"pi_1","object":"payment_intent"}`, 10))}
	z := trained.Compression.Codec.Compress(r)
	if !z.Compressed {
		t.Fatal("the trained policy did not compress")
	}
	// Off writes nothing compressed, and still reads what was.
	if off.Compression.Codec.Compress(r).Compressed {
		t.Fatal("mode off compressed")
	}
	if _, err := def.Compression.Codec.Expand(def.Compression.Codec.Compress(r), 1<<20); err != nil {
		t.Fatal(err)
	}

	other := filepath.Join(t.TempDir(), "other-40001.zdict")
	raw, err := os.ReadFile("testdata/orders-40001.zdict")
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-1] ^= 1 // same id, other content
	if err := os.WriteFile(other, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Parse("bad.yaml", []byte("defaults:\n  compression:\n    dictionary: testdata/orders-40001.zdict\n"+
		"    previous_dictionaries: ["+other+"]\n"))
	if err == nil || !strings.Contains(err.Error(), "bad.yaml:4: default_policy.compression: compress: dictionaries") ||
		!strings.Contains(err.Error(), "same id 40001") {
		t.Fatalf("same id: %v", err)
	}
}

// TestAdvertiseIdempotentAccepted: the hint is accepted where it holds: a
// key every call must carry, or one derived from the tool's name and
// arguments alone.
func TestAdvertiseIdempotentAccepted(t *testing.T) {
	for _, key := range []string{
		"{required: true}",
		"{from: [derived], derive: [/params/arguments, /params/name]}",
	} {
		doc := "defaults:\n  answers: jsonrpc\n  key: " + key + "\n  tools: {protect: unless_hinted, advertise_idempotent: true}\n"
		if _, err := Parse("ok.yaml", []byte(doc)); err != nil {
			t.Errorf("key %s: %v", key, err)
		}
	}
}

package config

import (
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/policy"
)

const mcpPolicy = `
policies:
  - name: mcp-tools
    match:
      methods: [POST]
      path: {exact: /mcp}
      json:
        - {pointer: /method, equals: tools/call}
        - {pointer: /params/name, one_of: [send_email, open_ticket]}
    key:
      from: [header, derived]
      header: idempotency-key
      derive: [/params/name, /params/arguments]
      required: true
    fingerprint:
      json: true
      exclude: [/id, /params/_meta]
    answers: jsonrpc
  - name: square
    match: {methods: [POST], path: {prefix: /v2/payments}}
    key: {from: body, pointer: /idempotency_key, required: true}
    fingerprint: {json: true, include: [/amount_money, /source_id, /note], exclude: [/amount_money/ts]}
`

// TestBodyOptionsParse: the body options' syntax as docs/mcp.md writes it.
func TestBodyOptionsParse(t *testing.T) {
	set, err := Parse("mcp.yaml", []byte(mcpPolicy))
	if err != nil {
		t.Fatal(err)
	}
	mcp, sq := set.Policies[0], set.Policies[1]
	if len(mcp.Match.JSON) != 2 || mcp.Match.JSON[0].Pointer.String() != "/method" ||
		strings.Join(mcp.Match.JSON[0].OneOf, ",") != "tools/call" ||
		strings.Join(mcp.Match.JSON[1].OneOf, ",") != "send_email,open_ticket" {
		t.Fatalf("match.json = %+v", mcp.Match.JSON)
	}
	if len(mcp.KeySources) != 2 || mcp.KeySources[0] != policy.KeyFromHeader || mcp.KeySources[1] != policy.KeyFromDerived ||
		len(mcp.KeyDerive) != 2 || mcp.KeyDerive[1].String() != "/params/arguments" || !mcp.KeyRequired {
		t.Fatalf("key = %+v", mcp.KeyRules)
	}
	// The file excludes two members; a JSON-RPC policy leaves out an MCP
	// continuation's two (policy.ContinuationMembers).
	if mcp.Answers != policy.AnswersJSONRPC || len(mcp.FingerprintExclude) != 4 || !mcp.NeedsBody() {
		t.Fatalf("mcp = %+v", mcp)
	}
	if !sq.KeyFrom(policy.KeyFromBody) || sq.KeyFrom(policy.KeyFromHeader) || sq.KeyPointer.String() != "/idempotency_key" ||
		len(sq.FingerprintInclude) != 3 || sq.Answers != policy.AnswersHTTP || !sq.NeedsBody() {
		t.Fatalf("square = %+v", sq)
	}
	if d := set.Policies[2]; d.NeedsBody() || !d.KeyFrom(policy.KeyFromHeader) {
		t.Fatalf("default = %+v", d)
	}
}

// TestBodyOptionMistakes: each mistake of the body options names its file,
// line and field.
func TestBodyOptionMistakes(t *testing.T) {
	pol := "policies:\n  - name: a\n    match: {methods: [POST]}\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"bad criterion pointer", "policies:\n  - name: a\n    match:\n      methods: [POST]\n      json: [{pointer: method, equals: x}]\n",
			[]string{"bad.yaml:5:", "policies[0].match.json[0].pointer", "not a JSON Pointer"}},
		{"criterion without value", "policies:\n  - name: a\n    match:\n      methods: [POST]\n      json: [{pointer: /method}]\n",
			[]string{"bad.yaml:5:", "policies[0].match.json[0]", "equals or one_of"}},
		{"criterion with both", "policies:\n  - name: a\n    match:\n      methods: [POST]\n      json: [{pointer: /m, equals: x, one_of: [y]}]\n",
			[]string{"bad.yaml:5:", "policies[0].match.json[0]", "one of equals and one_of"}},
		{"unknown key source", pol + "    key: {from: cookie}\n", []string{"bad.yaml:4:", "policies[0].key.from[0]", `"cookie"`}},
		{"source twice", pol + "    key: {from: [header, header]}\n", []string{"bad.yaml:4:", "policies[0].key.from[1]", "twice"}},
		{"body without pointer", pol + "    key: {from: body}\n", []string{"bad.yaml:4:", "policies[0].key.pointer", "required with key.from: body"}},
		{"pointer without body", pol + "    key: {pointer: /k}\n", []string{"bad.yaml:4:", "policies[0].key.pointer", "only used with key.from: body"}},
		{"bad key pointer", pol + "    key: {from: body, pointer: 'k~2'}\n", []string{"bad.yaml:4:", "policies[0].key.pointer", "not a JSON Pointer"}},
		{"derived without members", pol + "    key: {from: derived}\n", []string{"bad.yaml:4:", "policies[0].key.derive", "required"}},
		{"derive without derived", pol + "    key: {derive: [/a]}\n", []string{"bad.yaml:4:", "policies[0].key.derive", "only used with key.from: derived"}},
		{"header without header source", pol + "    key: {from: body, pointer: /k, header: x-key}\n", []string{"bad.yaml:4:", "policies[0].key.header", "only used when key.from lists header"}},
		{"bad fingerprint pointer", pol + "    fingerprint: {json: true, exclude: [id]}\n", []string{"bad.yaml:4:", "policies[0].fingerprint.exclude[0]", "not a JSON Pointer"}},
		{"pointers without json", pol + "    fingerprint: {exclude: [/id]}\n", []string{"bad.yaml:4:", "policies[0].fingerprint.json", "must be true"}},
		{"pointers with json false", pol + "    fingerprint: {json: false, include: [/a]}\n", []string{"bad.yaml:4:", "policies[0].fingerprint.json", "must be true"}},
		{"exclude drops an include", pol + "    fingerprint: {json: true, include: [/a/b], exclude: [/a]}\n", []string{"bad.yaml:4:", "policies[0].fingerprint.exclude", "contradict"}},
		{"exclude outside include", pol + "    fingerprint: {json: true, include: [/a], exclude: [/b]}\n", []string{"bad.yaml:4:", "policies[0].fingerprint.exclude", "changes nothing"}},
		{"bad answers", pol + "    answers: grpc\n", []string{"bad.yaml:4:", "policies[0].answers", `"grpc"`}},
		{"session scopes", pol + "    scope: {from: header, header: Mcp-Session-Id}\n", []string{"bad.yaml:4:", "policies[0].scope.header", "mcp-session-id"}},
		{"session fingerprinted", pol + "    fingerprint: {headers: [content-type, Mcp-Session-Id]}\n", []string{"bad.yaml:4:", "policies[0].fingerprint.headers", "mcp-session-id"}},
		{"session in defaults", "defaults:\n  fingerprint: {headers: [mcp-session-id]}\n", []string{"bad.yaml:2:", "default_policy.fingerprint.headers", "mcp-session-id"}},
		{"session scopes the default policy", "default_policy:\n  scope: {from: header, header: mcp-session-id}\n", []string{"bad.yaml:2:", "default_policy.scope.header"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

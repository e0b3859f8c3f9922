package policy

import (
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/toolhints"
)

func TestMCPHeaders(t *testing.T) {
	p := Default()
	p.Answers, p.MCPHeaders = AnswersJSONRPC, MCPHeadersTrust
	p.Match.JSON = []JSONCriterion{{Pointer: mustPointer("/method"), OneOf: []string{"tools/call"}},
		{Pointer: mustPointer("/params/name"), OneOf: []string{"send_email"}}}
	v := "2026-07-28"
	for _, tc := range []struct {
		h   MCPHeaders
		out bool
	}{
		{MCPHeaders{Version: v, Method: "tools/list", HasMethod: true}, true},
		{MCPHeaders{Version: "2027-01-05", Method: "tools/list", HasMethod: true}, true},
		{MCPHeaders{Version: v, Method: "tools/call", HasMethod: true, Name: "read", HasName: true}, true},
		{MCPHeaders{Version: v, Method: "tools/call", HasMethod: true, Name: "=?base64?c2VuZF9lbWFpbA==?=", HasName: true}, false},
		{MCPHeaders{Version: v, Method: "tools/call", HasMethod: true, Name: "=?base64?!!?=", HasName: true}, false},
		{MCPHeaders{Version: v, Method: "tools/call", HasMethod: true}, false},
		{MCPHeaders{Version: "2025-11-25", Method: "tools/list", HasMethod: true}, false},
		{MCPHeaders{Version: "", Method: "tools/list", HasMethod: true}, false},
		{MCPHeaders{Version: v}, false},
	} {
		if got := p.RuledOutByMCPHeaders(tc.h); got != tc.out {
			t.Errorf("RuledOutByMCPHeaders(%+v) = %v", tc.h, got)
		}
	}
	p.MCPHeaders = MCPHeadersCheck
	if p.RuledOutByMCPHeaders(MCPHeaders{Version: v, Method: "tools/list", HasMethod: true}) {
		t.Error("check mode rules out at the headers")
	}

	call := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send_email"}}`)
	for _, tc := range []struct {
		h        MCPHeaders
		mismatch bool
	}{
		{MCPHeaders{Version: v, Method: "tools/call", HasMethod: true, Name: "send_email", HasName: true}, false},
		{MCPHeaders{Version: v, Method: "tools/call", HasMethod: true, Name: "=?base64?c2VuZF9lbWFpbA==?=", HasName: true}, false},
		{MCPHeaders{Version: v, Method: "tools/list", HasMethod: true}, true},
		{MCPHeaders{Version: v, Method: "tools/call", HasMethod: true, Name: "read", HasName: true}, true},
		{MCPHeaders{Version: v, Method: "tools/call", HasMethod: true}, false}, // the upstream's to answer
		{MCPHeaders{Version: "2025-11-25", Method: "tools/list", HasMethod: true}, false},
	} {
		if got := MCPHeaderMismatch(tc.h, call); got != tc.mismatch {
			t.Errorf("MCPHeaderMismatch(%+v) = %v", tc.h, got)
		}
	}
}

// TestMCPParamMismatch: a policy whose key is a tool parameter checks the
// Mcp-Param header the tool's x-mcp-header mark names (not the
// parameter's name), top-level or nested, against the body, once the
// upstream has listed the tool: a missing header (2026-07-28 and later),
// another value, two lines, characters Value Encoding does not allow and
// a header for an absent or null argument disagree; a Base64 value is
// decoded first. An unlisted tool, or another upstream's list, has no
// header to check. The call is the specification's example request
// (streamable-http.mdx, "Custom Headers from Tool Parameters").
func TestMCPParamMismatch(t *testing.T) {
	now := time.Unix(1000, 0)
	list := `{"jsonrpc":"2.0","id":1,"result":{"tools":[` +
		`{"name":"execute_sql","description":"Execute SQL on Google Cloud Spanner","inputSchema":{"type":"object","properties":{` +
		`"region":{"type":"string","description":"The region to execute the query in","x-mcp-header":"Region"},` +
		`"query":{"type":"string","description":"The SQL query to execute"}},"required":["region","query"]}},` +
		`{"name":"pay","inputSchema":{"type":"object","properties":{"payment":{"type":"object","properties":{"key":{"type":"string","x-mcp-header":"Idempotency-Key"}}}}}}]}}`
	policyFor := func(param string) *Policy {
		p := Default()
		p.Answers, p.KeySources, p.KeyParam = AnswersJSONRPC, []KeySource{KeyFromMCPParam}, mustPointer(param)
		p.PrepareTools()
		l, ok := toolhints.ParseResponse([]byte(list), false)
		if !ok {
			t.Fatal("the list was not read")
		}
		p.Tools.Hints.Learn("up", l.Tools, time.Minute, now)
		return p
	}
	sql := func(args string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},` +
			`"name":"execute_sql","arguments":` + args + `}}`)
	}
	example := sql(`{"region":"us-west1","query":"SELECT * FROM users"}`)
	v := MCPHeaders{Version: "2026-07-28"}
	with := func(h MCPHeaders, kv ...string) MCPHeaders {
		for i := 0; i < len(kv); i += 2 {
			h.Params = append(h.Params, idem.Header{Name: kv[i], Value: kv[i+1]})
		}
		return h
	}
	region := policyFor("/params/arguments/region")
	for _, c := range []struct {
		name     string
		h        MCPHeaders
		upstream string
		body     []byte
		mismatch bool
	}{
		{"the example", with(v, "mcp-param-region", "us-west1"), "up", example, false},
		{"encoded", with(v, "mcp-param-region", "=?base64?dXMtd2VzdDE=?="), "up", example, false},
		{"left out", v, "up", example, true},
		{"left out by an earlier revision", MCPHeaders{}, "up", example, false},
		{"another value", with(v, "mcp-param-region", "eu-west1"), "up", example, true},
		{"another value, earlier revision", with(MCPHeaders{}, "mcp-param-region", "eu-west1"), "up", example, true},
		{"bad Base64", with(v, "mcp-param-region", "=?base64?!!?="), "up", example, true},
		{"twice", with(v, "mcp-param-region", "us-west1", "mcp-param-region", "us-west1"), "up", example, true},
		{"not ASCII", with(v, "mcp-param-region", "us-west1\u00e9"), "up", sql(`{"region":"us-west1\u00e9"}`), true},
		{"the parameter's name is no header", with(v, "mcp-param-query", "us-west1"), "up", example, true},
		{"absent argument", with(v, "mcp-param-region", "us-west1"), "up", sql(`{"query":"x"}`), true},
		{"null argument", with(v, "mcp-param-region", "null"), "up", sql(`{"region":null}`), true},
		{"null argument, no header", v, "up", sql(`{"region":null}`), false},
		{"absent argument, no header", v, "up", sql(`{"query":"x"}`), false},
		{"another upstream's list", with(v, "mcp-param-region", "eu-west1"), "other", example, false},
		{"not a tools/call", v, "up", []byte(`{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"execute_sql","arguments":{"region":"a"}}}`), false},
		{"a tool not listed", v, "up", []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"region":"a"}}}`), false},
	} {
		if got := region.MCPParamMismatch(c.h, c.upstream, c.body, now); (got != "") != c.mismatch {
			t.Errorf("%s: %q", c.name, got)
		}
	}
	if got := region.MCPParamMismatch(v, "up", example, now.Add(time.Minute)); got != "" {
		t.Errorf("an expired list still asks for the header: %q", got)
	}
	// Learning the marks trusts no annotation: a read-only tool stays
	// protected under tools.protect: all.
	l, _ := toolhints.ParseResponse([]byte(`{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"look","annotations":{"readOnlyHint":true}}]}}`), false)
	region.Tools.Hints.Learn("up", l.Tools, time.Minute, now)
	look := []byte(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"look","arguments":{}}}`)
	if region.ToolHinted("up", look, now) || !region.ProtectsTool("up", "look", now) {
		t.Error("a policy that learns marks took a read-only hint")
	}
	nested := policyFor("/params/arguments/payment/key")
	pay := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"pay","arguments":{"payment":{"key":"op-1"}}}}`)
	if got := nested.MCPParamMismatch(with(v, "mcp-param-idempotency-key", "op-1"), "up", pay, now); got != "" {
		t.Errorf("nested: %q", got)
	}
	if got := nested.MCPParamMismatch(with(v, "mcp-param-key", "op-1"), "up", pay, now); got == "" {
		t.Error("nested: a header named after the property was taken for the marked one")
	}
	if got := nested.MCPParamMismatch(with(v, "mcp-param-idempotency-key", "op-2"), "up", pay, now); got == "" {
		t.Error("nested: another value was taken")
	}
}

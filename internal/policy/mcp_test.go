package policy

import "testing"

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

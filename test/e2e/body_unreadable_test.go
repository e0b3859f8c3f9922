package e2e

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// A body the server cannot read (not JSON, not UTF-8, nested deeper than
// its reader goes, a member name twice) may still be a call to another
// reader: the tool servers here read JSON with Go's encoding/json, which
// nests up to 10000 levels, takes the last of two members of one name and
// replaces bytes that are not UTF-8; the MCP Go SDK nests up to 1000
// (go-sdk v1.8.0 internal/json). On a route where a policy that must read
// the body to decide could protect the request, such a body is refused,
// never passed as if it met no criteria.

// deepArgs nests n objects inside the arguments.
func deepArgs(n int) string {
	return `{"to":"a@example.com","x":` + strings.Repeat(`{"a":`, n) + `1` + strings.Repeat(`}`, n) + `}`
}

// unreadable are tools/call bodies of send_email that the server cannot
// read, with the id the refusal must carry ("null" when none can be read).
var unreadable = []struct{ name, body, id string }{
	{"deep", call("1", "send_email", deepArgs(250)), "1"},
	// encoding/json takes the last name: send_email runs.
	{"duplicate", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_weather","name":"send_email","arguments":{}}}`, "2"},
	{"not UTF-8", "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"send_email\",\"arguments\":{\"to\":\"\xff\"}}}", "3"},
	{"trailing comma", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"send_email","arguments":{},}}`, "4"},
	{"not JSON", `method=tools/call&name=send_email`, "null"},
}

// TestUnreadableBodyRefused: under a policy that requires a key, each
// unreadable body is refused with the JSON-RPC parse error -32700 (to the
// call's id when its first bytes carry one; else a null id at HTTP 400),
// and on an HTTP policy with 400 request-body-unreadable; the tool never
// runs, and no store call is made. Readable bodies that meet no criteria
// still pass.
func TestUnreadableBodyRefused(t *testing.T) {
	env, up, cs := startMCP(t, mcpPolicies)
	for _, tc := range unreadable {
		r := env.Post("/mcp", "", tc.body, "x-agent", "a")
		id, code, data := rpcErrorAt(t, r, map[bool]int{true: 400, false: 200}[tc.id == "null"])
		if id != tc.id || code != jsonrpc.CodeParseError || data.Type != problem.TypeBase+problem.BodyUnreadable.Slug || data.Status != 400 || data.Detail == "" {
			t.Errorf("%s: id %s code %d data %+v, want -32700 to id %s", tc.name, id, code, data, tc.id)
		}
	}
	if n := up.count("tools/call/send_email"); n != 0 {
		t.Fatalf("send_email ran %d times from bodies the server cannot read", n)
	}
	// A batch holding a protected call is refused as a whole: batches are
	// never protected, and a server may run the calls in one (the MCP Go
	// SDK's does when MCP-Protocol-Version is absent or before 2025-06-18:
	// go-sdk v1.8.0 mcp/streamable.go servePOST). No id names a batch.
	for _, b := range []string{
		`[` + call("5", "send_email", `{}`) + `]`,
		`[{"jsonrpc":"2.0","id":6,"method":"tools/list"},` + call("7", "send_email", `{}`) + `]`,
		`[{"jsonrpc":"2.0","id":8,"method":"tools/list"},` + unreadable[0].body + `]`,
	} {
		id, code, data := rpcErrorAt(t, env.Post("/mcp", "", b, "x-agent", "a"), 400)
		if id != "null" || code != jsonrpc.CodeParseError || data.Type != problem.TypeBase+problem.BodyUnreadable.Slug {
			t.Errorf("batch %.60s: id %s code %d data %+v, want -32700 to a null id", b, id, code, data)
		}
	}
	if n := up.count("tools/call/send_email"); n != 0 {
		t.Fatalf("send_email ran %d times from a batch", n)
	}
	// No body, a scalar, a batch of calls the policy does not protect and
	// a notification are read, and meet no criteria: they pass.
	for _, b := range []string{"", `"tools/call"`, `[{"jsonrpc":"2.0","id":9,"method":"tools/list"},` + call("10", "get_weather", `{}`) + `]`, `{"jsonrpc":"2.0","method":"notifications/x"}`} {
		if r := env.Post("/mcp", "", b, "x-agent", "a"); r.Status >= 300 {
			t.Fatalf("readable body %q: %d %s", b, r.Status, r.Body)
		}
	}
	if n := cs.calls.Load(); n != 0 {
		t.Fatalf("%d store calls", n)
	}

	httpEnv, httpUp, _ := startMCP(t, strings.Replace(mcpPolicies, "answers: jsonrpc", "answers: http", 1))
	for _, tc := range unreadable {
		p := wantProblem(t, httpEnv.Post("/mcp", "", tc.body, "x-agent", "a"), problem.BodyUnreadable)
		if d, _ := p["detail"].(string); d == "" {
			t.Errorf("%s: no detail", tc.name)
		}
	}
	if n := httpUp.count("tools/call/send_email"); n != 0 {
		t.Fatalf("send_email ran %d times under the HTTP policy", n)
	}
}

// rpcErrorAt decodes a JSON-RPC error answer sent at status.
func rpcErrorAt(t *testing.T, r harness.Reply, status int) (id string, code int, data jsonrpc.ErrorData) {
	t.Helper()
	var m struct {
		ID    json.RawMessage `json:"id"`
		Error *struct {
			Code int               `json:"code"`
			Data jsonrpc.ErrorData `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.Body), &m); err != nil || m.Error == nil {
		t.Fatalf("not a JSON-RPC error (%d %v): %s", r.Status, err, r.Body)
	}
	if r.Status != status || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("JSON-RPC error answered %d %q, want %d application/json: %s", r.Status, r.Header.Get("Content-Type"), status, r.Body)
	}
	return string(m.ID), m.Error.Code, m.Error.Data
}

// TestUnreadableBodyByPolicyMode: what the body could not show decides
// only where it matters. A shadow policy never refuses (it counts
// would_reject); enforcement off passes; an optional key from the header
// passes a request without one, which would pass whatever the body said,
// but refuses one that sends a key (protection asked for and not given);
// an optional derived key refuses, since the body would have yielded the
// key. The first policy that could protect the request decides: a later
// catch-all does not take the body instead.
func TestUnreadableBodyByPolicyMode(t *testing.T) {
	deep := call("1", "send_email", deepArgs(250))
	policy := func(key, extra string) string {
		return `
policies:
  - name: mcp-tools
    match:
      methods: [POST]
      path: {exact: /mcp}
      json: [{pointer: /method, equals: tools/call}, {pointer: /params/name, one_of: [send_email]}]
    key: ` + key + `
    scope: {from: header, header: x-agent}
    answers: jsonrpc
` + extra + `
default_policy: {enabled: false}
`
	}
	catchAll := `  - name: mcp-rest
    match: {methods: [POST], path: {exact: /mcp}}
`
	// A shadow policy first, an enforced one after it: the shadow one
	// protects nothing, so the enforced one still refuses.
	enforcedAfter := `  - name: mcp-enforced
    match:
      methods: [POST]
      path: {exact: /mcp}
      json: [{pointer: /method, equals: tools/call}, {pointer: /params/name, one_of: [send_email]}]
    key: {required: true}
    scope: {from: header, header: x-agent}
    answers: jsonrpc
`
	for _, tc := range []struct {
		name, doc, key string
		refused        bool
		shadowed       bool
	}{
		{"required", policy(`{from: [header, derived], derive: [/params/name, /params/arguments], required: true}`, ""), "", true, false},
		{"shadow", policy(`{required: true}`, "    enforcement: shadow\n"), "", false, true},
		{"off", policy(`{required: true}`, "    enforcement: off\n"), "", false, false},
		{"optional, no key", policy(`{required: false}`, ""), "", false, false},
		{"optional, a key", policy(`{required: false}`, ""), "k-1", true, false},
		{"optional derived", policy(`{from: derived, derive: [/params/name, /params/arguments]}`, ""), "", true, false},
		{"required, then a catch-all", policy(`{required: true}`, catchAll), "k-2", true, false},
		{"shadow, then an enforced one", policy(`{required: true}`, "    enforcement: shadow\n"+enforcedAfter), "", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := observe.NewMetrics()
			up := newRPCServer(t)
			env := harness.Start(t, harness.Options{Policies: policies(t, tc.doc), UpstreamURL: up.srv.URL, Metrics: m})
			r := env.Post("/mcp", tc.key, deep, "x-agent", "a")
			if tc.refused {
				if _, code, _ := rpcError(t, r); code != jsonrpc.CodeParseError {
					t.Fatalf("code %d, want -32700", code)
				}
				if n := up.count("tools/call/send_email"); n != 0 {
					t.Fatalf("send_email ran %d times", n)
				}
				return
			}
			if r.Status != 200 || up.count("tools/call/send_email") != 1 {
				t.Fatalf("%d %s: want the call passed to the tool", r.Status, r.Body)
			}
			if got := counter(t, m, "idem_extproc_shadow_decisions_total", "decision", string(idem.ShadowWouldReject)); (got == 1) != tc.shadowed {
				t.Fatalf("shadow would_reject counted %v times", got)
			}
		})
	}
}

// TestUnreadableBodyKeyFromBody: a policy that reads its key from the body
// and has no body criteria refuses a body it cannot read, even with the
// key optional: the key may be in it. Before, an optional key let such a
// body through unprotected, and a required one answered that the key was
// missing.
func TestUnreadableBodyKeyFromBody(t *testing.T) {
	for _, required := range []string{"false", "true"} {
		env := harness.Start(t, harness.Options{Policies: policies(t, `
policies:
  - name: square
    match: {methods: [POST], path: {prefix: /v2/payments}}
    key: {from: body, pointer: /idempotency_key, required: `+required+`}
default_policy:
  enabled: false
`)})
		r := env.Post("/v2/payments", "", `{"idempotency_key":"pay-1","amount":1,"amount":2}`)
		wantProblem(t, r, problem.BodyUnreadable)
		if n := env.Upstream.Count(nil); n != 0 {
			t.Fatalf("required %s: the upstream ran %d times", required, n)
		}
	}
}

// TestMCPDeepArgumentsRefused: a Go SDK agent whose call nests deeper
// than the server reads (the SDK's own reader takes up to 1000 levels)
// gets -32700 as the call's *jsonrpc.Error, the tool does not run, and
// its session goes on.
func TestMCPDeepArgumentsRefused(t *testing.T) {
	ts := newTools()
	env, _ := mcpEnv(t, mcpPolicy(headerKey, ""), ts, true, harness.Options{})
	a := connect(t, env)
	var deep any = 1.0
	for range 300 {
		deep = map[string]any{"a": deep}
	}
	ctx := withKey("deep-1")
	p := &mcp.CallToolParams{Name: "send_email", Arguments: map[string]any{"to": "joe@example.com"}}
	p.Meta = mcp.Meta{"trace": deep}
	res, err := a.CallTool(ctx, p)
	wantRPCError(t, res, err, jsonrpc.CodeParseError, problem.BodyUnreadable)
	if errors.Is(err, mcp.ErrConnectionClosed) {
		t.Fatalf("CallTool error %v: the agent must see -32700, not a closed connection", err)
	}
	if n := ts.Runs("send_email"); n != 0 {
		t.Fatalf("send_email ran %d times", n)
	}
	if got := a.result(t, ctx, "send_email", map[string]any{"to": "joe@example.com"}); got != "msg-1-to-joe@example.com" {
		t.Fatalf("the next call got %q", got)
	}
	if c := a.wire.call(t, 0); c.status != http.StatusOK {
		t.Fatalf("the refusal went at %d", c.status)
	}
}

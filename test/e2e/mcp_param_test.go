package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// A key drawn from a tool parameter (key.from: mcp_param) through envoysim,
// the real server and a real redis-server, in front of a tool server whose
// tools/list carries x-mcp-header marks. The requests are shaped as the
// specification's own example (modelcontextprotocol,
// docs/specification/2026-07-28/basic/transports/streamable-http.mdx,
// "Custom Headers from Tool Parameters": "Example tool definition" and
// "Resulting HTTP request"; "Value Encoding" for the encoded form).

// sqlTool is the specification's "Example tool definition", as a
// tools/list result.
const sqlTool = `{"tools":[{
  "name": "execute_sql",
  "description": "Execute SQL on Google Cloud Spanner",
  "inputSchema": {
    "type": "object",
    "properties": {
      "region": {
        "type": "string",
        "description": "The region to execute the query in",
        "x-mcp-header": "Region"
      },
      "query": {
        "type": "string",
        "description": "The SQL query to execute"
      }
    },
    "required": ["region", "query"]
  }
}]}`

// sqlCall is the body of the specification's "Resulting HTTP request",
// under JSON-RPC id id.
func sqlCall(id, region string) string {
	return `{
  "jsonrpc": "2.0",
  "id": ` + id + `,
  "method": "tools/call",
  "params": {
    "_meta": {
      "io.modelcontextprotocol/protocolVersion": "2026-07-28",
      "io.modelcontextprotocol/clientInfo": {
        "name": "ExampleClient",
        "version": "1.0.0"
      },
      "io.modelcontextprotocol/clientCapabilities": {}
    },
    "name": "execute_sql",
    "arguments": {
      "region": "` + region + `",
      "query": "SELECT * FROM users"
    }
  }
}`
}

// sqlHeaders are the headers of the "Resulting HTTP request", with
// Mcp-Param-Region: param when param is not empty.
func sqlHeaders(version, param string) []string {
	hs := []string{"Content-Type", "application/json", "MCP-Protocol-Version", version, "Mcp-Method", "tools/call", "Mcp-Name", "execute_sql"}
	if param != "" {
		hs = append(hs, "Mcp-Param-Region", param)
	}
	return hs
}

// paramPolicy protects every tools/call, keyed by the tool parameter at
// param.
func paramPolicy(param string) string {
	return `
policies:
  - name: mcp-tools
    match:
      methods: [POST]
      path: {exact: /mcp}
      json:
        - {pointer: /method, equals: tools/call}
    key:
      from: [mcp_param]
      param: ` + param + `
      required: true
    scope: {from: none}
    fingerprint:
      json: true
      exclude: [/id, /params/_meta]
    answers: jsonrpc
default_policy:
  enabled: false
`
}

// listAt sends a 2026-07-28 tools/list through the proxy, which learns
// the marks from its answer.
func listAt(t *testing.T, env *harness.Env) {
	t.Helper()
	r := env.Post("/mcp", "", listTools("100"), "MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/list")
	if r.Status != 200 || !strings.Contains(r.Body, "x-mcp-header") {
		t.Fatalf("tools/list: %d %s", r.Status, r.Body)
	}
}

// headerMismatch checks that r is HTTP 400 with -32020 to id, as
// "Server Behavior for Custom Headers" has a server answer.
func headerMismatch(t *testing.T, what string, r harness.Reply, id string) {
	t.Helper()
	if got, code, _ := rpcErrorAt(t, r, http.StatusBadRequest); got != id || code != jsonrpc.CodeHeaderMismatch {
		t.Fatalf("%s: id %s code %d, want -32020 to id %s", what, got, code, id)
	}
}

// TestMCPParamFollowsXMCPHeader: once the upstream's tools/list marked
// the key parameter, its Mcp-Param header is the one the mark names, and
// it must agree with the body. The example request is keyed by its
// region (the body's value) and its retry replayed, also with the value
// Base64-encoded; the same call without the header ("Client omits header
// but value is in body": the server "MUST reject the request"), or with
// another value, is answered 400 with -32020 before the tool runs. A call
// of an earlier revision, whose clients mirror nothing, is not asked for
// the header.
func TestMCPParamFollowsXMCPHeader(t *testing.T) {
	env, up, _ := startHints(t, paramPolicy("/params/arguments/region"), sqlTool, nil)
	listAt(t, env)
	first := env.Post("/mcp", "", sqlCall("1", "us-west1"), sqlHeaders("2026-07-28", "us-west1")...)
	if first.Status != 200 || up.ran("execute_sql") != 1 {
		t.Fatalf("the example request: %d %s, runs %d", first.Status, first.Body, up.ran("execute_sql"))
	}
	for _, tc := range []struct {
		what, id, version, param string
	}{
		{"its retry", "2", "2026-07-28", "us-west1"},
		{"its retry, the header encoded", "3", "2026-07-28", "=?base64?dXMtd2VzdDE=?="},
		{"its retry at 2025-11-25, no header", "4", "2025-11-25", ""},
	} {
		r := env.Post("/mcp", "", sqlCall(tc.id, "us-west1"), sqlHeaders(tc.version, tc.param)...)
		if r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(r.Body, `"id":`+tc.id+`,`) {
			t.Fatalf("%s: %d %v %s", tc.what, r.Status, r.Header, r.Body)
		}
	}
	headerMismatch(t, "no Mcp-Param-Region", env.Post("/mcp", "", sqlCall("5", "us-west1"), sqlHeaders("2026-07-28", "")...), "5")
	headerMismatch(t, "another region", env.Post("/mcp", "", sqlCall("6", "us-west1"), sqlHeaders("2026-07-28", "eu-west1")...), "6")
	twice := append(sqlHeaders("2026-07-28", "us-west1"), "Mcp-Param-Region", "us-west1")
	headerMismatch(t, "Mcp-Param-Region twice", env.Post("/mcp", "", sqlCall("7", "us-west1"), twice...), "7")
	if n := up.ran("execute_sql"); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// TestMCPParamNested: a marked parameter nested in an object is read at
// its path (/params/arguments/payment/key), its header named by the mark
// ("Nested object properties are permitted as long as every step in the
// chain is a properties key", "Schema Extension").
func TestMCPParamNested(t *testing.T) {
	const payTool = `{"tools":[{"name":"pay","inputSchema":{"type":"object","properties":{"payment":{"type":"object",` +
		`"properties":{"key":{"type":"string","x-mcp-header":"Idempotency-Key"},"amount":{"type":"integer"}}}}}}]}`
	env, up, _ := startHints(t, paramPolicy("/params/arguments/payment/key"), payTool, nil)
	listAt(t, env)
	args := `{"payment":{"key":"op-1","amount":5}}`
	hs := []string{"MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/call", "Mcp-Name", "pay"}
	first := env.Post("/mcp", "", call("1", "pay", args), append(hs, "Mcp-Param-Idempotency-Key", "op-1")...)
	retry := env.Post("/mcp", "", call("2", "pay", args), append(hs, "Mcp-Param-Idempotency-Key", "op-1")...)
	if first.Status != 200 || retry.Header.Get("Idempotent-Replayed") != "true" || up.ran("pay") != 1 {
		t.Fatalf("first %d %s, retry %d %v %s, runs %d", first.Status, first.Body, retry.Status, retry.Header, retry.Body, up.ran("pay"))
	}
	headerMismatch(t, "the property's name as the header", env.Post("/mcp", "", call("3", "pay", args), append(hs, "Mcp-Param-Key", "op-1")...), "3")
	headerMismatch(t, "another key in the header", env.Post("/mcp", "", call("4", "pay", args), append(hs, "Mcp-Param-Idempotency-Key", "op-2")...), "4")
	if n := up.ran("pay"); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// TestMCPParamBeforeTheList: a server that has not seen the upstream's
// tools/list does not know which header mirrors the parameter, so it
// checks none, and drops no protection: the key is the body's value, and
// the retry of the call, with or without a header, is replayed.
func TestMCPParamBeforeTheList(t *testing.T) {
	env, up, _ := startHints(t, paramPolicy("/params/arguments/region"), sqlTool, nil)
	first := env.Post("/mcp", "", sqlCall("1", "us-west1"), sqlHeaders("2026-07-28", "")...)
	retry := env.Post("/mcp", "", sqlCall("2", "us-west1"), sqlHeaders("2026-07-28", "us-west1")...)
	if first.Status != 200 || retry.Header.Get("Idempotent-Replayed") != "true" || up.ran("execute_sql") != 1 {
		t.Fatalf("first %d %s, retry %d %v %s, runs %d", first.Status, first.Body, retry.Status, retry.Header, retry.Body, up.ran("execute_sql"))
	}
	other := env.Post("/mcp", "", sqlCall("3", "eu-west1"), sqlHeaders("2026-07-28", "")...)
	if other.Status != 200 || other.Header.Get("Idempotent-Replayed") != "" || up.ran("execute_sql") != 2 {
		t.Fatalf("another region: %d %v %s", other.Status, other.Header, other.Body)
	}
}

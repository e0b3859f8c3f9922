package e2e

import (
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// twoToolPolicies defers every POST to /mcp under mcp-tools (no body
// limit of its own: the default 1 MiB), whose criteria name send_email;
// blobs, the next policy, takes upload_blob under a 4 KiB limit. ANSWERS is
// the answers of both.
const twoToolPolicies = `
policies:
  - name: mcp-tools
    match:
      methods: [POST]
      path: {exact: /mcp}
      json:
        - {pointer: /method, equals: tools/call}
        - {pointer: /params/name, one_of: [send_email]}
    key: {from: [header, derived], derive: [/params/name, /params/arguments], required: true}
    scope: {from: header, header: x-agent}
    answers: ANSWERS
  - name: blobs
    match:
      methods: [POST]
      path: {exact: /mcp}
      json:
        - {pointer: /method, equals: tools/call}
        - {pointer: /params/name, one_of: [upload_blob]}
    key: {from: [header, derived], derive: [/params/name, /params/arguments], required: true}
    scope: {from: header, header: x-agent}
    answers: ANSWERS
    max_request_body: 4KiB
default_policy: {enabled: false}
`

// TestDecidingPolicyBodyLimit: a request read under the limit of the
// policy that deferred it, but taken at its body by a policy with a
// smaller max_request_body, is refused as that policy's own too-large body
// would be (413 request-body-too-large, or -33072 to the call's id), and
// the tool does not run; a body within the limit runs.
func TestDecidingPolicyBodyLimit(t *testing.T) {
	blob := func(id string, n int) string {
		return call(id, "upload_blob", `{"data":"`+strings.Repeat("b", n)+`"}`)
	}
	t.Run("jsonrpc", func(t *testing.T) {
		env, up, cs := startMCP(t, strings.ReplaceAll(twoToolPolicies, "ANSWERS", "jsonrpc"))
		id, code, data := rpcError(t, env.Post("/mcp", "", blob("7", 8<<10), "x-agent", "a"))
		if id != "7" || code != jsonrpc.CodeBodyTooLarge || data.Status != 413 || !strings.Contains(data.Detail, "4096 bytes") {
			t.Fatalf("8 KiB upload_blob: id %s code %d data %+v, want -33072 to id 7 naming blobs' limit", id, code, data)
		}
		if n := up.count("tools/call/upload_blob"); n != 0 {
			t.Fatalf("upload_blob ran %d times over its policy's limit", n)
		}
		if n := cs.calls.Load(); n != 0 {
			t.Fatalf("%d store calls for a refused body", n)
		}
		if r := env.Post("/mcp", "", blob("8", 2<<10), "x-agent", "a"); r.Status != 200 || up.count("tools/call/upload_blob") != 1 {
			t.Fatalf("2 KiB upload_blob: %d %s", r.Status, r.Body)
		}
	})
	t.Run("http", func(t *testing.T) {
		env, up, _ := startMCP(t, strings.ReplaceAll(twoToolPolicies, "ANSWERS", "http"))
		p := wantProblem(t, env.Post("/mcp", "", blob("7", 8<<10), "x-agent", "a"), problem.BodyTooLarge)
		if d, _ := p["detail"].(string); !strings.Contains(d, "4096 bytes") {
			t.Fatalf("detail %q does not name blobs' limit", d)
		}
		if n := up.count("tools/call/upload_blob"); n != 0 {
			t.Fatalf("upload_blob ran %d times over its policy's limit", n)
		}
	})
}

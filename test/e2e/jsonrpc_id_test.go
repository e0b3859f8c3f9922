package e2e

import (
	"errors"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// A JSON-RPC answer in the upstream's place carries the request's id
// whenever the server could read it, even when the body was refused before
// a policy was decided at it: the official Go SDK client fails its whole
// connection on a response whose id is null (go-sdk v1.8.0
// mcp/streamable.go handleJSON: jsonrpc.DecodeMessage refuses a message
// with neither a method nor a valid id, and the error goes to c.fail).

// TestMCPBodyTooLargeKeepsTheSession: a Go SDK agent's call over the
// policy's max_request_body gets -33072 as the call's *jsonrpc.Error, and
// its session goes on: the next call runs.
func TestMCPBodyTooLargeKeepsTheSession(t *testing.T) {
	ts := newTools()
	env, _ := mcpEnv(t, mcpPolicy(headerKey, "    max_request_body: 4KiB\n"), ts, true, harness.Options{})
	a := connect(t, env)
	res, err := a.call(withKey("big-1"), "send_email", map[string]any{"to": "ivy@example.com", "subject": strings.Repeat("s", 8<<10)})
	wantRPCError(t, res, err, jsonrpc.CodeBodyTooLarge, problem.BodyTooLarge)
	if errors.Is(err, mcp.ErrConnectionClosed) {
		t.Fatalf("CallTool error %v: the agent must see -33072, not a closed connection", err)
	}
	if got := a.result(t, withKey("small-1"), "send_email", map[string]any{"to": "ivy@example.com"}); got != "msg-1-to-ivy@example.com" {
		t.Fatalf("the next call got %q", got)
	}
}

// streamedFilter is the filter with the request body in mode, without
// mode overrides (so the server cannot ask for BUFFERED), cut into chunks
// of chunk bytes with a buffer of as many bytes.
func streamedFilter(mode extprocfilterv3.ProcessingMode_BodySendMode, chunk int) harness.Options {
	cfg := envoysim.RecommendedConfig()
	cfg.ProcessingMode.RequestBodyMode = mode
	cfg.AllowModeOverride = false
	return harness.Options{Filter: cfg, FilterOptions: envoysim.Options{BufferLimit: chunk, ChunkSize: chunk}}
}

// startMCPWith is startMCP with the harness options given.
func startMCPWith(t *testing.T, doc string, opts harness.Options) (*harness.Env, *rpcServer) {
	t.Helper()
	up := newRPCServer(t)
	opts.Policies, opts.UpstreamURL = policies(t, doc), up.srv.URL
	return harness.Start(t, opts), up
}

// TestJSONRPCIDOfABodyNotReadWhole: a body refused while it was still
// arriving (over max_request_body in STREAMED chunks, or cut at Envoy's
// buffer in BUFFERED_PARTIAL) is answered to the id its first bytes carry,
// at 200; a body whose first bytes carry no id is answered with a null id,
// and then at the problem's own HTTP status (MCP 2025-06-18, Transports,
// "Sending Messages to the Server": input the server cannot accept gets an
// HTTP error status, whose body may be a JSON-RPC error without an id).
func TestJSONRPCIDOfABodyNotReadWhole(t *testing.T) {
	big := call("1", "send_email", `{"text":"`+strings.Repeat("x", 5000)+`"}`)
	idLast := `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send_email","arguments":{"text":"` +
		strings.Repeat("x", 5000) + `"}},"id":9}`
	for _, tc := range []struct {
		name   string
		opts   harness.Options
		body   string
		kind   problem.Kind
		code   int
		id     string
		status int
	}{
		{"streamed", streamedFilter(extprocfilterv3.ProcessingMode_STREAMED, 1000), big, problem.BodyTooLarge, jsonrpc.CodeBodyTooLarge, "1", 200},
		{"partial", streamedFilter(extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL, 1000), big, problem.BodyIncomplete, jsonrpc.CodeBodyIncomplete, "1", 200},
		{"streamed/id-last", streamedFilter(extprocfilterv3.ProcessingMode_STREAMED, 1000), idLast, problem.BodyTooLarge, jsonrpc.CodeBodyTooLarge, "null", 413},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, up := startMCPWith(t, mcpPolicies, tc.opts)
			r := env.Post("/mcp", "", tc.body, "x-agent", "a")
			id, code, data := rpcErrorAt(t, r, tc.status)
			if id != tc.id || code != tc.code || data.Type != problem.TypeBase+tc.kind.Slug {
				t.Fatalf("answer %d %s, want error %d to id %s", r.Status, r.Body, tc.code, tc.id)
			}
			if n := up.count("tools/call/send_email"); n != 0 {
				t.Fatalf("send_email ran %d times", n)
			}
		})
	}
}

// TestJSONRPCCapacityAnsweredToTheCallsID: with the server's body budget
// full when a call's headers arrive, the call is not refused there, where
// its id cannot be read, but at its body: -33065 to its own id.
func TestJSONRPCCapacityAnsweredToTheCallsID(t *testing.T) {
	const limit = 4000 // under mcpPolicies' max_request_body, which the hog's body must fit
	up := newRPCServer(t)
	env := harness.Start(t, harness.Options{MaxBufferedBytes: limit, Policies: policies(t, mcpPolicies), UpstreamURL: up.srv.URL})
	closeHog := hogAt(t, env.ServerAddr(), "/mcp", limit, "x-agent", "hog")
	defer closeHog()
	id, code, data := rpcError(t, env.Post("/mcp", "", call("3", "send_email", `{}`), "x-agent", "a"))
	if id != "3" || code != jsonrpc.CodeCapacityExceeded || data.Status != 503 || data.RetryAfter == 0 {
		t.Fatalf("id %s code %d data %+v, want -33065 to id 3 with retryAfter", id, code, data)
	}
	if n := up.count("tools/call/send_email"); n != 0 {
		t.Fatalf("send_email ran %d times", n)
	}
}

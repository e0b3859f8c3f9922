package e2e

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	idemrpc "github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// withHeader adds one header to every request an SDK client sends.
type withHeader struct{ name, value string }

func (h withHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.name, h.value)
	return http.DefaultTransport.RoundTrip(r)
}

// TestSDKClientReadsJSONRPCAnswers checks the HTTP status chosen for
// JSON-RPC answers and the replay of an SSE answer as JSON against the
// official MCP Go SDK, as client and as tool server: a second agent
// session's identical call gets the first one's result from a stored
// event stream (the tool runs once, and the stored session id does not
// break the new session), and a reused key is the call's error with code
// -33061, not a transport failure that would close the session.
func TestSDKClientReadsJSONRPCAnswers(t *testing.T) {
	var runs atomic.Int64
	server := mcp.NewServer(&mcp.Implementation{Name: "mail", Version: "1"}, nil)
	type in struct {
		To string `json:"to"`
	}
	type out struct {
		Sent int64 `json:"sent"`
	}
	mcp.AddTool(server, &mcp.Tool{Name: "send_email"}, func(context.Context, *mcp.CallToolRequest, in) (*mcp.CallToolResult, out, error) {
		return nil, out{Sent: runs.Add(1)}, nil
	})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(ts.Close)
	env := harness.Start(t, harness.Options{UpstreamURL: ts.URL, Policies: policies(t, `
policies:
  - name: mcp-tools
    match:
      methods: [POST]
      path: {exact: /mcp}
      json: [{pointer: /method, equals: tools/call}]
    key: {from: [header, derived], derive: [/params/name, /params/arguments]}
    scope: {from: none}
    fingerprint: {json: true, exclude: [/id, /params/_meta]}
    answers: jsonrpc
default_policy:
  enabled: false
`)})
	ctx := context.Background()
	session := func(rt http.RoundTripper) *mcp.ClientSession {
		t.Helper()
		// No standalone GET stream: envoysim forwards a response only
		// once the upstream's body is whole (internal/testing/envoysim/http.go
		// HTTPUpstream), and that stream never ends.
		tr := &mcp.StreamableClientTransport{Endpoint: env.URL + "/mcp", HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, tr, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	send := func(cs *mcp.ClientSession, to string) (*mcp.CallToolResult, error) {
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "send_email", Arguments: map[string]any{"to": to}})
	}
	first, err := send(session(http.DefaultTransport), "a@example.com")
	if err != nil || first.IsError {
		t.Fatalf("first call: %+v %v", first, err)
	}
	again := session(http.DefaultTransport) // a reconnect: a new session
	second, err := send(again, "a@example.com")
	if err != nil || second.IsError {
		t.Fatalf("replayed call: %+v %v", second, err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
	if a, b := first.StructuredContent, second.StructuredContent; a == nil || b == nil {
		t.Fatalf("results %v / %v", a, b)
	}
	// The session still works after the replay.
	if _, err := again.ListTools(ctx, nil); err != nil {
		t.Fatalf("the session broke after a replay: %v", err)
	}
	keyed := session(withHeader{"Idempotency-Key", "k-1"})
	if _, err := send(keyed, "b@example.com"); err != nil {
		t.Fatal(err)
	}
	_, err = send(keyed, "c@example.com")
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) || werr.Code != idemrpc.CodeKeyReused {
		t.Fatalf("reused key: %v, want the JSON-RPC error %d", err, idemrpc.CodeKeyReused)
	}
	if _, err := keyed.ListTools(ctx, nil); err != nil {
		t.Fatalf("the session broke after a JSON-RPC error: %v", err)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("the tool ran %d times, want 2", n)
	}
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// paySchema marks a nested parameter with x-mcp-header: the official Go
// SDK client mirrors it in Mcp-Param-Idempotency-Key for a tool it has
// listed (go-sdk v1.8.0 mcp/streamable_headers.go, setStandardHeaders
// and generateParamHeaders; mcp/client.go, CallTool and lookupTool), and
// sends no such header for a tool it has not.
const paySchema = `{"type":"object","properties":{"payment":{"type":"object","properties":{` +
	`"key":{"type":"string","x-mcp-header":"Idempotency-Key"},"amount":{"type":"integer"}}}}}`

// TestMCPParamWithTheGoSDK: a 2026-07-28 Go SDK agent that listed the
// tools sends the marked nested parameter in its header; the call is
// keyed by it and its retry replayed. An agent that has not listed them
// sends none while the body has the value, and is answered 400 with
// -32020 ("Client omits header but value is in body": the server "MUST
// reject the request") before the call reaches the tool server; having
// listed the tools, as the specification says such a client should
// ("Client Behavior"), its retry is the same operation and is replayed.
func TestMCPParamWithTheGoSDK(t *testing.T) {
	// The SDK's server lists its tools with ttlMs: 0 (immediately stale,
	// so nothing is learned) unless told otherwise.
	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1"}, &mcp.ServerOptions{
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) { c.TTLMs = 60_000 },
	})
	var runs, reached atomic.Int64
	server.AddTool(&mcp.Tool{Name: "pay", InputSchema: json.RawMessage(paySchema)}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("paid %d", runs.Add(1))}}}, nil
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"method":"tools/call"`)) {
			reached.Add(1)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		sdk.ServeHTTP(w, r)
	})
	env := harness.Start(t, harness.Options{Policies: policies(t, paramPolicy("/params/arguments/payment/key")), UpstreamHandler: upstream})
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Bound)
	defer cancel()
	pay := &mcp.CallToolParams{Name: "pay", Arguments: map[string]any{"payment": map[string]any{"key": "op-1", "amount": 5}}}
	text := func(res *mcp.CallToolResult, err error) string {
		t.Helper()
		if err != nil || res.IsError || len(res.Content) != 1 {
			t.Fatalf("pay: %+v, %v", res, err)
		}
		return res.Content[0].(*mcp.TextContent).Text
	}

	a := connectRevision(t, env, "", nil, nil)
	if _, err := a.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := text(a.CallTool(ctx, pay)); got != "paid 1" {
		t.Fatalf("first call: %q", got)
	}
	if got := text(a.CallTool(ctx, pay)); got != "paid 1" || runs.Load() != 1 {
		t.Fatalf("retry: %q, runs %d", got, runs.Load())
	}
	calls := 0
	for _, c := range a.wire.all() {
		if c.method == "tools/call" {
			calls++
			if c.reqHeader.Get("Mcp-Param-Idempotency-Key") != "op-1" {
				t.Fatalf("the SDK sent %v, want Mcp-Param-Idempotency-Key: op-1", c.reqHeader)
			}
		}
	}
	if calls != 2 {
		t.Fatalf("%d calls on the wire", calls)
	}

	b := connectRevision(t, env, "", nil, nil)
	_, err := b.CallTool(ctx, pay)
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeHeaderMismatch {
		t.Fatalf("a call without the header: %v, want -32020", err)
	}
	for _, c := range b.wire.all() {
		if c.method == "tools/call" && (c.reqHeader.Get("Mcp-Param-Idempotency-Key") != "" || c.status != http.StatusBadRequest) {
			t.Fatalf("unlisted: sent %v, answered %d; want no header and 400", c.reqHeader, c.status)
		}
	}
	if _, err := b.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := text(b.CallTool(ctx, pay)); got != "paid 1" || runs.Load() != 1 || reached.Load() != 1 {
		t.Fatalf("after listing: %q, runs %d, calls that reached the tool server %d", got, runs.Load(), reached.Load())
	}
}

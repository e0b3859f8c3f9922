package jsonrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// exchange is one tools/call POST as it crossed the wire.
type exchange struct {
	request, response []byte
	contentType       string
}

// recorder hands over the bodies of every tools/call POST between the
// SDK's client and server once the server's handler has returned (with an
// SSE answer the client has its response before then).
type recorder struct {
	calls chan exchange
	next  http.Handler
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	cw := &capture{ResponseWriter: w}
	rc.next.ServeHTTP(cw, r)
	if bytes.Contains(body, []byte(`"tools/call"`)) {
		rc.calls <- exchange{body, cw.buf.Bytes(), w.Header().Get("Content-Type")}
	}
}

type capture struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (c *capture) Write(b []byte) (int, error) { c.buf.Write(b); return c.ResponseWriter.Write(b) }
func (c *capture) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

type orderIn struct {
	ClientOrderID string `json:"client_order_id"`
	Qty           int    `json:"qty"`
}

type orderOut struct {
	Order string `json:"order"`
}

// sdkToolCall runs a real MCP Go SDK client against a real SDK server
// (Streamable HTTP) and returns the bytes of its tools/call exchange. The
// tool sends a progress notification first, so an SSE answer carries a
// notification before the response.
func sdkToolCall(t *testing.T, jsonResponse bool) exchange {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: "orders", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "create_order"}, func(ctx context.Context, req *mcp.CallToolRequest, in orderIn) (*mcp.CallToolResult, orderOut, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 0.5, Message: "half"}); err != nil {
				return nil, orderOut{}, err
			}
		}
		return nil, orderOut{Order: "ord-" + in.ClientOrderID}, nil
	})
	rec := &recorder{calls: make(chan exchange, 4), next: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{JSONResponse: jsonResponse})}
	ts := httptest.NewServer(rec)
	defer ts.Close()
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	params := &mcp.CallToolParams{Name: "create_order", Arguments: map[string]any{"client_order_id": "o-42", "qty": 3}}
	params.SetProgressToken("tok-1")
	res, err := cs.CallTool(ctx, params)
	if err != nil || res.IsError {
		t.Fatalf("CallTool = %+v, %v", res, err)
	}
	ex := <-rec.calls // the one tools/call; a second would show in len below
	if n := len(rec.calls); n != 0 {
		t.Fatalf("recorded %d more tools/call exchanges", n)
	}
	return ex
}

// TestSDKExchange: what the helpers make of the bytes the official SDK
// sends and answers, as JSON and as an event stream.
func TestSDKExchange(t *testing.T) {
	for _, tc := range []struct {
		name        string
		json        bool
		contentType string
	}{{"json", true, "application/json"}, {"sse", false, "text/event-stream"}} {
		t.Run(tc.name, func(t *testing.T) {
			ex := sdkToolCall(t, tc.json)
			if !strings.HasPrefix(ex.contentType, tc.contentType) {
				t.Fatalf("the SDK answered %q, want %q", ex.contentType, tc.contentType)
			}
			req, err := ParseRequest(ex.request)
			if err != nil || req.Batch || req.Notification() || req.Method != "tools/call" || req.ID == nil {
				t.Fatalf("ParseRequest(%s) = %+v, %v", ex.request, req, err)
			}
			resp := ex.response
			if !tc.json {
				if !bytes.Contains(resp, []byte("notifications/progress")) {
					t.Fatalf("the SSE answer carries no progress notification: %s", resp)
				}
				if resp, err = FinalResponse(ex.response, req.ID); err != nil {
					t.Fatalf("FinalResponse(%s): %v", ex.response, err)
				}
				if bytes.Contains(resp, []byte("progress")) {
					t.Fatalf("the final response %s is the progress notification", resp)
				}
			}
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Result struct {
					StructuredContent orderOut `json:"structuredContent"`
				} `json:"result"`
			}
			if err := json.Unmarshal(resp, &msg); err != nil || string(msg.ID) != string(req.ID) || msg.Result.StructuredContent.Order != "ord-o-42" {
				t.Fatalf("response %s: %+v, %v", resp, msg, err)
			}
			// A retry under a new id gets the stored result under its own id,
			// every other byte unchanged.
			for _, id := range []string{`"retry-2"`, `99`} {
				got, err := RewriteID(resp, json.RawMessage(id))
				if err != nil {
					t.Fatal(err)
				}
				if want := bytes.Replace(resp, []byte(`"id":`+string(req.ID)), []byte(`"id":`+id), 1); !bytes.Equal(got, want) {
					t.Fatalf("RewriteID = %s, want %s", got, want)
				}
			}
		})
	}
}

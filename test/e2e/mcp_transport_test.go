package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// An answer from the MCP server that is its Streamable HTTP transport
// refusing the call (an expired session's 404, a 400, 405, 406 or 415 with
// no JSON-RPC response to the call in it) means the tool never ran: the
// key is released, so that the agent's retry runs the call, where storing
// it answered every retry -33063 for the whole retention.

// swappable serves the handler in h, which a test replaces to stand for a
// tool server that restarted and so forgot every session.
type swappable struct {
	mu sync.Mutex
	h  http.Handler
}

func (s *swappable) set(h http.Handler) {
	s.mu.Lock()
	s.h = h
	s.mu.Unlock()
}

func (s *swappable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	h := s.h
	s.mu.Unlock()
	h.ServeHTTP(w, r)
}

// TestMCPExpiredSessionReleased: the Go SDK tool server answers a call in
// a session it no longer knows with 404 (MCP 2025-06-18, Transports,
// "Session Management": the server MUST answer a terminated session's
// requests with 404 Not Found; go-sdk v1.8.0 mcp/streamable.go writes
// "session not found" as text/plain) without running the tool. The Go SDK
// agent starts a new session, as the specification says it MUST, and
// retries the call: the tool runs, once, and a further retry is replayed.
func TestMCPExpiredSessionReleased(t *testing.T) {
	for _, kt := range []struct{ name, key string }{{"header", headerKey}, {"derived", derivedKey}} {
		t.Run(kt.name, func(t *testing.T) {
			ts := newTools()
			sw := &swappable{h: ts.handler(true)}
			env := harness.Start(t, harness.Options{Policies: policies(t, mcpPolicy(kt.key, "")), UpstreamHandler: sw})
			ctx := withKey("expired-1")
			args := map[string]any{"to": "kim@example.com", "subject": "renewal"}
			old := connect(t, env)
			sw.set(ts.handler(true)) // the tool server restarted: its sessions are gone
			if _, err := old.call(ctx, "send_email", args); err == nil {
				t.Fatal("a call in a forgotten session succeeded")
			}
			if c := old.wire.call(t, 0); c.status != http.StatusNotFound {
				t.Fatalf("the tool server answered the old session %d %s, want 404", c.status, c.body)
			}
			if n := ts.Runs("send_email"); n != 0 {
				t.Fatalf("send_email ran %d times in a forgotten session", n)
			}

			a := connect(t, env)
			if got := a.result(t, ctx, "send_email", args); got != "msg-1-to-kim@example.com" {
				t.Fatalf("the retry in a new session got %q, want the tool's first run", got)
			}
			if got := a.result(t, ctx, "send_email", args); got != "msg-1-to-kim@example.com" {
				t.Fatalf("a further retry got %q, want the replay", got)
			}
			if c := a.wire.call(t, 1); c.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the further retry was not replayed: %v", c.header)
			}
			if n := ts.Runs("send_email"); n != 1 {
				t.Fatalf("send_email ran %d times, want 1", n)
			}
		})
	}
}

// refusingServer is a JSON-RPC tool server whose first answer to a call is
// the one a test chose; every later answer is the call's result.
type refusingServer struct {
	srv                 *httptest.Server
	status              int
	contentType, answer string // %s in answer is the call's id

	mu   sync.Mutex
	runs int // calls that got past the first answer
	seen int
}

func newRefusingServer(t *testing.T, status int, contentType, answer string) *refusingServer {
	s := &refusingServer{status: status, contentType: contentType, answer: answer}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *refusingServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var msg struct {
		ID json.RawMessage `json:"id"`
	}
	_ = json.Unmarshal(body, &msg)
	s.mu.Lock()
	s.seen++
	first := s.seen == 1
	if !first {
		s.runs++
	}
	n := s.runs
	s.mu.Unlock()
	if first {
		if s.contentType != "" {
			w.Header().Set("Content-Type", s.contentType)
		}
		w.WriteHeader(s.status)
		if s.answer != "" {
			fmt.Fprintf(w, s.answer, msg.ID)
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"ran %d"}]}}`, msg.ID, n)
}

func (s *refusingServer) calls() (seen, runs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen, s.runs
}

// TestJSONRPCTransportRefusalReleased: an upstream answer whose status the
// MCP transport sends before it dispatches a call (400, 401, 403, 404,
// 405, 406, 415) and whose body is no JSON-RPC response to the call, or
// the 2026-07-28 revision's own refusals (-32020 and -32022 at 400, -32601
// at 404), is released: the retry reaches the server and runs, and the one
// after it is replayed. Anything else is stored as the call's outcome: a
// 5xx (the tool may have run), any other JSON-RPC response to the call
// whatever its status, and a 2xx that is none (a retry gets -33063: the call may have
// run, what it returned cannot be told).
func TestJSONRPCTransportRefusalReleased(t *testing.T) {
	for _, tc := range []struct {
		name                string
		status              int
		contentType, answer string
		released            bool
	}{
		{"404 session not found", 404, "text/plain; charset=utf-8", "session not found\n", true},
		{"400 missing session id", 400, "text/plain; charset=utf-8", "Bad Request: missing session ID\n", true},
		{"400 empty", 400, "", "", true},
		{"401 token expired", 401, "application/json", `{"error":"invalid_token"}`, true},
		{"403 bad origin, JSON-RPC error without id", 403, "application/json", `{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"forbidden"}}`, true},
		{"405", 405, "text/plain", "Method Not Allowed\n", true},
		{"406, JSON-RPC error to another id", 406, "application/json", `{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Not Acceptable"}}`, true},
		{"415", 415, "text/plain", "Content-Type must be 'application/json'\n", true},

		{"500", 500, "text/plain", "failed\n", false},
		{"502", 502, "text/plain", "bad gateway\n", false},
		// MCP 2026-07-28's own refusals answer the call with a JSON-RPC
		// error, before any handler runs (Streamable HTTP, "Protocol
		// Version Header", "Server Validation").
		{"404 method not found to the call", 404, "application/json", `{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}`, true},
		{"400 header mismatch to the call", 400, "application/json", `{"jsonrpc":"2.0","id":%s,"error":{"code":-32020,"message":"HeaderMismatch"}}`, true},
		{"400 unsupported protocol version to the call", 400, "application/json", `{"jsonrpc":"2.0","id":%s,"error":{"code":-32022,"message":"Unsupported"}}`, true},
		// A handler may answer these itself: stored.
		{"400 invalid params to the call", 400, "application/json", `{"jsonrpc":"2.0","id":%s,"error":{"code":-32602,"message":"Invalid params"}}`, false},
		{"404 another JSON-RPC error to the call", 404, "application/json", `{"jsonrpc":"2.0","id":%s,"error":{"code":-32000,"message":"x"}}`, false},
		{"200 not JSON-RPC", 200, "text/plain", "done\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newRefusingServer(t, tc.status, tc.contentType, tc.answer)
			env := harness.Start(t, harness.Options{Policies: policies(t, mcpPolicies), UpstreamURL: up.srv.URL})
			first := env.Post("/mcp", "", call("1", "send_email", `{"to":"a"}`), "x-agent", "a")
			if first.Status != tc.status {
				t.Fatalf("first answer %d %s, want the server's %d", first.Status, first.Body, tc.status)
			}
			retry := env.Post("/mcp", "", call("2", "send_email", `{"to":"a"}`), "x-agent", "a")
			seen, runs := up.calls()
			if !tc.released {
				if seen != 1 || retry.Header.Get("Idempotent-Replayed") == "" && !strings.Contains(retry.Body, `"code":-33063`) {
					t.Fatalf("retry %d %v %s reached the server (%d requests): the first answer must be stored", retry.Status, retry.Header, retry.Body, seen)
				}
				if strings.Contains(tc.answer, `"id":%s`) && (retry.Status != tc.status || !strings.Contains(retry.Body, `"id":2,`)) {
					t.Fatalf("retry %d %s, want the stored JSON-RPC error replayed to id 2", retry.Status, retry.Body)
				}
				return
			}
			if seen != 2 || runs != 1 || retry.Status != 200 || !strings.Contains(retry.Body, `"text":"ran 1"`) {
				t.Fatalf("retry %d %s (%d requests, %d runs), want the call run by the server", retry.Status, retry.Body, seen, runs)
			}
			again := env.Post("/mcp", "", call("3", "send_email", `{"to":"a"}`), "x-agent", "a")
			if again.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(again.Body, `"id":3,`) {
				t.Fatalf("the next retry %d %v %s, want the replay", again.Status, again.Header, again.Body)
			}
			if seen, _ := up.calls(); seen != 2 {
				t.Fatalf("the server saw %d requests, want 2", seen)
			}
		})
	}
}

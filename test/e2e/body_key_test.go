package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// Keys and policies from the body through envoysim, the real server and a real redis-server: a
// policy decided at the request body, keys from the body or derived, and
// JSON-RPC answers. The MCP SDK's own client and server are exercised in
// the other end-to-end tests; here a small JSON-RPC tool server lets each
// test choose the answer's form (JSON, SSE, not JSON-RPC).

// rpcServer is a JSON-RPC tool server with a visible effect: every request
// with an id is counted by method and tool. x-answer picks the answer's
// form: "sse" (a progress notification, then the response, as a
// text/event-stream), "plain" (a body that is no JSON-RPC response).
type rpcServer struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls map[string]int
	// block, when set, holds a request with x-block: it sends on block
	// when it arrives, then waits until the test sends on it.
	block chan struct{}
}

func newRPCServer(t testing.TB) *rpcServer {
	s := &rpcServer{calls: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *rpcServer) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[name]
}

func (s *rpcServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.ID == nil {
		w.WriteHeader(http.StatusAccepted) // a notification, a batch: no response
		s.mu.Lock()
		s.calls["no-id"]++
		s.mu.Unlock()
		return
	}
	name := msg.Method
	if msg.Params.Name != "" {
		name += "/" + msg.Params.Name
	}
	s.mu.Lock()
	s.calls[name]++
	n := s.calls[name]
	block := s.block
	s.mu.Unlock()
	if r.Header.Get("x-block") != "" && block != nil {
		block <- struct{}{} // arrived
		<-block             // released
	}
	w.Header().Set("Mcp-Session-Id", "session-of-"+r.Header.Get("Mcp-Session-Id"))
	resp := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s ran %d"}]}}`, msg.ID, name, n)
	switch r.Header.Get("x-answer") {
	case "sse":
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n")
		fmt.Fprintf(w, "event: message\ndata: %s\n\n", resp)
	case "plain":
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s ran %d", name, n)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, resp)
	}
}

// countingStore counts the store calls a request costs.
type countingStore struct {
	idem.Store
	calls atomic.Int64
}

func (c *countingStore) Reserve(ctx context.Context, r idem.Reservation) (idem.ReserveResult, error) {
	c.calls.Add(1)
	return c.Store.Reserve(ctx, r)
}

func (c *countingStore) Get(ctx context.Context, id idem.RecordID) (idem.Record, error) {
	c.calls.Add(1)
	return c.Store.Get(ctx, id)
}

const mcpPolicies = `
policies:
  - name: mcp-tools
    match:
      methods: [POST]
      path: {exact: /mcp}
      json:
        - {pointer: /method, equals: tools/call}
        - {pointer: /params/name, one_of: [send_email, open_ticket]}
    key:
      from: [header, derived]
      derive: [/params/name, /params/arguments]
      required: true
    scope: {from: header, header: x-agent}
    fingerprint:
      json: true
      exclude: [/id, /params/_meta]
    answers: jsonrpc
    max_request_body: 4KiB
default_policy:
  enabled: false
`

func startMCP(t testing.TB, doc string, logs ...*harness.LogBuffer) (*harness.Env, *rpcServer, *countingStore) {
	t.Helper()
	up := newRPCServer(t)
	cs := &countingStore{}
	opts := harness.Options{
		Policies:    policies(t, doc),
		UpstreamURL: up.srv.URL,
		WrapStore: func(st idem.Store) idem.Store {
			cs.Store = st
			return cs
		},
	}
	if len(logs) > 0 {
		opts.Logger = slog.New(slog.NewJSONHandler(logs[0], &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return harness.Start(t, opts), up, cs
}

func call(id, tool, args string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args +
		`,"_meta":{"progressToken":` + id + `}}}`
}

// rpcError decodes a JSON-RPC error answer, sent at 200 as the call's own
// answer would be.
func rpcError(t *testing.T, r harness.Reply) (id string, code int, data jsonrpc.ErrorData) {
	t.Helper()
	return rpcErrorAt(t, r, http.StatusOK)
}

// TestJSONRPCRetryUnderNewIDIsReplayed: an agent's retry of a tool call
// under a new JSON-RPC id and progress token, with no key at all (derived
// key), runs the tool once and gets the stored result with its own id,
// every other byte as stored; a changed argument is a new operation.
func TestJSONRPCRetryUnderNewIDIsReplayed(t *testing.T) {
	env, up, _ := startMCP(t, mcpPolicies)
	first := env.Post("/mcp", "", call("1", "send_email", `{"to":"a@example.com"}`), "x-agent", "agent-1", "Mcp-Session-Id", "s1")
	if first.Status != 200 || !strings.Contains(first.Body, `"id":1,`) || up.count("tools/call/send_email") != 1 {
		t.Fatalf("first call: %d %s", first.Status, first.Body)
	}
	// The retry comes after a reconnect: another session, id and token.
	retry := env.Post("/mcp", "", call(`"retry-2"`, "send_email", `{"to":"a@example.com"}`), "x-agent", "agent-1", "Mcp-Session-Id", "s2")
	if retry.Status != 200 || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %v %s", retry.Status, retry.Header, retry.Body)
	}
	if want := strings.Replace(first.Body, `"id":1,`, `"id":"retry-2",`, 1); retry.Body != want {
		t.Fatalf("replay %s, want %s", retry.Body, want)
	}
	if got := retry.Header.Get("Mcp-Session-Id"); got != "" {
		t.Fatalf("the replay names the first attempt's session %q", got)
	}
	if n := up.count("tools/call/send_email"); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
	// Another agent (scope) with the same call runs it; so does a changed
	// argument.
	env.Post("/mcp", "", call("3", "send_email", `{"to":"a@example.com"}`), "x-agent", "agent-2")
	env.Post("/mcp", "", call("4", "send_email", `{"to":"b@example.com"}`), "x-agent", "agent-1")
	if n := up.count("tools/call/send_email"); n != 3 {
		t.Fatalf("the tool ran %d times, want 3", n)
	}
}

// TestDerivedKeyLogsItsHashOnly: the decision line of a derived key names
// its source and the record id (key_hash), never the members' text.
func TestDerivedKeyLogsItsHashOnly(t *testing.T) {
	var logs harness.LogBuffer
	env, _, _ := startMCP(t, mcpPolicies, &logs)
	env.Post("/mcp", "", call("1", "send_email", `{"to":"secret-address@example.com"}`), "x-agent", "a")
	lines := logLines(t, &logs, "decision")
	if len(lines) != 1 || lines[0]["key_source"] != "derived" || lines[0]["key_hash"] == "" {
		t.Fatalf("decision lines %v", lines)
	}
	if strings.Contains(logs.String(), "secret-address") {
		t.Fatalf("a body member reached the logs: %s", logs.String())
	}
}

// TestJSONRPCConflictIsAJSONRPCError: the same client key for another
// argument is refused as a JSON-RPC error to the request's own id, with the
// documented code and the problem in data; the tool runs once.
func TestJSONRPCConflictIsAJSONRPCError(t *testing.T) {
	env, up, _ := startMCP(t, mcpPolicies)
	env.Post("/mcp", "k-1", call("1", "open_ticket", `{"title":"a"}`), "x-agent", "a")
	r := env.Post("/mcp", "k-1", call(`"c-9"`, "open_ticket", `{"title":"b"}`), "x-agent", "a")
	id, code, data := rpcError(t, r)
	if id != `"c-9"` || code != jsonrpc.CodeKeyReused || data.Type != problem.New(problem.KeyReused, "").Type() || data.Status != 422 {
		t.Fatalf("conflict: id %s code %d data %+v", id, code, data)
	}
	if n := up.count("tools/call/open_ticket"); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
	// A malformed client key is refused as a JSON-RPC error too.
	_, code, _ = rpcError(t, env.Post("/mcp", "a,b", call("2", "open_ticket", `{}`), "x-agent", "a"))
	if code != jsonrpc.CodeKeyInvalid {
		t.Fatalf("malformed key: code %d", code)
	}
	// Without the scope header the principal is missing.
	_, code, _ = rpcError(t, env.Post("/mcp", "k-2", call("3", "open_ticket", `{}`)))
	if code != jsonrpc.CodePrincipalMissing {
		t.Fatalf("no principal: code %d", code)
	}
}

// TestJSONRPCReadsPassWithoutAStoreCall: initialize, tools/list, another
// tool, notifications, responses and batches of unprotected calls match no
// policy (a batch holding a protected call is refused:
// TestUnreadableBodyRefused): they reach
// the server unprotected, twice when sent twice, and cost no store call.
// (A body that is not JSON is refused: TestUnreadableBodyRefused.)
func TestJSONRPCReadsPassWithoutAStoreCall(t *testing.T) {
	env, up, cs := startMCP(t, mcpPolicies)
	bodies := map[string]string{
		"initialize":             `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}`,
		"tools/list":             `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		"tools/call/get_weather": `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_weather","arguments":{}}}`,
		"no-id":                  `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	}
	for name, b := range bodies {
		for range 2 {
			if r := env.Post("/mcp", "", b, "x-agent", "a"); r.Status >= 300 {
				t.Fatalf("%s: %d %s", name, r.Status, r.Body)
			}
		}
		if n := up.count(name); n != 2 {
			t.Errorf("%s reached the server %d times, want 2", name, n)
		}
	}
	for _, b := range []string{
		`[` + call("5", "get_weather", `{}`) + `]`,                                              // a batch of unprotected calls
		`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send_email","arguments":{}}}`, // a notification
		`{"jsonrpc":"2.0","id":6,"result":{}}`,                                                  // a response posted back
	} {
		env.Post("/mcp", "", b, "x-agent", "a")
	}
	if n, resp := up.count("no-id"), up.count(""); n != 2+2 || resp != 1 {
		t.Errorf("unprotected messages without an id reached the server %d times, want 4; the response %d, want 1", n, resp)
	}
	if n := cs.calls.Load(); n != 0 {
		t.Fatalf("%d store calls for requests no policy takes", n)
	}
	// Passed at the body, they skip the response body phase at the
	// response headers: nothing of an unprotected answer is buffered.
	for _, r := range env.Results() {
		for _, ph := range r.Phases() {
			if ph == envoysim.PhaseResponseBody {
				t.Fatalf("an unprotected answer's body was sent to the server: %v", r)
			}
		}
	}
}

// TestJSONRPCFallsThroughToTheNextPolicy: when the first policy's body
// criteria fail, the next policy whose criteria hold applies (here an HTTP
// policy on the same path, keyed by header).
func TestJSONRPCFallsThroughToTheNextPolicy(t *testing.T) {
	env, up, _ := startMCP(t, strings.Replace(mcpPolicies, "default_policy:\n  enabled: false\n", `
  - name: mcp-rest
    match: {methods: [POST], path: {exact: /mcp}}
default_policy:
  enabled: false
`, 1))
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	// No x-agent: under mcp-tools (scoped by it) this would be refused
	// principal-missing; mcp-rest scopes by authority.
	a := env.Post("/mcp", "list-1", list)
	b := env.Post("/mcp", "list-1", list)
	if a.Status != 200 || b.Header.Get("Idempotent-Replayed") != "true" || b.Body != a.Body || up.count("tools/list") != 1 {
		t.Fatalf("tools/list under mcp-rest: %d %s / %d %v %s", a.Status, a.Body, b.Status, b.Header, b.Body)
	}
	// A request without a body is decided at its headers (no body phase
	// comes): no JSON criterion holds, so mcp-rest takes it too.
	e1 := env.Post("/mcp", "empty-1", "")
	e2 := env.Post("/mcp", "empty-1", "")
	if e1.Status != http.StatusAccepted || e2.Header.Get("Idempotent-Replayed") != "true" || up.count("no-id") != 1 {
		t.Fatalf("bodiless POST under mcp-rest: %d %s / %d %v", e1.Status, e1.Body, e2.Status, e2.Header)
	}
	// Under the HTTP policy a conflict is an HTTP problem.
	if r := env.Post("/mcp", "list-1", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); r.Status != 422 {
		t.Fatalf("conflict under mcp-rest: %d %s", r.Status, r.Body)
	}
}

// TestJSONRPCInFlightDuplicate: a duplicate of a call still running is
// answered the in-progress JSON-RPC error, with a retry delay, to its own
// id; the tool runs once.
func TestJSONRPCInFlightDuplicate(t *testing.T) {
	env, up, _ := startMCP(t, mcpPolicies)
	up.mu.Lock()
	up.block = make(chan struct{})
	up.mu.Unlock()
	done := make(chan harness.Reply, 1)
	go func() { done <- env.Post("/mcp", "", call("1", "send_email", `{}`), "x-agent", "a", "x-block", "1") }()
	select {
	case <-up.block: // the first attempt is at the tool
	case r := <-done:
		t.Fatalf("the first call never reached the tool: %d %s", r.Status, r.Body)
	}
	dup := env.Post("/mcp", "", call("2", "send_email", `{}`), "x-agent", "a")
	up.block <- struct{}{} // released before anything can fail the test
	id, code, data := rpcError(t, dup)
	if first := <-done; first.Status != 200 || !strings.Contains(first.Body, `"id":1,`) {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	if id != "2" || code != jsonrpc.CodeInProgress || data.Status != 409 || data.RetryAfter != 1 {
		t.Fatalf("duplicate: id %s code %d data %+v", id, code, data)
	}
	if n := up.count("tools/call/send_email"); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// TestJSONRPCStreamReplayedAsItsFinalResponse: a call answered as a
// text/event-stream (a progress notification, then the response) is
// replayed as the response alone, application/json, to the retry's id.
func TestJSONRPCStreamReplayedAsItsFinalResponse(t *testing.T) {
	env, up, _ := startMCP(t, mcpPolicies)
	first := env.Post("/mcp", "", call("1", "send_email", `{}`), "x-agent", "a", "x-answer", "sse")
	if first.Status != 200 || !strings.HasPrefix(first.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("first: %d %v", first.Status, first.Header)
	}
	retry := env.Post("/mcp", "", call("2", "send_email", `{}`), "x-agent", "a", "x-answer", "sse")
	want := `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"tools/call/send_email ran 1"}]}}`
	if retry.Status != 200 || retry.Body != want || retry.Header.Get("Content-Type") != "application/json" ||
		retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v %s", retry.Status, retry.Header, retry.Body)
	}
	if n := up.count("tools/call/send_email"); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// TestJSONRPCUnrewritableReplayIsOutcomeUnknown: a stored answer that is
// no JSON-RPC response is never replayed to a wrong id: the retry gets the
// outcome-unknown error, and the tool does not run again.
func TestJSONRPCUnrewritableReplayIsOutcomeUnknown(t *testing.T) {
	env, up, _ := startMCP(t, mcpPolicies)
	env.Post("/mcp", "", call("1", "send_email", `{}`), "x-agent", "a", "x-answer", "plain")
	id, code, data := rpcError(t, env.Post("/mcp", "", call("7", "send_email", `{}`), "x-agent", "a", "x-answer", "plain"))
	if id != "7" || code != jsonrpc.CodeOutcomeUnknown || data.Status != 409 {
		t.Fatalf("id %s code %d data %+v", id, code, data)
	}
	if n := up.count("tools/call/send_email"); n != 1 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// TestJSONRPCBodyTooLarge: a body over the policy's max_request_body is
// refused with the 413-equivalent JSON-RPC error, to the call's own id:
// the body arrived whole (one message in BUFFERED mode), so its id could
// be read.
func TestJSONRPCBodyTooLarge(t *testing.T) {
	env, up, _ := startMCP(t, mcpPolicies)
	id, code, data := rpcError(t, env.Post("/mcp", "", call("1", "send_email", `{"text":"`+strings.Repeat("x", 5000)+`"}`), "x-agent", "a"))
	if id != "1" || code != jsonrpc.CodeBodyTooLarge || data.Status != 413 {
		t.Fatalf("id %s code %d data %+v", id, code, data)
	}
	if n := up.count("tools/call/send_email"); n != 0 {
		t.Fatalf("the tool ran %d times", n)
	}
}

// TestKeyFromTheBody: a REST API with the key in the JSON body (Square's
// idempotency_key): a retry is replayed, the key's absence is a 400 naming
// the pointer, and the fingerprint subset ignores a client timestamp.
func TestKeyFromTheBody(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, `
policies:
  - name: square
    match: {methods: [POST], path: {prefix: /v2/payments}}
    key: {from: body, pointer: /idempotency_key, required: true}
    fingerprint: {json: true, exclude: [/sent_at]}
default_policy:
  enabled: false
`)})
	pay := func(key, amount, at string) harness.Reply {
		return env.Post("/v2/payments", "", `{"idempotency_key":"`+key+`","amount_money":{"amount":`+amount+`},"sent_at":"`+at+`"}`)
	}
	a := pay("pay-1", "100", "10:00")
	b := pay("pay-1", "100", "10:01")
	if a.Status != 201 || b.Header.Get("Idempotent-Replayed") != "true" || b.Body != a.Body || env.Upstream.Count(nil) != 1 {
		t.Fatalf("retry: %d %s / %d %v %s", a.Status, a.Body, b.Status, b.Header, b.Body)
	}
	if r := pay("pay-1", "200", "10:02"); r.Status != 422 {
		t.Fatalf("changed amount: %d %s", r.Status, r.Body)
	}
	r := env.Post("/v2/payments", "", `{"amount_money":{"amount":100}}`)
	if r.Status != 400 || !strings.Contains(r.Body, problem.KeyMissing.Slug) || !strings.Contains(r.Body, "/idempotency_key") {
		t.Fatalf("no key: %d %s", r.Status, r.Body)
	}
	// The header is not a source of this policy: a header key alone is no key.
	if r := env.Post("/v2/payments", "hdr-1", `{"amount_money":{"amount":100}}`); r.Status != 400 {
		t.Fatalf("header key on a body-key policy: %d %s", r.Status, r.Body)
	}
	if n := env.Upstream.Count(nil); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// The end-to-end tests of the MCP support: the official MCP Go SDK
// (github.com/modelcontextprotocol/go-sdk) is both the agent (a
// ClientSession over StreamableClientTransport) and the tool server
// (NewStreamableHTTPHandler), with envoysim, the real ext_proc server and a
// real redis-server between them.

// tools is an MCP tool server whose tools have a visible effect: each run
// is counted before the tool answers, the way a sent e-mail stays sent
// whether or not its answer comes back.
type tools struct {
	mu   sync.Mutex
	runs map[string]int
	// started receives the tool name as each run begins.
	started chan string
	// gate, when set, holds open_ticket after its effect until closed.
	gate chan struct{}
}

type emailIn struct {
	To             string `json:"to"`
	Subject        string `json:"subject,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

type ticketIn struct {
	Title          string `json:"title"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// toolOut is every tool's structured result: which run of the tool answered.
type toolOut struct {
	ID string `json:"id"`
}

type paymentIn struct {
	Amount         int    `json:"amount"`
	Currency       string `json:"currency"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

type lookupIn struct {
	Query string `json:"query"`
}

func newTools() *tools {
	return &tools{runs: map[string]int{}, started: make(chan string, 64)}
}

func (ts *tools) run(name string) int {
	ts.mu.Lock()
	ts.runs[name]++
	n := ts.runs[name]
	ts.mu.Unlock()
	ts.started <- name
	return n
}

// Runs returns how many times the tool ran.
func (ts *tools) Runs(name string) int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.runs[name]
}

// handler serves the tools over Streamable HTTP, answering calls as JSON
// or as an event stream (StreamableHTTPOptions.JSONResponse).
func (ts *tools) handler(jsonResponse bool) http.Handler {
	server := mcp.NewServer(&mcp.Implementation{Name: "tools", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "send_email"}, func(ctx context.Context, req *mcp.CallToolRequest, in emailIn) (*mcp.CallToolResult, toolOut, error) {
		n := ts.run("send_email")
		// A progress notification first, so that an SSE answer carries a
		// notification before the response, as a long tool's would. With
		// JSON answers the SDK can only send it on the standalone stream,
		// which the agents here do not open (connect), so it fails there:
		// progress is best effort.
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 0.5, Message: "queued"})
		}
		return nil, toolOut{ID: fmt.Sprintf("msg-%d-to-%s", n, in.To)}, nil
	})
	mcp.AddTool(server, &mcp.Tool{Name: "open_ticket"}, func(ctx context.Context, req *mcp.CallToolRequest, in ticketIn) (*mcp.CallToolResult, toolOut, error) {
		n := ts.run("open_ticket")
		if ts.gate != nil {
			<-ts.gate // the ticket is open; the answer waits (the tool ignores ctx, as a slow backend would)
		}
		return nil, toolOut{ID: fmt.Sprintf("ticket-%d-%s", n, in.Title)}, nil
	})
	mcp.AddTool(server, &mcp.Tool{Name: "create_payment"}, func(ctx context.Context, req *mcp.CallToolRequest, in paymentIn) (*mcp.CallToolResult, toolOut, error) {
		n := ts.run("create_payment")
		return nil, toolOut{ID: fmt.Sprintf("pay-%d-%d%s", n, in.Amount, in.Currency)}, nil
	})
	// A read: not in any policy's tool list, so it passes unprotected.
	mcp.AddTool(server, &mcp.Tool{Name: "lookup"}, func(ctx context.Context, req *mcp.CallToolRequest, in lookupIn) (*mcp.CallToolResult, toolOut, error) {
		n := ts.run("lookup")
		return nil, toolOut{ID: fmt.Sprintf("lookup-%d", n)}, nil
	})
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{JSONResponse: jsonResponse})
}

// mcpPolicy is the policy of docs/mcp.md for the tools that have effects:
// decided at the request body, fingerprinting the call without its JSON-RPC
// id or _meta (progress tokens), answering in JSON-RPC. key is the policy's
// key block.
func mcpPolicy(key string, extra string) string {
	return `
policies:
  - name: mcp-tools
    match:
      methods: [POST]
      path: {exact: /mcp}
      json:
        - {pointer: /method, equals: tools/call}
        - {pointer: /params/name, one_of: [send_email, open_ticket]}
    key: ` + key + `
    fingerprint:
      json: true
      exclude: [/id, /params/_meta]
    answers: jsonrpc
` + extra + `
# Nothing else on this server is protected: the built-in default policy
# would take every other POST that carries an Idempotency-Key (the
# session's initialize, tools/list and pings, when an agent's HTTP client
# puts the key on all its requests), since a request whose body fails
# mcp-tools' criteria goes on to the next policy that matches.
default_policy: {enabled: false}
`
}

const (
	headerKey  = `{from: header, header: idempotency-key, required: true}`
	bodyKey    = `{from: body, pointer: /params/arguments/idempotency_key, required: true}`
	derivedKey = `{from: derived, derive: [/params/name, /params/arguments]}`
)

// mcpEnv runs the tools behind envoysim and the server with the given
// policy document, counting the store's calls.
func mcpEnv(t *testing.T, doc string, ts *tools, jsonResponse bool, opts harness.Options) (*harness.Env, *storeCalls) {
	t.Helper()
	cs := &storeCalls{}
	opts.Policies = policies(t, doc)
	opts.UpstreamHandler = ts.handler(jsonResponse)
	opts.WrapStore = cs.wrap
	return harness.Start(t, opts), cs
}

// agent is one MCP client session of an agent, with the exchanges it had
// on the wire.
type agent struct {
	*mcp.ClientSession
	wire *wireLog
}

// connect starts a client session through the proxy: initialize, then the
// notifications/initialized notification.
func connect(t *testing.T, env *harness.Env) *agent {
	t.Helper()
	wire := &wireLog{next: env.AgentClient().Transport}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Bound)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   env.URL + "/mcp",
		HTTPClient: &http.Client{Transport: wire},
		// envoysim's router reads every upstream response to its end before
		// the response phases (envoysim.HTTPUpstream), so the never-ending
		// GET stream would only end at the route timeout. The standalone
		// stream is optional (the SDK's DisableStandaloneSSE doc; MCP
		// 2025-06-18, Transports, "Listening for Messages from the
		// Server": the client MAY issue a GET), and tool calls do not use it.
		DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return &agent{ClientSession: cs, wire: wire}
}

// call makes one tools/call under ctx (bounded so that a response the SDK
// cannot match to its call fails the test instead of hanging it). A
// progress token is set, new for every call, as an agent showing progress
// would.
func (a *agent) call(ctx context.Context, name string, args map[string]any) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, testwait.Bound)
	defer cancel()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	p.SetProgressToken(fmt.Sprintf("progress-%d", progressTokens.Add(1)))
	return a.CallTool(ctx, p)
}

var progressTokens atomic.Int64

// result makes a call that must succeed and returns its result's id.
func (a *agent) result(t *testing.T, ctx context.Context, name string, args map[string]any) string {
	t.Helper()
	res, err := a.call(ctx, name, args)
	return resultID(t, res, err)
}

// withKey is the context of a call whose agent sends key as the
// Idempotency-Key header (none for "").
func withKey(key string) context.Context {
	if key == "" {
		return context.Background()
	}
	return harness.WithHeaders(context.Background(), "Idempotency-Key", key)
}

// resultID is the structured result's id: which run of the tool answered.
func resultID(t *testing.T, res *mcp.CallToolResult, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("CallTool: %v", err)
	}
	if res.IsError {
		t.Fatalf("the tool failed: %+v", res.Content)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var out toolOut
	if err := json.Unmarshal(b, &out); err != nil || out.ID == "" {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return out.ID
}

// rpcErrorData is the data of the JSON-RPC errors of docs/mcp.md.
type rpcErrorData struct {
	Type       string   `json:"type"`
	Status     int      `json:"status"`
	Detail     string   `json:"detail"`
	RetryAfter *float64 `json:"retryAfter"`
}

// wantRPCError checks that a call failed with the JSON-RPC error for kind,
// as the SDK hands it to the agent (a *jsonrpc.Error in the error chain).
func wantRPCError(t *testing.T, res *mcp.CallToolResult, err error, code int64, kind problem.Kind) rpcErrorData {
	t.Helper()
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		t.Fatalf("CallTool = %+v, %v; want JSON-RPC error %d (%s)", res, err, code, kind.Slug)
	}
	var data rpcErrorData
	if err := json.Unmarshal(we.Data, &data); err != nil {
		t.Fatalf("error data %s: %v", we.Data, err)
	}
	if we.Code != code || we.Message != kind.Title || data.Type != problem.TypeBase+kind.Slug || data.Status != kind.Status {
		t.Fatalf("JSON-RPC error %d %q data %s, want %d %q type %s status %d", we.Code, we.Message, we.Data, code, kind.Title, kind.Slug, kind.Status)
	}
	return data
}

// wantWireError checks that a POST was answered with the JSON-RPC error
// for kind, to the request's own id, at HTTP 200.
func wantWireError(t *testing.T, c wireCall, code int64, kind problem.Kind) rpcErrorData {
	t.Helper()
	var msg struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *struct {
			Code    int64        `json:"code"`
			Message string       `json:"message"`
			Data    rpcErrorData `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(c.body, &msg); err != nil || msg.Error == nil {
		t.Fatalf("answer %q: %v, want a JSON-RPC error", c.body, err)
	}
	e := msg.Error
	if c.status != http.StatusOK || msg.JSONRPC != "2.0" || !bytes.Equal(msg.ID, c.id) || e.Code != code || e.Message != kind.Title ||
		e.Data.Type != problem.TypeBase+kind.Slug || e.Data.Status != kind.Status {
		t.Fatalf("answer %d %s to id %s, want 200 and error %d %s", c.status, c.body, c.id, code, kind.Slug)
	}
	return e.Data
}

// wantLost checks that a call's response was lost, as a timeout.
func wantLost(t *testing.T, res *mcp.CallToolResult, err error, loss *harness.ResponseLoss) {
	t.Helper()
	if !errors.Is(err, harness.ErrResponseLost) {
		t.Fatalf("CallTool = %+v, %v; want the lost response's timeout", res, err)
	}
	status, _, body, ok := loss.Lost()
	if !ok || status != http.StatusOK || !bytes.Contains(body, []byte(`"structuredContent"`)) {
		t.Fatalf("the lost response was %d %q (%v), want the tool's result", status, body, ok)
	}
}

// TestMCPLostResponseRetried: the tool ran and its result went back through
// Envoy (the server stored it), but the agent never got it and retries the
// call, under a new JSON-RPC id and a new progress token, with the key as a
// header or inside the arguments: the tool does not run again and the
// retry gets its result, to its own id (the SDK matches the response to the
// call by id, and would wait forever otherwise). Answers as JSON and as an
// event stream; the replay of a stored stream is its final response as
// JSON.
func TestMCPLostResponseRetried(t *testing.T) {
	for _, kt := range []struct{ name, key string }{{"header", headerKey}, {"body", bodyKey}} {
		for _, answer := range []struct {
			name string
			json bool
		}{{"json", true}, {"sse", false}} {
			t.Run(kt.name+"/"+answer.name, func(t *testing.T) {
				ts := newTools()
				env, _ := mcpEnv(t, mcpPolicy(kt.key, ""), ts, answer.json, harness.Options{})
				a := connect(t, env)
				ctx, args := withKey("lost-1"), map[string]any{"to": "ann@example.com", "subject": "hello"}
				if kt.name == "body" {
					ctx, args["idempotency_key"] = context.Background(), "lost-1"
				}
				loss := harness.NewResponseLoss()
				res, err := a.call(harness.LoseResponse(ctx, loss), "send_email", args)
				wantLost(t, res, err, loss)
				if _, h, _, _ := loss.Lost(); !strings.HasPrefix(h.Get("Content-Type"), map[bool]string{true: "application/json", false: "text/event-stream"}[answer.json]) {
					t.Fatalf("the tool server answered %q", h.Get("Content-Type"))
				}

				got := a.result(t, ctx, "send_email", args)
				if got != "msg-1-to-ann@example.com" {
					t.Fatalf("retry got %q, want the first run's result", got)
				}
				if n := ts.Runs("send_email"); n != 1 {
					t.Fatalf("send_email ran %d times, want 1", n)
				}
				first, retry := a.wire.call(t, 0), a.wire.call(t, 1)
				if bytes.Equal(first.id, retry.id) {
					t.Fatalf("the SDK retried under the same id %s", first.id)
				}
				if retry.header.Get("Idempotent-Replayed") != "true" || !strings.HasPrefix(retry.header.Get("Content-Type"), "application/json") {
					t.Fatalf("retry answered with %v, want a JSON replay", retry.header)
				}
			})
		}
	}
}

// TestMCPClientGivesUpWhileToolRuns: the agent's deadline passes while the
// tool runs, so its HTTP request is cancelled: Envoy resets the stream (the
// downstream went away before a response, envoysim's Filter.Do returns no
// response and closes the ext_proc stream with no response phase, the
// "stream ends before a response" row of docs/design.md §4) and the server
// records an unknown outcome. The SDK then sends notifications/cancelled,
// which passes. The retry gets -33063 outcome-unknown, and the tool, which
// did run, is not run again.
func TestMCPClientGivesUpWhileToolRuns(t *testing.T) {
	ts := newTools()
	ts.gate = make(chan struct{})
	m := observe.NewMetrics()
	env, _ := mcpEnv(t, mcpPolicy(headerKey, ""), ts, true, harness.Options{Metrics: m})
	a := connect(t, env)
	// A cancel stands for the deadline: net/http and the SDK both act on
	// ctx.Done() alike, and the test picks the moment by an event (the tool
	// has started) instead of a wall-clock timeout.
	ctx, cancel := context.WithCancel(withKey("gone-1"))
	defer cancel()
	args := map[string]any{"title": "printer on fire"}
	done := make(chan error, 1)
	go func() {
		_, err := a.call(ctx, "open_ticket", args)
		done <- err
	}()
	if name := <-ts.started; name != "open_ticket" {
		t.Fatalf("%s started", name)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the abandoned call returned %v", err)
	}
	testwait.Until(t, "the outcome recorded unknown", func() bool {
		return counter(t, m, "idem_extproc_decisions_total", "decision", "marked_unknown") == 1
	})
	close(ts.gate) // the ticket was opened all along; its answer has nowhere to go

	res, err := a.call(withKey("gone-1"), "open_ticket", args)
	// On the wire: the JSON-RPC error -33063 to the retry's own id.
	retry := a.wire.call(t, 1)
	data := wantWireError(t, retry, -33063, problem.OutcomeUnknown)
	if data.Detail == "" {
		t.Fatal("the outcome-unknown error has no detail for the agent")
	}
	// What the SDK hands the agent: the *jsonrpc.Error with code and data.
	// The codes avoid the Go SDK's own (internal/jsonrpc2/wire.go, go-sdk
	// v1.8.0: -32001 unknown, -32003 client closing, -32004 server closing,
	// -32005 rejected), which its call() (mcp/transport.go) would turn into
	// mcp.ErrConnectionClosed with the message only.
	if got := wantRPCError(t, res, err, -33063, problem.OutcomeUnknown); errors.Is(err, mcp.ErrConnectionClosed) || got.Detail == "" {
		t.Fatalf("CallTool error %v (detail %q): the agent must see the outcome-unknown error, not a closed connection", err, got.Detail)
	}
	if n := ts.Runs("open_ticket"); n != 1 {
		t.Fatalf("open_ticket ran %d times, want 1", n)
	}
}

// TestMCPChangedArgumentsRefused: the same key with a changed argument is
// another operation: -33061 with the problem type in data, the tool not
// run; the agent reads code and type from the SDK's error.
func TestMCPChangedArgumentsRefused(t *testing.T) {
	for _, kt := range []struct{ name, key string }{{"header", headerKey}, {"body", bodyKey}} {
		t.Run(kt.name, func(t *testing.T) {
			ts := newTools()
			env, _ := mcpEnv(t, mcpPolicy(kt.key, ""), ts, false, harness.Options{})
			a := connect(t, env)
			ctx := withKey("reuse-1")
			args := func(to string) map[string]any {
				m := map[string]any{"to": to, "subject": "invoice"}
				if kt.name == "body" {
					m["idempotency_key"] = "reuse-1"
				}
				return m
			}
			if kt.name == "body" {
				ctx = context.Background()
			}
			a.result(t, ctx, "send_email", args("bob@example.com"))
			res, err := a.call(ctx, "send_email", args("eve@example.com"))
			wantRPCError(t, res, err, -33061, problem.KeyReused)
			if n := ts.Runs("send_email"); n != 1 {
				t.Fatalf("send_email ran %d times, want 1", n)
			}
			// The session is still usable: the SDK took the error as the
			// call's answer, not as a broken transport.
			if got := a.result(t, ctx, "send_email", args("bob@example.com")); got != "msg-1-to-bob@example.com" {
				t.Fatalf("the identical retry got %q", got)
			}
		})
	}
}

// TestMCPMissingBodyKey: a required key absent from the arguments is
// -33070 key-missing, naming the pointer; the tool does not run.
func TestMCPMissingBodyKey(t *testing.T) {
	ts := newTools()
	env, _ := mcpEnv(t, mcpPolicy(bodyKey, ""), ts, true, harness.Options{})
	a := connect(t, env)
	res, err := a.call(context.Background(), "send_email", map[string]any{"to": "x@example.com"})
	data := wantRPCError(t, res, err, -33070, problem.KeyMissing)
	if !strings.Contains(data.Detail, "/params/arguments/idempotency_key") {
		t.Fatalf("detail %q does not name the pointer", data.Detail)
	}
	if n := ts.Runs("send_email"); n != 0 {
		t.Fatalf("send_email ran %d times, want 0", n)
	}
}

// TestMCPConcurrentDuplicate: a duplicate arriving while the first call's
// tool runs waits for its result with wait_for_in_flight, and without it is
// refused with -33062 request-in-progress (retryAfter in data); the tool
// runs once either way. The waiting duplicate of an SSE answer gets the
// stored stream's final response.
func TestMCPConcurrentDuplicate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		wait, json bool
	}{{"wait/json", true, true}, {"wait/sse", true, false}, {"refuse/json", false, true}} {
		wait := tc.wait
		t.Run(tc.name, func(t *testing.T) {
			ts := newTools()
			ts.gate = make(chan struct{})
			extra, opts := "", harness.Options{}
			if wait {
				extra = "    wait_for_in_flight: 20s\n"
				// The wait outlasts message_timeout; the server extends it
				// within max_message_timeout (override_message_timeout),
				// as in wait_test.go.
				cfg := envoysim.RecommendedConfig()
				cfg.MessageTimeout = durationpb.New(harness.TestMessageTimeout)
				cfg.MaxMessageTimeout = durationpb.New(60 * time.Second)
				opts.Filter = cfg
			}
			env, store := mcpEnv(t, mcpPolicy(headerKey, extra), ts, tc.json, opts)
			first, second := connect(t, env), connect(t, env)
			args := map[string]any{"title": "disk full"}
			type answer struct {
				res *mcp.CallToolResult
				err error
			}
			firstDone := make(chan answer, 1)
			go func() {
				res, err := first.call(withKey("dup-1"), "open_ticket", args)
				firstDone <- answer{res, err}
			}()
			<-ts.started
			if !wait {
				res, err := second.call(withKey("dup-1"), "open_ticket", args)
				if data := wantRPCError(t, res, err, -33062, problem.InProgress); data.RetryAfter == nil {
					t.Fatal("request-in-progress carries no retryAfter")
				}
				close(ts.gate)
			} else {
				// Release the tool once the duplicate has found the record
				// in flight (its Reserve returned): from then on it waits.
				reserves := store.reserves.Load()
				dup := make(chan answer, 1)
				go func() {
					res, err := second.call(withKey("dup-1"), "open_ticket", args)
					dup <- answer{res, err}
				}()
				testwait.Until(t, "the duplicate reserved", func() bool { return store.reserves.Load() > reserves })
				close(ts.gate)
				d := <-dup
				if got := resultID(t, d.res, d.err); got != "ticket-1-disk full" {
					t.Fatalf("the waiting duplicate got %q, want the first run's result", got)
				}
			}
			f := <-firstDone
			if got := resultID(t, f.res, f.err); got != "ticket-1-disk full" {
				t.Fatalf("first call got %q", got)
			}
			if n := ts.Runs("open_ticket"); n != 1 {
				t.Fatalf("open_ticket ran %d times, want 1", n)
			}
		})
	}
}

// TestMCPDerivedKey: an agent that sends no key at all, on a policy that
// derives one from the tool name and arguments: its identical retry after
// a lost response is recognised (the tool runs once), while changed
// arguments are another operation and run (derived keys hash the
// arguments, so there is no conflict to report).
func TestMCPDerivedKey(t *testing.T) {
	ts := newTools()
	env, _ := mcpEnv(t, mcpPolicy(derivedKey, ""), ts, false, harness.Options{})
	a := connect(t, env)
	args := map[string]any{"to": "cat@example.com", "subject": "weekly report"}
	loss := harness.NewResponseLoss()
	res, err := a.call(harness.LoseResponse(context.Background(), loss), "send_email", args)
	wantLost(t, res, err, loss)
	if got := a.result(t, context.Background(), "send_email", args); got != "msg-1-to-cat@example.com" {
		t.Fatalf("retry got %q", got)
	}
	if n := ts.Runs("send_email"); n != 1 {
		t.Fatalf("send_email ran %d times after the retry, want 1", n)
	}
	changed := map[string]any{"to": "cat@example.com", "subject": "monthly report"}
	if got := a.result(t, context.Background(), "send_email", changed); got != "msg-2-to-cat@example.com" {
		t.Fatalf("changed arguments got %q, want a second run", got)
	}
	if n := ts.Runs("send_email"); n != 2 {
		t.Fatalf("send_email ran %d times, want 2", n)
	}
	for _, c := range a.wire.all() {
		if c.header.Get("Idempotency-Key") != "" || c.reqHeader.Get("Idempotency-Key") != "" {
			t.Fatalf("an Idempotency-Key header crossed the wire: %v", c.reqHeader)
		}
	}
}

// TestMCPReconnectedAgentRecognised: an agent whose session broke
// reconnects (a new client session, a new Mcp-Session-Id, JSON-RPC ids
// counting afresh) and retries: still the same operation, replayed to the
// new session's id.
func TestMCPReconnectedAgentRecognised(t *testing.T) {
	for _, kt := range []struct{ name, key string }{{"header", headerKey}, {"derived", derivedKey}} {
		t.Run(kt.name, func(t *testing.T) {
			ts := newTools()
			env, _ := mcpEnv(t, mcpPolicy(kt.key, ""), ts, false, harness.Options{})
			ctx := withKey("reconnect-1")
			if kt.name == "derived" {
				ctx = context.Background()
			}
			args := map[string]any{"to": "dan@example.com", "subject": "contract"}
			old := connect(t, env)
			// A read first, so the lost call's id differs from the one the
			// new session will use.
			if _, err := old.ListTools(ctx, nil); err != nil {
				t.Fatal(err)
			}
			loss := harness.NewResponseLoss()
			res, err := old.call(harness.LoseResponse(ctx, loss), "send_email", args)
			wantLost(t, res, err, loss)
			_ = old.Close()

			a := connect(t, env)
			if a.ID() == "" || a.ID() == old.ID() {
				t.Fatalf("session ids %q then %q, want two", old.ID(), a.ID())
			}
			if got := a.result(t, ctx, "send_email", args); got != "msg-1-to-dan@example.com" {
				t.Fatalf("the reconnected agent got %q", got)
			}
			if n := ts.Runs("send_email"); n != 1 {
				t.Fatalf("send_email ran %d times, want 1", n)
			}
			lost, retry := old.wire.call(t, 0), a.wire.call(t, 0)
			if bytes.Equal(lost.id, retry.id) || lost.reqHeader.Get("Mcp-Session-Id") == retry.reqHeader.Get("Mcp-Session-Id") {
				t.Fatalf("lost call id %s session %q, retry id %s session %q: want both to differ",
					lost.id, lost.reqHeader.Get("Mcp-Session-Id"), retry.id, retry.reqHeader.Get("Mcp-Session-Id"))
			}
		})
	}
}

// TestMCPSessionTrafficCostsNoRedisCall: initialize, notifications,
// tools/list, ping and a call of a tool outside the policy's list pass
// with no store call and no Redis command, even with an Idempotency-Key on
// every request, in three messages whose last skips the response body; a
// protected call then does reach the store (so the count can tell).
func TestMCPSessionTrafficCostsNoRedisCall(t *testing.T) {
	ts := newTools()
	env, store := mcpEnv(t, mcpPolicy(headerKey, ""), ts, false, harness.Options{})
	ctx := withKey("session-traffic")
	if err := env.Store.Ping(ctx); err != nil { // the client's connection, not counted
		t.Fatal(err)
	}
	before, err := env.Redis.CommandCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := connect(t, env)
	if _, err := a.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got := a.result(t, ctx, "lookup", map[string]any{"query": "q"}); got != fmt.Sprintf("lookup-%d", i+1) {
			t.Fatalf("lookup %d got %q: an unprotected read must run every time", i, got)
		}
	}
	after, err := env.Redis.CommandCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before || store.calls.Load() != 0 {
		t.Fatalf("session traffic issued %d Redis commands and %d store calls, want none", after-before, store.calls.Load())
	}
	// Each was decided at its body and its answer let through unbuffered:
	// the server ends the stream with its reply to the body (stream.go, processor.finished), so
	// the response body is never sent to it. Envoy may still have sent the
	// response headers before it read the close (then their message is
	// the last, and continues unprocessed: Filter::onGrpcClose).
	for _, r := range env.Results() {
		ms := r.Messages
		if len(ms) < 2 || ms[1].Phase != envoysim.PhaseRequestBody || ms[1].Reply != "continue" {
			t.Fatalf("session traffic exchange %v, want request headers and body answered", r)
		}
		if len(ms) > 3 || len(ms) == 3 && ms[2].Phase != envoysim.PhaseResponseHeaders {
			t.Fatalf("session traffic exchange %v, want nothing after the request body but, at most, the response headers", r)
		}
	}
	methods := a.wire.methods()
	for _, m := range []string{"initialize", "notifications/initialized", "tools/list", "ping", "tools/call"} {
		if !strings.Contains(methods, m) {
			t.Fatalf("the agent sent %s, not %s", methods, m)
		}
	}
	a.result(t, ctx, "send_email", map[string]any{"to": "fay@example.com"})
	if store.calls.Load() == 0 {
		t.Fatal("a protected tools/call made no store call")
	}
}

// TestMCPStoreUnavailable: with Redis gone, a fail_closed policy refuses
// the call with -33064 (retryAfter in data) and the tool does not run; the
// SDK client hands the agent that error with its data (see
// TestMCPClientGivesUpWhileToolRuns for why the codes avoid the SDK's own).
func TestMCPStoreUnavailable(t *testing.T) {
	ts := newTools()
	env, _ := mcpEnv(t, mcpPolicy(headerKey, ""), ts, true, harness.Options{StoreTimeout: time.Second})
	a := connect(t, env)
	env.Redis.Kill()
	res, err := a.call(withKey("down-1"), "send_email", map[string]any{"to": "gil@example.com"})
	if data := wantWireError(t, a.wire.call(t, 0), -33064, problem.StoreUnavailable); data.RetryAfter == nil {
		t.Fatal("store-unavailable carries no retryAfter")
	}
	if got := wantRPCError(t, res, err, -33064, problem.StoreUnavailable); errors.Is(err, mcp.ErrConnectionClosed) || got.RetryAfter == nil {
		t.Fatalf("CallTool error %v: the agent must see store-unavailable with retryAfter, not a closed connection", err)
	}
	if n := ts.Runs("send_email"); n != 0 {
		t.Fatalf("send_email ran %d times, want 0", n)
	}
}

// storeCalls counts the server's store calls, keeping the store's
// Watcher so that waits work as without it.
type storeCalls struct {
	calls, reserves atomic.Int64
}

func (c *storeCalls) wrap(st idem.Store) idem.Store {
	cs := &counted{Store: st, c: c}
	if w, ok := st.(idem.Watcher); ok {
		return &countedWatcher{counted: cs, w: w}
	}
	return cs
}

type counted struct {
	idem.Store
	c *storeCalls
}

func (s *counted) Reserve(ctx context.Context, r idem.Reservation) (idem.ReserveResult, error) {
	s.c.calls.Add(1)
	defer s.c.reserves.Add(1) // counted once the store has answered
	return s.Store.Reserve(ctx, r)
}

func (s *counted) Renew(ctx context.Context, id idem.RecordID, tok idem.Token, lease time.Duration) error {
	s.c.calls.Add(1)
	return s.Store.Renew(ctx, id, tok, lease)
}

func (s *counted) Complete(ctx context.Context, id idem.RecordID, tok idem.Token, resp idem.Response, retention time.Duration) error {
	s.c.calls.Add(1)
	return s.Store.Complete(ctx, id, tok, resp, retention)
}

func (s *counted) Release(ctx context.Context, id idem.RecordID, tok idem.Token) error {
	s.c.calls.Add(1)
	return s.Store.Release(ctx, id, tok)
}

func (s *counted) MarkUnknown(ctx context.Context, id idem.RecordID, tok idem.Token, retention time.Duration) error {
	s.c.calls.Add(1)
	return s.Store.MarkUnknown(ctx, id, tok, retention)
}

func (s *counted) Get(ctx context.Context, id idem.RecordID) (idem.Record, error) {
	s.c.calls.Add(1)
	return s.Store.Get(ctx, id)
}

type countedWatcher struct {
	*counted
	w idem.Watcher
}

func (s *countedWatcher) Watch(ctx context.Context, id idem.RecordID) (<-chan struct{}, func(), error) {
	s.c.calls.Add(1)
	return s.w.Watch(ctx, id)
}

// wireLog records the agent's POSTs as they crossed the wire: the JSON-RPC
// request's method and id, the request headers, and the answer's headers.
type wireLog struct {
	next http.RoundTripper

	mu    sync.Mutex
	calls []wireCall
}

type wireCall struct {
	method    string
	id        json.RawMessage
	reqHeader http.Header
	status    int
	header    http.Header
	body      []byte
	err       error
}

func (w *wireLog) RoundTrip(req *http.Request) (*http.Response, error) {
	var msg struct {
		Method string          `json:"method"`
		ID     json.RawMessage `json:"id"`
	}
	if req.Method == http.MethodPost && req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			b, _ := io.ReadAll(body)
			_ = json.Unmarshal(b, &msg)
		}
	}
	resp, err := w.next.RoundTrip(req)
	if req.Method == http.MethodPost {
		c := wireCall{method: msg.Method, id: msg.ID, reqHeader: req.Header.Clone(), err: err}
		if resp != nil {
			// envoysim has buffered the whole answer already, so reading it
			// here changes nothing the client sees.
			c.status, c.header = resp.StatusCode, resp.Header.Clone()
			c.body, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(c.body))
		}
		w.mu.Lock()
		w.calls = append(w.calls, c)
		w.mu.Unlock()
	}
	return resp, err
}

// call returns the agent's i-th tools/call.
func (w *wireLog) call(t *testing.T, i int) wireCall {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.calls {
		if c.method == "tools/call" {
			if n == i {
				return c
			}
			n++
		}
	}
	t.Fatalf("the agent made %d tools/call requests, not %d", n, i+1)
	return wireCall{}
}

// all returns every recorded POST.
func (w *wireLog) all() []wireCall {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]wireCall(nil), w.calls...)
}

// methods lists the methods the agent sent, in order.
func (w *wireLog) methods() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ms []string
	for _, c := range w.calls {
		ms = append(ms, c.method)
	}
	return strings.Join(ms, " ")
}

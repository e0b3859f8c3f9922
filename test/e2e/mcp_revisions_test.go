package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// The two MCP protocol revisions the product serves, each played by the
// official Go SDK (v1.8.0) as agent and tool server in its own mode:
//
//   - 2026-07-28, stateless (StreamableHTTPOptions.Stateless; the default
//     client probes server/discover and then sends every request with its
//     version in _meta, no initialize, no Mcp-Session-Id). A tool that
//     needs input answers with an interim result (resultType
//     "input_required", inputRequests, requestState), and the client
//     retries the original call with a new JSON-RPC id, adding
//     params.inputResponses and echoing params.requestState
//     (modelcontextprotocol, docs/specification/2026-07-28/basic/patterns/
//     mrtr.mdx, "Basic Workflow", "Client Requirements"). The go-sdk's
//     clientMultiRoundTripMiddleware does this inside one CallTool
//     (mcp/mrtr.go), each round through the HTTP client, hence under the
//     same Idempotency-Key.
//   - 2025-11-25, with sessions: the same tool handler's input requests are
//     fulfilled by the server itself (serverMultiRoundTripMiddleware,
//     mcp/mrtr.go), which sends elicitation/create to the client and
//     re-invokes the handler, all within the one tools/call.

// refundIn is the arguments of approve_refund.
type refundIn struct {
	Order string `json:"order"`
}

// mrtrTools is an MCP tool server with one tool, approve_refund, that asks
// the agent to confirm before it refunds: its first round answers with an
// input request and a requestState, which, as a one-time redemption would
// (mrtr.mdx, "Server Requirements", the Warning on single use), it accepts
// once: a second continuation carrying the same requestState is refused.
// Only the final step has an effect, and it is counted.
type mrtrTools struct {
	mu       sync.Mutex
	interims int             // first rounds answered with an input request
	finals   int             // refunds made: the effect
	refused  int             // continuations refused for a used requestState
	states   map[string]bool // requestStates issued; true once redeemed
	// finalStarted receives each final step as it begins; gate, when set,
	// holds the final step after its effect until closed.
	finalStarted chan struct{}
	gate         chan struct{}
}

func newMRTRTools() *mrtrTools {
	return &mrtrTools{states: map[string]bool{}, finalStarted: make(chan struct{}, 16)}
}

func (m *mrtrTools) counts() (interims, finals, refused int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.interims, m.finals, m.refused
}

func (m *mrtrTools) refund(_ context.Context, req *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, any, error) {
	m.mu.Lock()
	if len(req.Params.InputResponses) == 0 {
		m.interims++
		state := fmt.Sprintf("refund-state-%d", m.interims)
		m.states[state] = false
		m.mu.Unlock()
		return &mcp.CallToolResult{
			InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{
				Mode:    "form",
				Message: "Refund order " + in.Order + "?",
				RequestedSchema: map[string]any{
					"type":       "object",
					"properties": map[string]any{"ok": map[string]any{"type": "boolean"}},
				},
			}},
			RequestState: state,
		}, nil, nil
	}
	redeemed, issued := m.states[req.Params.RequestState]
	if !issued || redeemed {
		m.refused++
		m.mu.Unlock()
		return nil, nil, fmt.Errorf("requestState %q is not redeemable", req.Params.RequestState)
	}
	confirm, _ := req.Params.InputResponses["confirm"].(*mcp.ElicitResult)
	if confirm == nil || confirm.Action != "accept" || confirm.Content["ok"] != true {
		m.mu.Unlock()
		return nil, nil, fmt.Errorf("refund not confirmed: %+v", req.Params.InputResponses)
	}
	m.states[req.Params.RequestState] = true
	m.finals++
	n := m.finals
	gate := m.gate
	m.mu.Unlock()
	m.finalStarted <- struct{}{}
	if gate != nil {
		<-gate // the refund is made; its answer waits, as a slow backend's would
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("refund-%d-%s", n, in.Order)}}}, nil, nil
}

// handler serves the tool over Streamable HTTP: stateless (2026-07-28) or
// with sessions (2025-11-25 and earlier; the SDK's stateful transport
// refuses 2026-07-28, mcp/streamable.go SupportsProtocolVersion), its
// answers as JSON or as an event stream.
func (m *mrtrTools) handler(stateless, jsonResponse bool) http.Handler {
	server := mcp.NewServer(&mcp.Implementation{Name: "refunds", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "approve_refund"}, m.refund)
	mcp.AddTool(server, &mcp.Tool{Name: "lookup"}, func(context.Context, *mcp.CallToolRequest, lookupIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "found"}}}, nil, nil
	})
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: stateless, JSONResponse: jsonResponse})
}

// refundPolicy protects approve_refund as docs/mcp.md does a tool with
// effects: decided at the body, the fingerprint without the JSON-RPC id
// and _meta (where 2026-07-28 puts the protocol version and client info).
// Nothing in it names the continuation's members: the configuration adds
// them to every JSON-RPC fingerprint's exclusions.
func refundPolicy(key, extra string) string {
	return `
policies:
  - name: refunds
    match:
      methods: [POST]
      path: {exact: /mcp}
      json:
        - {pointer: /method, equals: tools/call}
        - {pointer: /params/name, equals: approve_refund}
    key: ` + key + `
    fingerprint:
      json: true
      exclude: [/id, /params/_meta]
    answers: jsonrpc
` + extra + `
default_policy: {enabled: false}
`
}

// confirmRefund is the agent's answer to the tool's input request.
func confirmRefund(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}, nil
}

// loseContinuation drops the answer to the next POST that carries
// params.inputResponses once armed, after reading it whole (the proxy, the
// ext_proc server and the tool server are done with it), as a response
// stream that broke on its way back would be lost.
type loseContinuation struct {
	next  http.RoundTripper
	armed atomic.Bool
	lost  atomic.Pointer[[]byte]
}

func (l *loseContinuation) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.GetBody == nil || !l.armed.Load() {
		return l.next.RoundTrip(req)
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	b, _ := io.ReadAll(body)
	if !bytes.Contains(b, []byte(`"inputResponses"`)) || !l.armed.CompareAndSwap(true, false) {
		return l.next.RoundTrip(req)
	}
	resp, err := l.next.RoundTrip(req)
	if err != nil {
		return nil, errors.Join(err, harness.ErrResponseLost)
	}
	lost, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	l.lost.Store(&lost)
	return nil, harness.ErrResponseLost
}

// revisionAgent is an SDK client session through the proxy, with its wire
// log and the continuation-dropping transport under it.
type revisionAgent struct {
	*mcp.ClientSession
	wire *wireLog
	lose *loseContinuation
}

// connectRevision connects an SDK client through the proxy. version ""
// is the SDK's default (2026-07-28 after a server/discover probe);
// otherwise the client starts with initialize at that version. opts are
// the client's options (the elicitation handler is set when none is).
func connectRevision(t *testing.T, env *harness.Env, version string, opts *mcp.ClientOptions, direct http.RoundTripper) *revisionAgent {
	t.Helper()
	if opts == nil {
		opts = &mcp.ClientOptions{}
	}
	if opts.ElicitationHandler == nil {
		opts.ElicitationHandler = confirmRefund
	}
	lose := &loseContinuation{next: env.AgentClient().Transport}
	wire := &wireLog{next: lose}
	var rt http.RoundTripper = wire
	if direct != nil {
		rt = direct
	}
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Bound)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, opts).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   env.URL + "/mcp",
		HTTPClient: &http.Client{Transport: rt},
		// The standalone GET stream never ends, and envoysim forwards an
		// upstream answer only once it is whole (see connect).
		DisableStandaloneSSE: direct == nil,
	}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return &revisionAgent{ClientSession: cs, wire: wire, lose: lose}
}

// refund calls approve_refund for order under ctx, bounded.
func (a *revisionAgent) refund(ctx context.Context, order string) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, testwait.Bound)
	defer cancel()
	return a.CallTool(ctx, &mcp.CallToolParams{Name: "approve_refund", Arguments: map[string]any{"order": order}})
}

// refundText returns a function giving a final result's text, which fails
// the test on anything else: refundText(t)(a.refund(ctx, order)).
func refundText(t *testing.T) func(*mcp.CallToolResult, error) string {
	return func(res *mcp.CallToolResult, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("CallTool: %v", err)
		}
		if res.IsError || res.NeedsInput() || len(res.Content) != 1 {
			t.Fatalf("CallTool result %+v, want the refund's final result", res)
		}
		text, ok := res.Content[0].(*mcp.TextContent)
		if !ok {
			t.Fatalf("content %T", res.Content[0])
		}
		return text.Text
	}
}

// wantCounts checks the tool server's counts.
func (m *mrtrTools) wantCounts(t *testing.T, interims, finals int) {
	t.Helper()
	i, f, r := m.counts()
	if i != interims || f != finals || r != 0 {
		t.Fatalf("the tool server answered %d first rounds, made %d refunds and refused %d continuations; want %d, %d and 0",
			i, f, r, interims, finals)
	}
}

// posts is how many POSTs of method the agent sent.
func (w *wireLog) posts(method string) int {
	n := 0
	for _, c := range w.all() {
		if c.method == method {
			n++
		}
	}
	return n
}

// TestMCP2026MultiRoundTrip: a tools/call of the 2026-07-28 revision that
// needs input is one operation under its key, a header key the agent's HTTP
// client puts on every round or a key derived from the tool and its
// arguments. The interim round reaches the tool server and its answer is
// not stored; the continuation (a new JSON-RPC id, with inputResponses and
// the echoed requestState) runs the final step, once; its result is what
// the agent gets and what a retry of the whole call gets, from round 1,
// without reaching the tool server, whose requestState would not be
// redeemed twice.
func TestMCP2026MultiRoundTrip(t *testing.T) {
	for _, kt := range []struct{ name, key string }{{"header", headerKey}, {"derived", derivedKey}} {
		for _, answer := range []struct {
			name string
			json bool
		}{{"json", true}, {"sse", false}} {
			t.Run(kt.name+"/"+answer.name, func(t *testing.T) {
				m := newMRTRTools()
				env := harness.Start(t, harness.Options{Policies: policies(t, refundPolicy(kt.key, "")), UpstreamHandler: m.handler(true, answer.json)})
				a := connectRevision(t, env, "", nil, nil)
				ctx := withKey("refund-1")
				if kt.name == "derived" {
					ctx = context.Background()
				}

				if got := refundText(t)(a.refund(ctx, "ord-9")); got != "refund-1-ord-9" {
					t.Fatalf("the call got %q", got)
				}
				m.wantCounts(t, 1, 1)
				first, cont := a.wire.call(t, 0), a.wire.call(t, 1)
				if !strings.Contains(string(first.body), `"input_required"`) || bytes.Equal(first.id, cont.id) ||
					first.reqHeader.Get("Mcp-Protocol-Version") != "2026-07-28" || first.reqHeader.Get("Mcp-Session-Id") != "" {
					t.Fatalf("round 1 %s %v answered %s, continuation id %s: want a stateless 2026-07-28 interim round and a new id",
						first.id, first.reqHeader, first.body, cont.id)
				}
				// The header policy's key is required (a call without one is
				// refused -33070): that both rounds passed is that both
				// carried it, added below the wire log by harness.WithHeaders.

				// The whole call again under the same key, as an agent does
				// when the final answer never reached it: round 1 gets the
				// final result, replayed to its own id.
				if got := refundText(t)(a.refund(ctx, "ord-9")); got != "refund-1-ord-9" {
					t.Fatalf("the retry got %q, want the stored final result", got)
				}
				m.wantCounts(t, 1, 1)
				if r := a.wire.call(t, 2); r.header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("the retry was answered %d %v %s, want the replay", r.status, r.header, r.body)
				}
				if n := a.wire.posts("tools/call"); n != 3 {
					t.Fatalf("the agent sent %d tools/call POSTs, want 3 (the retry ends at round 1)", n)
				}
			})
		}
	}
}

// TestMCP2026MultiRoundTripLostFinal: the continuation's answer, the final
// result, is lost on its way back (the tool server made the refund and the
// proxy stored it). The agent re-issues the call from round 1 with the
// same key (the go-sdk client restarts the exchange: mcp/mrtr.go), and
// gets the stored final result without the tool server being reached.
func TestMCP2026MultiRoundTripLostFinal(t *testing.T) {
	for _, kt := range []struct{ name, key string }{{"header", headerKey}, {"derived", derivedKey}} {
		t.Run(kt.name, func(t *testing.T) {
			m := newMRTRTools()
			env := harness.Start(t, harness.Options{Policies: policies(t, refundPolicy(kt.key, "")), UpstreamHandler: m.handler(true, true)})
			a := connectRevision(t, env, "", nil, nil)
			ctx := withKey("refund-2")
			if kt.name == "derived" {
				ctx = context.Background()
			}
			a.lose.armed.Store(true)
			if res, err := a.refund(ctx, "ord-10"); !errors.Is(err, harness.ErrResponseLost) {
				t.Fatalf("CallTool = %+v, %v; want the lost final answer", res, err)
			}
			if lost := a.lose.lost.Load(); lost == nil || !bytes.Contains(*lost, []byte("refund-1-ord-10")) {
				t.Fatalf("the lost answer was %v, want the final result", lost)
			}
			m.wantCounts(t, 1, 1)

			if got := refundText(t)(a.refund(ctx, "ord-10")); got != "refund-1-ord-10" {
				t.Fatalf("the re-issued call got %q, want the stored final result", got)
			}
			m.wantCounts(t, 1, 1)
			if r := a.wire.call(t, 2); r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the re-issue was answered %d %v %s, want the replay", r.status, r.header, r.body)
			}
		})
	}
}

// TestMCP2026MultiRoundTripLostInterim: the first round's answer, the input
// request, is lost. Nothing final exists, so the re-issued call reaches the
// tool server again, gets a fresh input request and requestState, and the
// exchange ends with one refund; a further retry is replayed.
func TestMCP2026MultiRoundTripLostInterim(t *testing.T) {
	m := newMRTRTools()
	env := harness.Start(t, harness.Options{Policies: policies(t, refundPolicy(headerKey, "")), UpstreamHandler: m.handler(true, false)})
	a := connectRevision(t, env, "", nil, nil)
	loss := harness.NewResponseLoss()
	if res, err := a.refund(harness.LoseResponse(withKey("refund-3"), loss), "ord-11"); !errors.Is(err, harness.ErrResponseLost) {
		t.Fatalf("CallTool = %+v, %v; want the lost interim answer", res, err)
	}
	if _, _, body, ok := loss.Lost(); !ok || !bytes.Contains(body, []byte(`"input_required"`)) {
		t.Fatalf("the lost answer was %q, want the interim result", body)
	}
	m.wantCounts(t, 1, 0)

	if got := refundText(t)(a.refund(withKey("refund-3"), "ord-11")); got != "refund-1-ord-11" {
		t.Fatalf("the re-issued call got %q", got)
	}
	m.wantCounts(t, 2, 1)
	if got := refundText(t)(a.refund(withKey("refund-3"), "ord-11")); got != "refund-1-ord-11" {
		t.Fatalf("a further retry got %q", got)
	}
	m.wantCounts(t, 2, 1)
}

// TestMCP2026MultiRoundTripSingleUseState: an agent that drives the rounds
// itself (the go-sdk's MultiRoundTrip disabled) and re-sends its last
// continuation, the same requestState, after losing the final answer, as
// mrtr.mdx allows a client to: the tool server would refuse that
// requestState a second time, and the replay answers it without reaching
// the tool server.
func TestMCP2026MultiRoundTripSingleUseState(t *testing.T) {
	m := newMRTRTools()
	env := harness.Start(t, harness.Options{Policies: policies(t, refundPolicy(headerKey, "")), UpstreamHandler: m.handler(true, true)})
	a := connectRevision(t, env, "", &mcp.ClientOptions{MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}}, nil)
	ctx, cancel := context.WithTimeout(withKey("refund-4"), testwait.Bound)
	defer cancel()
	args := map[string]any{"order": "ord-12"}
	interim, err := a.CallTool(ctx, &mcp.CallToolParams{Name: "approve_refund", Arguments: args})
	if err != nil || !interim.NeedsInput() || interim.RequestState == "" {
		t.Fatalf("round 1 = %+v, %v; want an input request with a requestState", interim, err)
	}
	cont := &mcp.CallToolParams{Name: "approve_refund", Arguments: args, RequestState: interim.RequestState,
		InputResponses: mcp.InputResponseMap{"confirm": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"ok": true}}}}
	a.lose.armed.Store(true)
	if res, err := a.CallTool(ctx, cont); !errors.Is(err, harness.ErrResponseLost) {
		t.Fatalf("continuation = %+v, %v; want the lost final answer", res, err)
	}
	m.wantCounts(t, 1, 1)
	if got := refundText(t)(a.CallTool(ctx, cont)); got != "refund-1-ord-12" {
		t.Fatalf("the re-sent continuation got %q, want the stored final result", got)
	}
	m.wantCounts(t, 1, 1) // wantCounts also checks that nothing was refused
}

// TestMCP2026StatelessTrafficCostsNoStoreCall: the default 2026-07-28
// client against a stateless server opens with server/discover (no
// initialize, no session), lists the tools and calls an unprotected one:
// each passes untouched with no store call and no Redis command, even with
// an Idempotency-Key on every request. A protected call is still protected:
// it reaches the store, and its retry is replayed.
func TestMCP2026StatelessTrafficCostsNoStoreCall(t *testing.T) {
	m := newMRTRTools()
	cs := &storeCalls{}
	env := harness.Start(t, harness.Options{Policies: policies(t, refundPolicy(headerKey, "")), UpstreamHandler: m.handler(true, false), WrapStore: cs.wrap})
	ctx := withKey("stateless-traffic")
	if err := env.Store.Ping(ctx); err != nil { // the client's connection, not counted
		t.Fatal(err)
	}
	before, err := env.Redis.CommandCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := connectRevision(t, env, "", nil, nil)
	if _, err := a.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		res, err := a.CallTool(ctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"query": "q"}})
		if err != nil || res.IsError {
			t.Fatalf("lookup = %+v, %v", res, err)
		}
	}
	after, err := env.Redis.CommandCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before || cs.calls.Load() != 0 {
		t.Fatalf("stateless traffic issued %d Redis commands and %d store calls, want none", after-before, cs.calls.Load())
	}
	if got := a.wire.methods(); !strings.HasPrefix(got, "server/discover ") || strings.Contains(got, "initialize") {
		t.Fatalf("the agent sent %s, want server/discover first and no initialize", got)
	}
	for _, c := range a.wire.all() {
		if c.status != http.StatusOK || c.reqHeader.Get("Mcp-Session-Id") != "" || c.header.Get("Mcp-Session-Id") != "" ||
			c.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s answered %d %v (request %v), want it passed untouched and sessionless", c.method, c.status, c.header, c.reqHeader)
		}
		if c.method != "server/discover" && c.reqHeader.Get("Mcp-Protocol-Version") != "2026-07-28" {
			t.Fatalf("%s was sent at %q, want 2026-07-28", c.method, c.reqHeader.Get("Mcp-Protocol-Version"))
		}
	}

	if got := refundText(t)(a.refund(ctx, "ord-13")); got != "refund-1-ord-13" {
		t.Fatalf("the protected call got %q", got)
	}
	if cs.calls.Load() == 0 {
		t.Fatal("a protected tools/call made no store call")
	}
	if got := refundText(t)(a.refund(ctx, "ord-13")); got != "refund-1-ord-13" {
		t.Fatalf("its retry got %q", got)
	}
	m.wantCounts(t, 1, 1)
}

// TestMCP2026ReissueWhileRunning: a 2026-07-28 agent whose response stream
// broke "MUST re-issue it as a new request with a new request ID"
// (docs/specification/2026-07-28/changelog.mdx, major change 9); the go-sdk
// agent re-issues a multi round-trip call from round 1. While the first
// attempt's final step still runs, the re-issue is refused -33062
// request-in-progress, or, with wait_for_in_flight, waits for it and gets
// its final result: one refund either way.
func TestMCP2026ReissueWhileRunning(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(map[bool]string{false: "refuse", true: "wait"}[wait], func(t *testing.T) {
			m := newMRTRTools()
			m.gate = make(chan struct{})
			extra, opts := "", harness.Options{}
			if wait {
				extra = "    wait_for_in_flight: 20s\n"
				cfg := envoysim.RecommendedConfig()
				cfg.MessageTimeout = durationpb.New(harness.TestMessageTimeout)
				cfg.MaxMessageTimeout = durationpb.New(60 * time.Second)
				opts.Filter = cfg
			}
			cs := &storeCalls{}
			opts.Policies, opts.UpstreamHandler, opts.WrapStore = policies(t, refundPolicy(headerKey, extra)), m.handler(true, true), cs.wrap
			env := harness.Start(t, opts)
			// Registered after the harness's own cleanup, so it runs before
			// it: a failing test still lets the held tool answer, and the
			// tool server close.
			var once sync.Once
			release := func() { once.Do(func() { close(m.gate) }) }
			t.Cleanup(release)
			a := connectRevision(t, env, "", nil, nil)
			type answer struct {
				res *mcp.CallToolResult
				err error
			}
			firstDone := make(chan answer, 1)
			go func() {
				res, err := a.refund(withKey("refund-5"), "ord-14")
				firstDone <- answer{res, err}
			}()
			<-m.finalStarted
			if !wait {
				res, err := a.refund(withKey("refund-5"), "ord-14")
				if data := wantRPCError(t, res, err, -33062, problem.InProgress); data.RetryAfter == nil {
					t.Fatal("request-in-progress carries no retryAfter")
				}
				release()
			} else {
				reserves := cs.reserves.Load()
				reissue := make(chan answer, 1)
				go func() {
					res, err := a.refund(withKey("refund-5"), "ord-14")
					reissue <- answer{res, err}
				}()
				testwait.Until(t, "the re-issue reserved", func() bool { return cs.reserves.Load() > reserves })
				release()
				r := <-reissue
				if got := refundText(t)(r.res, r.err); got != "refund-1-ord-14" {
					t.Fatalf("the waiting re-issue got %q, want the first attempt's final result", got)
				}
			}
			f := <-firstDone
			if got := refundText(t)(f.res, f.err); got != "refund-1-ord-14" {
				t.Fatalf("the first attempt got %q", got)
			}
			m.wantCounts(t, 1, 1)
		})
	}
}

// splitRoute sends the agent's GETs (the 2025-11-25 standalone stream)
// straight to the tool server, as an Envoy route that leaves GET
// unprocessed streams it (docs/mcp.md, "Envoy, Envoy Gateway and Envoy AI
// Gateway"; envoy/envoy-mcp.yaml), which envoysim cannot: its router
// forwards an upstream answer once it is whole. Everything else goes
// through the proxy (post).
type splitRoute struct {
	post     http.RoundTripper
	upstream string
}

func (s splitRoute) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		return s.post.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	u, err := req.URL.Parse(s.upstream + req.URL.Path)
	if err != nil {
		return nil, err
	}
	req.URL, req.Host = u, ""
	return http.DefaultTransport.RoundTrip(req)
}

// TestMCP2025MultiRoundTrip: the same tool handler in the 2025-11-25
// revision, with sessions: the go-sdk server fulfils the input request
// itself (serverMultiRoundTripMiddleware) by sending elicitation/create to
// the agent, here on its standalone GET stream (JSON answers: the server
// sends a request not answering one out of band, mcp/streamable.go), and
// the agent POSTs its answer, a JSON-RPC response the policy does not
// take. The protected tools/call is one POST, one refund; its retry under
// the same key is replayed without reaching the tool server.
func TestMCP2025MultiRoundTrip(t *testing.T) {
	m := newMRTRTools()
	env := harness.Start(t, harness.Options{Policies: policies(t, refundPolicy(headerKey, "")), UpstreamHandler: m.handler(false, true)})
	lose := &loseContinuation{next: env.AgentClient().Transport}
	wire := &wireLog{next: lose}
	a := connectRevision(t, env, "2025-11-25", nil, splitRoute{post: wire, upstream: env.Upstream.URL()})
	a.wire, a.lose = wire, lose
	if a.ID() == "" {
		t.Fatal("no session: the 2025-11-25 server assigns one")
	}
	if got := refundText(t)(a.refund(withKey("refund-6"), "ord-15")); got != "refund-1-ord-15" {
		t.Fatalf("the call got %q", got)
	}
	m.wantCounts(t, 1, 1)
	if n := a.wire.posts("tools/call"); n != 1 {
		t.Fatalf("the agent sent %d tools/call POSTs, want 1 (the server drives the input request)", n)
	}
	answered := 0
	for _, c := range a.wire.all() {
		if c.method == "" && c.status == http.StatusAccepted {
			answered++ // the agent's response to elicitation/create
		}
		if v := c.reqHeader.Get("Mcp-Protocol-Version"); c.method != "initialize" && v != "2025-11-25" {
			t.Fatalf("%s sent at %q", c.method, v)
		}
	}
	if answered != 1 {
		t.Fatalf("the agent POSTed %d answers to the server's request, want 1: %s", answered, a.wire.methods())
	}
	if got := refundText(t)(a.refund(withKey("refund-6"), "ord-15")); got != "refund-1-ord-15" {
		t.Fatalf("the retry got %q", got)
	}
	if r := a.wire.call(t, 1); r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry was answered %d %v %s, want the replay", r.status, r.header, r.body)
	}
	m.wantCounts(t, 1, 1)
}

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// Protecting tools by their annotations (tools.protect: unless_hinted)
// through envoysim, the real server and a real redis-server: a tools/list
// answer teaches the server which tools say they are read-only or
// idempotent, and a later tools/call of such a tool passes unprotected,
// while every other call (unannotated, destructive, never listed,
// forgotten) is protected.

// listServer is a tool server whose tools/list answers with the tools it
// is given (JSON, or an event stream with x-answer: sse) and whose
// tools/call runs count by tool.
type listServer struct {
	srv *httptest.Server
	// list is the result member of a tools/list answer.
	list string
	mu   sync.Mutex
	runs map[string]int
}

func newListServer(t *testing.T, list string) *listServer {
	s := &listServer{list: list, runs: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *listServer) ran(tool string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[tool]
}

func (s *listServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.ID == nil {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	var resp string
	switch msg.Method {
	case "tools/list":
		s.mu.Lock()
		s.runs["#list"]++
		s.mu.Unlock()
		resp = fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, msg.ID, s.list)
	case "tools/call":
		s.mu.Lock()
		s.runs[msg.Params.Name]++
		n := s.runs[msg.Params.Name]
		s.mu.Unlock()
		resp = fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s ran %d"}]}}`, msg.ID, msg.Params.Name, n)
	default:
		resp = fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{}}`, msg.ID)
	}
	if r.Header.Get("x-answer") == "sse" {
		var one bytes.Buffer // an event's data is one line here
		_ = json.Compact(&one, []byte(resp))
		resp = one.String()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n")
		fmt.Fprintf(w, "event: message\r\ndata: %s\r\n\r\n", resp)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, resp)
}

// hintedTools are the tools the tests list: one read-only, one
// idempotent, one with no annotations, one destructive, and one whose
// hints say false as the Go SDK writes them.
const hintedTools = `{"tools":[
 {"name":"lookup","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}},
 {"name":"set_flag","inputSchema":{"type":"object"},"annotations":{"idempotentHint":true,"destructiveHint":false}},
 {"name":"send_email","inputSchema":{"type":"object"}},
 {"name":"wipe","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":false,"destructiveHint":true}},
 {"name":"charge","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":false,"idempotentHint":false}}
]}`

const hintPolicies = `
policies:
  - name: mcp-tools
    match:
      methods: [POST]
      path: {exact: /mcp}
    key:
      from: [header, derived]
      derive: [/params/name, /params/arguments]
      required: true
    scope: {from: header, header: x-agent}
    fingerprint:
      json: true
      exclude: [/id, /params/_meta]
    answers: jsonrpc
    tools:
      protect: unless_hinted
default_policy:
  enabled: false
`

func listTools(id string) string {
	return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/list","params":{}}`
}

// startHints runs the harness in front of a listServer, with doc's
// policies, a store that counts its calls and, when now is set, that
// clock.
func startHints(t *testing.T, doc, list string, now func() time.Time) (*harness.Env, *listServer, *countingStore) {
	t.Helper()
	up := newListServer(t, list)
	cs := &countingStore{}
	return harness.Start(t, harness.Options{
		Policies:    policies(t, doc),
		UpstreamURL: up.srv.URL,
		Now:         now,
		WrapStore: func(st idem.Store) idem.Store {
			cs.Store = st
			return cs
		},
	}), up, cs
}

// callTwice sends the same call of tool twice (new ids, no key: the key
// is derived) and returns how often the tool ran, and the store calls
// the two cost.
func callTwice(t *testing.T, env *harness.Env, up *listServer, cs *countingStore, tool string, headers ...string) (runs int, storeCalls int64) {
	t.Helper()
	before, calls := up.ran(tool), cs.calls.Load()
	if len(headers) == 0 {
		headers = []string{"x-agent", "agent-1"}
	}
	for i, id := range []string{"11", `"retry-12"`} {
		r := env.Post("/mcp", "", call(id, tool, `{"x":1}`), headers...)
		if r.Status != 200 || !strings.Contains(r.Body, `"id":`+id+`,`) || !strings.Contains(r.Body, tool+" ran") {
			t.Fatalf("%s call %d: %d %s", tool, i+1, r.Status, r.Body)
		}
	}
	return up.ran(tool) - before, cs.calls.Load() - calls
}

// TestToolHintsDecideProtection: after a tools/list answer was seen, a
// call of a tool annotated read-only or idempotent passes unprotected
// (it runs each time it is sent, and costs no store call); a call of an
// unannotated tool, a destructive one, one whose hints say false, and
// one never listed is protected (the retry is replayed).
func TestToolHintsDecideProtection(t *testing.T) {
	for _, form := range []string{"json", "sse"} {
		t.Run(form, func(t *testing.T) {
			env, up, cs := startHints(t, hintPolicies, hintedTools, nil)
			r := env.Post("/mcp", "", listTools("1"), "x-agent", "agent-1", "x-answer", form)
			if r.Status != 200 || !strings.Contains(r.Body, `"name":"lookup"`) {
				t.Fatalf("tools/list: %d %s", r.Status, r.Body)
			}
			if form == "json" {
				var msg struct {
					Result json.RawMessage `json:"result"`
				}
				if err := json.Unmarshal([]byte(r.Body), &msg); err != nil || string(msg.Result) != hintedTools {
					t.Fatalf("the list reached the agent changed: %v %s", err, r.Body)
				}
			}
			for tool, protected := range map[string]bool{
				"lookup": false, "set_flag": false,
				"send_email": true, "wipe": true, "charge": true, "never_listed": true,
			} {
				runs, calls := callTwice(t, env, up, cs, tool)
				switch {
				case protected && (runs != 1 || calls == 0):
					t.Errorf("%s is not protected: ran %d times, %d store calls", tool, runs, calls)
				case !protected && (runs != 2 || calls != 0):
					t.Errorf("%s is protected though listed as harmless: ran %d times, %d store calls", tool, runs, calls)
				}
			}
			// The policy protects tool calls only: tools/list, initialize
			// and other methods pass, each time, with no store call.
			calls := cs.calls.Load()
			env.Post("/mcp", "", listTools("2"), "x-agent", "agent-1")
			env.Post("/mcp", "", listTools("3"), "x-agent", "agent-1")
			if n := up.ran("#list"); n != 3 || cs.calls.Load() != calls {
				t.Errorf("tools/list reached the server %d times, want 3; %d store calls", n, cs.calls.Load()-calls)
			}
		})
	}
}

// TestToolHintsUnseenIsProtected: before any tools/list was seen, and
// for a list seen from another upstream (:authority), a read-only tool
// is protected; so it is when the list said ttlMs 0.
func TestToolHintsUnseenIsProtected(t *testing.T) {
	env, up, cs := startHints(t, hintPolicies, hintedTools, nil)
	if runs, _ := callTwice(t, env, up, cs, "lookup"); runs != 1 {
		t.Fatalf("lookup ran %d times before any list was seen, want 1", runs)
	}
	env.Post("/mcp", "", listTools("1"), "x-agent", "agent-1", "Host", "other.example")
	if runs, _ := callTwice(t, env, up, cs, "lookup", "x-agent", "agent-2"); runs != 1 {
		t.Fatalf("lookup ran %d times after a list from another authority, want 1", runs)
	}
	// The same authority's list, seen by this server: the call passes.
	env.Post("/mcp", "", listTools("2"), "x-agent", "agent-3")
	if runs, _ := callTwice(t, env, up, cs, "lookup", "x-agent", "agent-4"); runs != 2 {
		t.Fatalf("lookup ran %d times after its list, want 2", runs)
	}

	env0, up0, cs0 := startHints(t, hintPolicies, strings.Replace(hintedTools, `{"tools":[`, `{"ttlMs":0,"tools":[`, 1), nil)
	env0.Post("/mcp", "", listTools("1"), "x-agent", "agent-1")
	if runs, _ := callTwice(t, env0, up0, cs0, "lookup"); runs != 1 {
		t.Fatalf("lookup ran %d times after a list with ttlMs 0, want 1", runs)
	}
}

// TestToolHintsExpire: annotations are kept for the list's ttlMs, else
// tools.hint_ttl; past it the tool is protected again.
func TestToolHintsExpire(t *testing.T) {
	var clock atomic.Int64
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return start.Add(time.Duration(clock.Load())) }
	doc := strings.Replace(hintPolicies, "protect: unless_hinted", "protect: unless_hinted\n      hint_ttl: 1m", 1)
	env, up, cs := startHints(t, doc, strings.Replace(hintedTools, `{"tools":[`, `{"ttlMs":30000,"tools":[`, 1), now)
	env.Post("/mcp", "", listTools("1"), "x-agent", "agent-1")
	clock.Store(int64(29 * time.Second))
	if runs, _ := callTwice(t, env, up, cs, "lookup", "x-agent", "a1"); runs != 2 {
		t.Fatalf("lookup ran %d times within the list's ttlMs, want 2", runs)
	}
	clock.Store(int64(31 * time.Second))
	if runs, _ := callTwice(t, env, up, cs, "lookup", "x-agent", "a2"); runs != 1 {
		t.Fatalf("lookup ran %d times past the list's ttlMs, want 1", runs)
	}

	// No ttlMs: tools.hint_ttl (1m).
	env, up, cs = startHints(t, doc, hintedTools, now)
	clock.Store(0)
	env.Post("/mcp", "", listTools("1"), "x-agent", "agent-1")
	clock.Store(int64(59 * time.Second))
	if runs, _ := callTwice(t, env, up, cs, "lookup", "x-agent", "b1"); runs != 2 {
		t.Fatalf("lookup ran %d times within hint_ttl, want 2", runs)
	}
	clock.Store(int64(61 * time.Second))
	if runs, _ := callTwice(t, env, up, cs, "lookup", "x-agent", "b2"); runs != 1 {
		t.Fatalf("lookup ran %d times past hint_ttl, want 1", runs)
	}
}

// TestToolHintsCacheIsBounded: a policy keeps at most
// tools.hint_cache_size tools' annotations; a list of more forgets the
// first listed, whose calls are protected again.
func TestToolHintsCacheIsBounded(t *testing.T) {
	doc := strings.Replace(hintPolicies, "protect: unless_hinted", "protect: unless_hinted\n      hint_cache_size: 2", 1)
	list := `{"tools":[{"name":"read_a","annotations":{"readOnlyHint":true}},{"name":"read_b","annotations":{"readOnlyHint":true}},{"name":"read_c","annotations":{"readOnlyHint":true}}]}`
	env, up, cs := startHints(t, doc, list, nil)
	env.Post("/mcp", "", listTools("1"), "x-agent", "agent-1")
	for tool, want := range map[string]int{"read_a": 1, "read_b": 2, "read_c": 2} {
		if runs, _ := callTwice(t, env, up, cs, tool); runs != want {
			t.Errorf("%s ran %d times, want %d", tool, runs, want)
		}
	}
}

// TestToolHintsLearnedUnderTrustedHeaders: under mcp_headers: trust a
// tools/list of MCP 2026-07-28, which its headers would let pass at the
// headers, is still read at its body, so that its answer teaches the
// annotations.
func TestToolHintsLearnedUnderTrustedHeaders(t *testing.T) {
	doc := strings.Replace(hintPolicies, "answers: jsonrpc", "answers: jsonrpc\n    mcp_headers: trust", 1)
	doc = strings.Replace(doc, "path: {exact: /mcp}", "path: {exact: /mcp}\n      json: [{pointer: /method, equals: tools/call}]", 1)
	env, up, cs := startHints(t, doc, hintedTools, nil)
	r := env.Post("/mcp", "", listTools("1"), "x-agent", "agent-1",
		"MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/list")
	if r.Status != 200 {
		t.Fatalf("tools/list: %d %s", r.Status, r.Body)
	}
	if runs, calls := callTwice(t, env, up, cs, "lookup"); runs != 2 || calls != 0 {
		t.Fatalf("lookup ran %d times with %d store calls after a list sent with trusted headers, want 2 and 0", runs, calls)
	}
}

// TestToolHintsAdvertised: with tools.advertise_idempotent, the tools/list
// answer the agent gets says idempotentHint: true of every tool the policy
// protects (send_email, wipe, charge), and of none it passes (lookup,
// read-only; set_flag, which says so itself already); its length is the
// rewritten one (Envoy's content-length is removed with the mutation); and
// a call of an advertised tool is indeed protected. An event-stream answer
// goes on unchanged.
func TestToolHintsAdvertised(t *testing.T) {
	doc := strings.Replace(hintPolicies, "      protect: unless_hinted\n", "      protect: unless_hinted\n      advertise_idempotent: true\n", 1)
	env, up, cs := startHints(t, doc, hintedTools, nil)
	r := env.Post("/mcp", "", listTools("1"), "x-agent", "agent-1")
	var msg struct {
		ID     int `json:"id"`
		Result struct {
			Tools []struct {
				Name        string         `json:"name"`
				Annotations map[string]any `json:"annotations"`
			} `json:"tools"`
		} `json:"result"`
	}
	if r.Status != 200 || json.Unmarshal([]byte(r.Body), &msg) != nil || msg.ID != 1 {
		t.Fatalf("tools/list: %d %s", r.Status, r.Body)
	}
	if cl := r.Header.Get("Content-Length"); cl != "" && cl != fmt.Sprint(len(r.Body)) {
		t.Fatalf("content-length %s for a %d-byte body", cl, len(r.Body))
	}
	want := map[string]bool{"send_email": true, "wipe": true, "charge": true, "set_flag": true}
	for _, tool := range msg.Result.Tools {
		got, _ := tool.Annotations["idempotentHint"].(bool)
		if got != want[tool.Name] {
			t.Errorf("%s: idempotentHint %v, want %v (%s)", tool.Name, got, want[tool.Name], r.Body)
		}
	}
	if len(msg.Result.Tools) != 5 {
		t.Fatalf("%d tools in %s", len(msg.Result.Tools), r.Body)
	}
	if runs, calls := callTwice(t, env, up, cs, "send_email"); runs != 1 || calls == 0 {
		t.Errorf("send_email, advertised idempotent: ran %d times, %d store calls; want 1 and the replay", runs, calls)
	}
	sse := env.Post("/mcp", "", listTools("2"), "x-agent", "agent-1", "x-answer", "sse")
	if sse.Status != 200 || strings.Contains(sse.Body, `"send_email","inputSchema":{"type":"object"},"annotations"`) ||
		!strings.Contains(sse.Body, `{"name":"send_email","inputSchema":{"type":"object"}}`) {
		t.Fatalf("the event stream was rewritten: %d %s", sse.Status, sse.Body)
	}
}

// TestAgentRetryingByTheHint plays an agent that reads idempotentHint at
// the specification's meaning ("calling the tool repeatedly with the same
// arguments will have no additional effect", schema.ts ToolAnnotations):
// it lists the tools and, for each one the server advertised idempotent
// in place of the upstream, sends the call again with the same arguments
// as a new JSON-RPC request (a new id and progress token, no key of its
// own), as an agent does after a lost answer. Each such tool runs once.
func TestAgentRetryingByTheHint(t *testing.T) {
	doc := strings.Replace(hintPolicies, "      protect: unless_hinted\n", "      protect: unless_hinted\n      advertise_idempotent: true\n", 1)
	env, up, _ := startHints(t, doc, hintedTools, nil)
	r := env.Post("/mcp", "", listTools("1"), "x-agent", "agent-1")
	var msg struct {
		Result struct {
			Tools []struct {
				Name        string `json:"name"`
				Annotations struct {
					ReadOnly   bool `json:"readOnlyHint"`
					Idempotent bool `json:"idempotentHint"`
				} `json:"annotations"`
			} `json:"tools"`
		} `json:"result"`
	}
	if r.Status != 200 || json.Unmarshal([]byte(r.Body), &msg) != nil {
		t.Fatalf("tools/list: %d %s", r.Status, r.Body)
	}
	var listed struct {
		Tools []struct {
			Name        string         `json:"name"`
			Annotations map[string]any `json:"annotations"`
		} `json:"tools"`
	}
	if err := json.Unmarshal([]byte(hintedTools), &listed); err != nil {
		t.Fatal(err)
	}
	upstreamHinted := map[string]bool{}
	for _, tool := range listed.Tools {
		upstreamHinted[tool.Name] = tool.Annotations["idempotentHint"] == true
	}
	retried := 0
	for _, tool := range msg.Result.Tools {
		if !tool.Annotations.Idempotent || tool.Annotations.ReadOnly || upstreamHinted[tool.Name] {
			continue // not hinted, or the upstream's own promise
		}
		retried++
		for i, id := range []string{"21", "22"} {
			if r := env.Post("/mcp", "", call(id, tool.Name, `{"to":"a@example.com"}`), "x-agent", "agent-1"); r.Status != 200 {
				t.Fatalf("%s attempt %d: %d %s", tool.Name, i+1, r.Status, r.Body)
			}
		}
		if n := up.ran(tool.Name); n != 1 {
			t.Errorf("%s, advertised idempotent, ran %d times for two calls with the same arguments", tool.Name, n)
		}
	}
	if retried != 3 {
		t.Fatalf("the agent retried %d advertised tools, want 3 (send_email, wipe, charge): %s", retried, r.Body)
	}
}

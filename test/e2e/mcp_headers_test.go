package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
)

// mcpHeaders are the headers MCP 2026-07-28 mirrors a call in
// (Streamable HTTP, "Standard Request Headers").
func mcpHeaders(version, method, name string) []string {
	hs := []string{"x-agent", "agent-1", "MCP-Protocol-Version", version, "Mcp-Method", method}
	if name != "" {
		hs = append(hs, "Mcp-Name", name)
	}
	return hs
}

func bodySent(res *envoysim.Result) bool {
	for _, ph := range res.Phases() {
		if ph == envoysim.PhaseRequestBody {
			return true
		}
	}
	return false
}

// TestMCPHeadersTrusted: under mcp_headers: trust, a 2026-07-28 request
// whose Mcp-Method or Mcp-Name no criterion takes is passed at its
// headers: Envoy never sends the server its body and no store command is
// made. A call the headers name as protected is still decided at its body
// and protected, and a request of an earlier revision (whose headers no
// server checks) is decided at its body as before.
func TestMCPHeadersTrusted(t *testing.T) {
	doc := strings.Replace(mcpPolicies, "    answers: jsonrpc\n", "    answers: jsonrpc\n    mcp_headers: trust\n", 1)
	env, up, cs := startMCP(t, doc)
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	for _, tc := range []struct {
		name     string
		body     string
		headers  []string
		bodySent bool
	}{
		{"tools/list", list, mcpHeaders("2026-07-28", "tools/list", ""), false},
		{"a tool no criterion takes", call("2", "read_inbox", `{}`), mcpHeaders("2026-07-28", "tools/call", "read_inbox"), false},
		{"an encoded name", call("3", "read_inbox", `{}`), mcpHeaders("2026-07-28", "tools/call", "=?base64?cmVhZF9pbmJveA==?="), false},
		{"an earlier revision", list, mcpHeaders("2025-11-25", "tools/list", ""), true},
		{"no Mcp-Name on a call", call("4", "read_inbox", `{}`), mcpHeaders("2026-07-28", "tools/call", ""), true},
	} {
		before := cs.calls.Load()
		n := len(env.Results())
		r := env.Post("/mcp", "", tc.body, tc.headers...)
		if r.Status != 200 {
			t.Fatalf("%s: %d %s", tc.name, r.Status, r.Body)
		}
		res := env.Results()[n]
		if bodySent(res) != tc.bodySent {
			t.Errorf("%s: body sent to the server %v, want %v (%s)", tc.name, bodySent(res), tc.bodySent, res)
		}
		if got := cs.calls.Load() - before; got != 0 {
			t.Errorf("%s: %d store commands for an unprotected request", tc.name, got)
		}
	}
	// A protected call, headers and all: decided at its body, run once.
	hs := mcpHeaders("2026-07-28", "tools/call", "send_email")
	first := env.Post("/mcp", "k-1", call("5", "send_email", `{"to":"a"}`), hs...)
	retry := env.Post("/mcp", "k-1", call("6", "send_email", `{"to":"a"}`), hs...)
	if first.Status != 200 || retry.Header.Get("Idempotent-Replayed") != "true" || up.count("tools/call/send_email") != 1 {
		t.Fatalf("protected call: %d %s, retry %d %v %s, runs %d", first.Status, first.Body, retry.Status, retry.Header,
			retry.Body, up.count("tools/call/send_email"))
	}
}

// TestMCPHeaderMismatchAnswered: a 2026-07-28 request whose headers do not
// match the body the product reads is answered as the revision has a
// server answer it, HTTP 400 with JSON-RPC -32020 to the call's id,
// before any effect; under the default mcp_headers: check a call the
// headers disguise as a read is still protected.
func TestMCPHeaderMismatchAnswered(t *testing.T) {
	env, up, _ := startMCP(t, mcpPolicies)
	for _, hs := range [][]string{
		mcpHeaders("2026-07-28", "tools/list", ""),
		mcpHeaders("2026-07-28", "tools/call", "read_inbox"),
		mcpHeaders("2026-07-28", "tools/call", "=?base64?cmVhZF9pbmJveA==?="),
	} {
		r := env.Post("/mcp", "k-2", call("7", "send_email", `{"to":"a"}`), hs...)
		id, code, data := rpcErrorAt(t, r, http.StatusBadRequest)
		if id != "7" || code != jsonrpc.CodeHeaderMismatch || data.Type != problem.TypeBase+problem.HeaderMismatch.Slug {
			t.Fatalf("headers %v: id %s code %d data %+v, want -32020 to id 7", hs, id, code, data)
		}
	}
	if n := up.count("tools/call/send_email"); n != 0 {
		t.Fatalf("the tool ran %d times behind lying headers", n)
	}
	// Headers that match, or an earlier revision's (not validated), go on.
	ok := env.Post("/mcp", "k-2", call("8", "send_email", `{"to":"a"}`), mcpHeaders("2026-07-28", "tools/call", "send_email")...)
	old := env.Post("/mcp", "k-3", call("9", "send_email", `{"to":"b"}`), mcpHeaders("2025-11-25", "tools/list", "")...)
	if ok.Status != 200 || old.Status != 200 || up.count("tools/call/send_email") != 2 {
		t.Fatalf("matching %d %s, earlier revision %d %s, runs %d", ok.Status, ok.Body, old.Status, old.Body, up.count("tools/call/send_email"))
	}
}

// BenchmarkMCPReadAtHeaders is what deciding a read at its MCP headers
// saves per request: a tools/list POST of the 2026-07-28 revision through
// the proxy, under mcp_headers: check (decided at its body) and trust
// (passed at its headers). It reports the ext_proc messages Envoy sends
// the server per request, besides the time.
//
//	go test ./test/e2e -run '^$' -bench MCPReadAtHeaders -benchtime 2000x -count 3
func BenchmarkMCPReadAtHeaders(b *testing.B) {
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`
	for _, mode := range []string{"check", "trust"} {
		b.Run(mode, func(b *testing.B) {
			doc := strings.Replace(mcpPolicies, "    answers: jsonrpc\n", "    answers: jsonrpc\n    mcp_headers: "+mode+"\n", 1)
			env, _, _ := startMCP(b, doc)
			hs := mcpHeaders("2026-07-28", "tools/list", "")
			n := len(env.Results())
			b.ResetTimer()
			for range b.N {
				if r := env.Post("/mcp", "", list, hs...); r.Status != 200 {
					b.Fatalf("%d %s", r.Status, r.Body)
				}
			}
			b.StopTimer()
			msgs := 0
			for _, res := range env.Results()[n:] {
				msgs += len(res.Messages)
			}
			b.ReportMetric(float64(msgs)/float64(b.N), "msgs/op")
		})
	}
}

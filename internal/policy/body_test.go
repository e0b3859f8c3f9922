package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
)

func mcpTools() *Policy {
	p := Default()
	p.Name = "mcp-tools"
	p.Match = Match{Methods: []string{"POST"}, PathExact: "/mcp", JSON: []JSONCriterion{
		{Pointer: mustPointer("/method"), OneOf: []string{"tools/call"}},
		{Pointer: mustPointer("/params/name"), OneOf: []string{"send_email", "open_ticket"}},
	}}
	p.Answers = AnswersJSONRPC
	return p
}

// TestMatchBody: the body criteria of a JSON-RPC policy. Only a tools/call
// request of a listed tool, with an id, matches; reads, notifications,
// batches, responses and bodies that are not JSON never do.
func TestMatchBody(t *testing.T) {
	p := mcpTools()
	for _, tc := range []struct {
		body string
		miss BodyMiss
		id   string
	}{
		{`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"send_email"}}`, BodyMatched, `7`},
		{`{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{"name":"open_ticket","arguments":{}}}`, BodyMatched, `"c-1"`},
		{`{"jsonrpc":"2.0","id":"c-\u0031","method":"tools\/call","params":{"name":"open_ticket"}}`, BodyMatched, `"c-\u0031"`},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_weather"}}`, BodyCriteria, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, BodyCriteria, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, BodyCriteria, ""},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, BodyNotification, ""},
		{`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send_email"}}`, BodyNotification, ""},
		{`{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"send_email"}}`, BodyNotification, ""},
		{`{"jsonrpc":"2.0","id":1,"result":{}}`, BodyNotification, ""},
		// A batch holding a protected call, or one that cannot be read, is
		// refused as unreadable (ErrProtectedBatch); a batch of others passes.
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send_email"}}]`, BodyUnreadable, ""},
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"open_ticket"}}]`, BodyUnreadable, ""},
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"id":2,"method":"tools/call","method":"x","params":{"name":"send_email"}}]`, BodyUnreadable, ""},
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_weather"}}]`, BodyBatch, ""},
		{`[{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send_email"}}]`, BodyBatch, ""},
		{`[]`, BodyBatch, ""},
		// A batch nested in a batch is no JSON-RPC message: not looked into.
		{`[[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send_email"}}]]`, BodyBatch, ""},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send_email"}`, BodyUnreadable, ""},
		{``, BodyNotJSON, ""},
		{" \r\n", BodyNotJSON, ""},
		{`"tools/call"`, BodyNotJSON, ""},
		{`{"id":1,"method":"tools/call","method":"x","params":{"name":"send_email"}}`, BodyUnreadable, ""},
		{`{"id":1,"method":"tools/call","params":{"name":"send_email","arguments":{},}}`, BodyUnreadable, ""},
		{"{\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"send_email\",\"x\":\"\xff\"}}", BodyUnreadable, ""},
		{`{"id":1,"method":"tools/call","params":{"name":"send_email","x":` + strings.Repeat("[", 201) + strings.Repeat("]", 201) + `}}`, BodyUnreadable, ""},
		{`not json`, BodyUnreadable, ""},
		{`{"id":1,"method":"tools/call","params":{"name":["send_email"]}}`, BodyCriteria, ""},
	} {
		id, miss := p.MatchBody([]byte(tc.body))
		if miss != tc.miss || string(id) != tc.id {
			t.Errorf("%s: %v id %s, want %v id %s", tc.body, miss, id, tc.miss, tc.id)
		}
	}
	plain := Default()
	if _, miss := plain.MatchBody([]byte("not json")); miss != BodyMatched {
		t.Fatalf("a policy without body criteria takes %v", miss)
	}
	// Without answers: jsonrpc, a notification may match body criteria.
	rest := Default()
	rest.Match.JSON = []JSONCriterion{{Pointer: mustPointer("/kind"), OneOf: []string{"charge"}}}
	if _, miss := rest.MatchBody([]byte(`{"kind":"charge"}`)); miss != BodyMatched {
		t.Fatalf("REST body criteria: %v", miss)
	}
}

// TestFindInBody: what counts as a body that cannot be read, and why.
func TestFindInBody(t *testing.T) {
	for _, tc := range []struct {
		body, why string
	}{
		{`{"a":1,"a":2}`, "duplicate member"},
		{"{\"a\":\"\xc3\"}", "not UTF-8"},
		{`{"a":` + strings.Repeat("[", 250) + strings.Repeat("]", 250) + `}`, "nested deeper than 200"},
		{`{"a":1,}`, "not JSON"},
		{`{"a":1} {}`, "not JSON"},
	} {
		_, err := FindInBody([]byte(tc.body))
		if !errors.Is(err, ErrBodyUnreadable) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("FindInBody(%q) = %v, want unreadable: %s", tc.body, err, tc.why)
		}
	}
	for _, body := range []string{``, "\n", `[1]`, `"x"`, `{"a":"\u00e9"}`} {
		if _, err := FindInBody([]byte(body)); errors.Is(err, ErrBodyUnreadable) {
			t.Errorf("FindInBody(%q) = %v: it is read", body, err)
		}
	}
}

// TestBodyCandidates: a request deferred to its body may end with the
// first policy or any later one whose header criteria hold, up to the
// first that takes every body.
func TestBodyCandidates(t *testing.T) {
	mcp := mcpTools()
	other := Default()
	other.Name, other.Match = "orders", Match{PathPrefix: "/orders"}
	rpc2 := mcpTools()
	rpc2.Name = "mcp-all"
	rpc2.Match.JSON = rpc2.Match.JSON[:1]
	def := Default()
	last := Default()
	last.Name = "never"
	s := &Set{Policies: []*Policy{mcp, other, rpc2, def, last}}
	r := Request{Method: "POST", Path: "/mcp"}
	if got := s.Match(r); got != mcp {
		t.Fatalf("first match %v", got.Name)
	}
	got := s.BodyCandidates(r, mcp)
	if len(got) != 3 || got[0] != mcp || got[1] != rpc2 || got[2] != def {
		names := []string{}
		for _, p := range got {
			names = append(names, p.Name)
		}
		t.Fatalf("candidates %v", names)
	}
	if !mcp.NeedsBody() || def.NeedsBody() {
		t.Fatal("NeedsBody")
	}
	bodyKey := Default()
	bodyKey.KeySources = []KeySource{KeyFromBody}
	bodyKey.KeyPointer, _ = jsonpointer.Parse("/k")
	if !bodyKey.NeedsBody() || bodyKey.bodyCriteria() {
		t.Fatal("a body key needs the body but takes every body")
	}
}

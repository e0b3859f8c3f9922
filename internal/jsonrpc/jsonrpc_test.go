package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		body         string
		id, method   string
		batch, notif bool
		err          error
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`, `1`, "tools/call", false, false, nil},
		{`{"jsonrpc":"2.0","id":"a-\u0031","method":"tools/call"}`, `"a-\u0031"`, "tools/call", false, false, nil},
		{`{"jsonrpc":"2.0","id":-1.5e2,"method":"x"}`, `-1.5e2`, "x", false, false, nil},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, ``, "notifications/initialized", false, true, nil},
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/call"}]`, ``, "", true, false, nil},
		{`{"jsonrpc":"2.0","id":null,"method":"x"}`, ``, "", false, false, ErrInvalidID},
		{`{"jsonrpc":"2.0","id":{},"method":"x"}`, ``, "", false, false, ErrInvalidID},
		{`{"id":1,"id":2}`, ``, "", false, false, jsonpointer.ErrDuplicateMember},
		{`{"id":1`, ``, "", false, false, jsonpointer.ErrNotJSON},
		{`"x"`, ``, "", false, false, jsonpointer.ErrNotObject},
	} {
		r, err := ParseRequest([]byte(tc.body))
		if !errors.Is(err, tc.err) {
			t.Errorf("ParseRequest(%s) error %v, want %v", tc.body, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		if string(r.ID) != tc.id || r.Method != tc.method || r.Batch != tc.batch || r.Notification() != tc.notif {
			t.Errorf("ParseRequest(%s) = %+v (notification %v)", tc.body, r, r.Notification())
		}
	}
}

func TestRewriteID(t *testing.T) {
	const stored = "{ \"result\" : {\"id\":5,\"x\":\"\u00e9\"},\n \"id\" :  5 , \"jsonrpc\":\"2.0\"}"
	got, err := RewriteID([]byte(stored), json.RawMessage(`"retry-7"`))
	if want := "{ \"result\" : {\"id\":5,\"x\":\"\u00e9\"},\n \"id\" :  \"retry-7\" , \"jsonrpc\":\"2.0\"}"; err != nil || string(got) != want {
		t.Fatalf("RewriteID = %s, %v; want %s", got, err, want)
	}
	for _, tc := range []struct {
		stored, id string
		err        error
	}{
		{`{"result":{}}`, `1`, ErrNotResponse},
		{`[{"id":1}]`, `1`, ErrNotResponse},
		{`{"id":1,"id":1}`, `1`, ErrNotResponse},
		{`{"id":1}`, `null`, ErrInvalidID},
		{`{"id":1}`, `1 2`, ErrInvalidID},
		{`{"id":1}`, `1}`, ErrInvalidID},
		{`{"id":1}`, ``, ErrInvalidID},
	} {
		if _, err := RewriteID([]byte(tc.stored), json.RawMessage(tc.id)); !errors.Is(err, tc.err) {
			t.Errorf("RewriteID(%s, %s) = %v; want %v", tc.stored, tc.id, err, tc.err)
		}
	}
}

// FuzzRewriteID: a rewritten response reads back with the new id and is
// otherwise the same document.
func FuzzRewriteID(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"id":2}}`), `"r"`)
	f.Add([]byte(`{"id":"x"}`), `7`)
	f.Fuzz(func(t *testing.T, stored []byte, id string) {
		got, err := RewriteID(stored, json.RawMessage(id))
		if err != nil {
			return
		}
		vs, err := jsonpointer.Find(got, idPtr)
		if err != nil || string(vs[0].Raw) != id {
			t.Fatalf("RewriteID(%s, %s) = %s: id reads back as %q, %v", stored, id, got, vs[0].Raw, err)
		}
		var a, b map[string]any
		if json.Unmarshal(stored, &a) != nil || json.Unmarshal(got, &b) != nil {
			t.Fatalf("RewriteID(%s, %s) = %s is not JSON", stored, id, got)
		}
		delete(a, "id")
		delete(b, "id")
		x, _ := json.Marshal(a)
		y, _ := json.Marshal(b)
		if !bytes.Equal(x, y) {
			t.Fatalf("RewriteID(%s, %s) = %s changed other members", stored, id, got)
		}
	})
}

func TestErrorResponse(t *testing.T) {
	for _, tc := range []struct {
		kind problem.Kind
		code int
	}{
		{problem.KeyReused, -33061}, {problem.InProgress, -33062}, {problem.OutcomeUnknown, -33063},
		{problem.StoreUnavailable, -33064}, {problem.CapacityExceeded, -33065}, {problem.KeyMissing, -33070},
		{problem.KeyInvalid, -33071}, {problem.BodyTooLarge, -33072}, {problem.BodyIncomplete, -33073},
		{problem.PrincipalMissing, -33074}, {problem.BodyUnreadable, -32700},
	} {
		p := problem.New(tc.kind, "detail of "+tc.kind.Slug)
		p.RetryAfter = 2 * time.Second
		b, err := ErrorResponse(json.RawMessage(`"c-9"`), p)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Error   struct {
				Code    int       `json:"code"`
				Message string    `json:"message"`
				Data    ErrorData `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		want := ErrorData{Type: problem.TypeBase + tc.kind.Slug, Status: tc.kind.Status, Detail: p.Detail, RetryAfter: 2}
		if got.JSONRPC != "2.0" || string(got.ID) != `"c-9"` || got.Error.Code != tc.code || got.Error.Message != tc.kind.Title || got.Error.Data != want {
			t.Errorf("%s: %s", tc.kind.Slug, b)
		}
	}
	b, err := ErrorResponse(nil, problem.New(problem.KeyReused, ""))
	if err != nil || !bytes.Contains(b, []byte(`"id":null`)) || bytes.Contains(b, []byte("detail")) {
		t.Errorf("no id: %s, %v", b, err)
	}
	if _, err := ErrorResponse(json.RawMessage(`{}`), problem.New(problem.KeyReused, "")); !errors.Is(err, ErrInvalidID) {
		t.Errorf("object id: %v", err)
	}
	if _, err := ErrorResponse(json.RawMessage(`1`), problem.New(problem.Kind{Slug: "other"}, "")); err == nil {
		t.Error("a problem without a code got an answer")
	}
}

func TestFinalResponse(t *testing.T) {
	const progress = `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}`
	for _, tc := range []struct {
		name, stream, id, want string
	}{
		{"notification then response", "event: message\ndata: " + progress + "\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}\n\n", `3`, `{"jsonrpc":"2.0","id":3,"result":{}}`},
		{"CRLF, comments, no space, ids", ": ping\r\nid: 1\r\ndata:{\"id\":\"a\",\"error\":{\"code\":1}}\r\n\r\n", `"\u0061"`, `{"id":"a","error":{"code":1}}`},
		{"leading byte order mark", "\uFEFFdata: {\"id\":1,\"result\":1}\n\n", `1`, `{"id":1,"result":1}`},
		{"CR line ends", "data: {\"id\":1,\r\ndata: \"result\":2}\r\r", `1`, "{\"id\":1,\n\"result\":2}"},
		{"other id skipped", "data: {\"id\":1,\"result\":1}\n\ndata: {\"id\":2,\"result\":2}\n\n", `1`, `{"id":1,"result":1}`},
		{"any id: the last", "data: {\"id\":1,\"result\":1}\n\ndata: {\"id\":2,\"result\":2}\n\n", ``, `{"id":2,"result":2}`},
		{"a server request is not a response", "data: {\"id\":9,\"method\":\"sampling/createMessage\",\"result\":1}\n\ndata: {\"id\":9,\"result\":2}\n\n", `9`, `{"id":9,"result":2}`},
		{"other event type skipped", "event: other\ndata: {\"id\":1,\"result\":1}\n\ndata: {\"id\":1,\"result\":2}\n\n", `1`, `{"id":1,"result":2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var id json.RawMessage
			if tc.id != "" {
				id = json.RawMessage(tc.id)
			}
			got, err := FinalResponse([]byte(tc.stream), id)
			if err != nil || string(got) != tc.want {
				t.Fatalf("FinalResponse = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	for _, stream := range []string{
		"data: " + progress + "\n\n",            // no response at all
		"data: {\"id\":1,\"result\":1}",         // not ended by an empty line: not dispatched
		"data: {\"id\":1,\"result\":1}\n",       // still not ended
		"data: {\"id\":2,\"result\":1}\n\n",     // another request's answer
		"data: {\"id\":\"1\",\"result\":1}\n\n", // a string is not the number 1
		"data: not json\n\n",
	} {
		if got, err := FinalResponse([]byte(stream), json.RawMessage(`1`)); !errors.Is(err, ErrNotResponse) {
			t.Errorf("FinalResponse(%q) = %q, %v; want ErrNotResponse", stream, got, err)
		}
	}
}

// FuzzFinalResponse: whatever the stream, the answer is a JSON-RPC
// response with the id asked for, or ErrNotResponse.
func FuzzFinalResponse(f *testing.F) {
	f.Add([]byte("event: message\ndata: {\"id\":1,\"result\":{}}\n\n"), `1`)
	f.Add([]byte(": c\r\ndata: {\"id\":\"x\",\r\ndata: \"error\":{}}\r\r"), `"x"`)
	f.Fuzz(func(t *testing.T, stream []byte, id string) {
		got, err := FinalResponse(stream, json.RawMessage(id))
		if err != nil {
			if !errors.Is(err, ErrNotResponse) {
				t.Fatalf("FinalResponse: %v", err)
			}
			return
		}
		v, ok := isResponse(got)
		if !ok || !sameID(v, json.RawMessage(id)) {
			t.Fatalf("FinalResponse(%q, %s) = %q, not a response with that id", stream, id, got)
		}
	})
}

// TestHelpersLeaveTheRequestAlone: the id ParseRequest returns aliases
// the request body, and using it must not write into that body (it did:
// validID appended to the id's slice, overwriting the byte after it).
func TestHelpersLeaveTheRequestAlone(t *testing.T) {
	const body = `{"jsonrpc":"2.0","id":"r-2","method":"tools/call"}`
	req := []byte(body)
	r, err := ParseRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RewriteID([]byte(`{"id":1,"result":{}}`), r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := ErrorResponse(r.ID, problem.New(problem.InProgress, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := FinalResponse([]byte("data: {\"id\":\"r-2\",\"result\":1}\n\n"), r.ID); err != nil {
		t.Fatal(err)
	}
	if string(req) != body {
		t.Fatalf("the request body became %s", req)
	}
}

// TestCodesAvoidPeersOwn: an answer must reach the agent as the error it
// is, and the product's codes must not claim a range the specification
// keeps. MCP 2026-07-28 reserves -32768 to -32000 (basic/index.mdx, "Error
// Codes": -32020 to -32099 for the specification, -32000 to -32019
// legacy), so every code is outside it, but JSON-RPC 2.0's own -32700
// used for what it means. The codes the official SDKs use outside it are
// avoided too: the Go SDK's -31001 (go-sdk v1.8.0 mcp/shared.go,
// codeUnsupportedMethod), the Python SDK's -32800 (REQUEST_CANCELLED,
// src/mcp/server/streamable_http.py), 0, and its positive 408 and 32600
// (v1.29.0 src/mcp/shared/session.py, src/mcp/client/streamable_http.py);
// the TypeScript SDK uses none outside the reserved range
// (packages/core-internal/src/types/enums.ts).
func TestCodesAvoidPeersOwn(t *testing.T) {
	peers := map[int]bool{-31001: true, -32800: true, 0: true, 408: true, 32600: true}
	seen := map[int]string{}
	for slug, code := range codes {
		if code == CodeParseError && slug == problem.BodyUnreadable.Slug ||
			code == CodeHeaderMismatch && slug == problem.HeaderMismatch.Slug {
			continue // JSON-RPC 2.0's and MCP's own codes, for what they mean there
		}
		if code >= -32768 && code <= -32000 {
			t.Errorf("%s has code %d, inside the range JSON-RPC and MCP reserve", slug, code)
		}
		if peers[code] {
			t.Errorf("%s has code %d, which an MCP SDK uses for its own errors", slug, code)
		}
		if other, dup := seen[code]; dup {
			t.Errorf("%s and %s share code %d", slug, other, code)
		}
		seen[code] = slug
	}
}

// TestReplyTo: one reading of a response gives what each caller asks of
// it, and nothing for a message that is no response to the call.
func TestReplyTo(t *testing.T) {
	id := json.RawMessage(`"c-1"`)
	for _, tc := range []struct {
		msg   string
		ok    bool
		reply Reply
	}{
		{`{"jsonrpc":"2.0","id":"c-1","error":{"code":-32020,"message":"HeaderMismatch"}}`, true, Reply{Error: true, Code: -32020, HasCode: true}},
		{`{"jsonrpc":"2.0","id":"c-1","error":{"code":1.5,"message":"x"}}`, true, Reply{Error: true}},
		{`{"jsonrpc":"2.0","id":"c-1","error":{"message":"x"}}`, true, Reply{Error: true}},
		{`{"jsonrpc":"2.0","id":"c-2","error":{"code":-32020,"message":"x"}}`, false, Reply{}},
		{`{"jsonrpc":"2.0","id":"c-1","method":"x","error":{"code":-32020}}`, false, Reply{}},
		{`{"jsonrpc":"2.0","id":"c-1","result":{"resultType":"input_required","inputRequests":{}}}`, true, Reply{InputRequired: true}},
		{`{"jsonrpc":"2.0","id":"c-1","result":{"resultType":"complete","content":[]}}`, true, Reply{}},
		{`{"jsonrpc":"2.0","id":"c-1","result":{"content":[]}}`, true, Reply{}},
		{`{"jsonrpc":"2.0","id":"c-1"}`, false, Reply{}},
		{`{"jsonrpc":"2.0","id":"c-2","result":{"resultType":"input_required"}}`, false, Reply{}},
		{`not json`, false, Reply{}},
	} {
		r, ok := ReplyTo([]byte(tc.msg), id)
		if ok != tc.ok || r != tc.reply {
			t.Errorf("ReplyTo(%s) = %+v, %v; want %+v, %v", tc.msg, r, ok, tc.reply, tc.ok)
		}
	}
}

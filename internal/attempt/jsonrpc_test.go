package attempt

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
)

// TestJSONRPCReplay: a stored JSON answer keeps every byte but its id; a
// stored stream becomes its final response as application/json; what is
// no JSON-RPC response is refused, never replayed to a wrong id.
func TestJSONRPCReplay(t *testing.T) {
	hs := func(ct string) []idem.Header {
		return []idem.Header{{Name: "x-a", Value: "1"}, {Name: "content-type", Value: ct}, {Name: "x-b", Value: "2"}}
	}
	stored := `{"jsonrpc":"2.0", "id" : 1,"result":{"id":1,"text":"sent"}}`
	got, err := jsonrpcReplay(idem.Response{Status: 200, Headers: hs("application/json"), Body: []byte(stored)}, []byte(`"r-2"`))
	if err != nil || string(got.Body) != `{"jsonrpc":"2.0", "id" : "r-2","result":{"id":1,"text":"sent"}}` || len(got.Headers) != 3 {
		t.Fatalf("JSON: %s %v %v", got.Body, got.Headers, err)
	}
	stream := "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n" +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"
	got, err = jsonrpcReplay(idem.Response{Status: 200, Headers: hs("text/event-stream; charset=utf-8"), Body: []byte(stream)}, []byte(`7`))
	if err != nil || string(got.Body) != `{"jsonrpc":"2.0","id":7,"result":{}}` {
		t.Fatalf("SSE: %s %v", got.Body, err)
	}
	if len(got.Headers) != 3 || got.Headers[2] != (idem.Header{Name: "content-type", Value: "application/json"}) || got.Headers[0].Name != "x-a" {
		t.Fatalf("SSE headers %v", got.Headers)
	}
	for name, rs := range map[string]idem.Response{
		"plain":          {Status: 200, Headers: hs("text/plain"), Body: []byte("sent")},
		"no id":          {Status: 200, Headers: hs("application/json"), Body: []byte(`{"jsonrpc":"2.0","result":{}}`)},
		"stream, no end": {Status: 200, Headers: hs("text/event-stream"), Body: []byte("data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")},
		"body omitted":   {Status: 200, Headers: hs("application/json"), BodyOmitted: true},
	} {
		if _, err := jsonrpcReplay(rs, []byte(`1`)); err == nil {
			t.Errorf("%s: replayed", name)
		} else if name != "body omitted" && !errors.Is(err, jsonrpc.ErrNotResponse) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestTransportRefused: the statuses the MCP transport refuses a call
// with, carrying no JSON-RPC response to the call, are refusals; a 5xx, a
// 413, a 2xx, a JSON-RPC response to the call at any status, and a body
// that was not kept are not.
func TestTransportRefused(t *testing.T) {
	plain := []idem.Header{{Name: "content-type", Value: "text/plain"}}
	js := []idem.Header{{Name: "content-type", Value: "application/json"}}
	sse := []idem.Header{{Name: "content-type", Value: "text/event-stream"}}
	for _, tc := range []struct {
		name string
		rs   idem.Response
		want bool
	}{
		{"404 text", idem.Response{Status: 404, Headers: plain, Body: []byte("session not found\n")}, true},
		{"400 empty", idem.Response{Status: 400}, true},
		{"401", idem.Response{Status: 401, Headers: js, Body: []byte(`{"error":"invalid_token"}`)}, true},
		{"403 error without id", idem.Response{Status: 403, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"x"}}`)}, true},
		{"405", idem.Response{Status: 405, Headers: plain}, true},
		{"406 error to another id", idem.Response{Status: 406, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"x"}}`)}, true},
		{"415", idem.Response{Status: 415, Headers: plain}, true},
		{"404 stream without the response", idem.Response{Status: 404, Headers: sse, Body: []byte("data: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n\n")}, true},

		// MCP 2026-07-28's own refusals, a JSON-RPC error to the call.
		{"404 method not found to the call", idem.Response{Status: 404, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"x"}}`)}, true},
		{"400 header mismatch to the call", idem.Response{Status: 400, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"error":{"code":-32020,"message":"x"}}`)}, true},
		{"400 unsupported version to the call", idem.Response{Status: 400, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"error":{"code":-32022,"message":"x"}}`)}, true},
		{"400 header mismatch in a stream", idem.Response{Status: 400, Headers: sse, Body: []byte("data: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32020,\"message\":\"x\"}}\n\n")}, true},

		{"400 invalid params to the call (a handler may send it)", idem.Response{Status: 400, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"x"}}`)}, false},
		{"400 missing capability to the call", idem.Response{Status: 400, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"error":{"code":-32021,"message":"x"}}`)}, false},
		{"404 another error to the call", idem.Response{Status: 404, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"x"}}`)}, false},
		{"400 result to the call", idem.Response{Status: 400, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"result":{}}`)}, false},
		{"404 body not kept", idem.Response{Status: 404, Headers: plain, BodyOmitted: true}, false},
		{"413", idem.Response{Status: 413, Headers: plain}, false},
		{"500", idem.Response{Status: 500, Headers: plain}, false},
		{"502", idem.Response{Status: 502, Headers: plain}, false},
		{"200 not JSON-RPC", idem.Response{Status: 200, Headers: plain, Body: []byte("ok")}, false},
		{"202", idem.Response{Status: 202}, false},
	} {
		if got := transportRefused(tc.rs, []byte(`7`)); got != tc.want {
			t.Errorf("%s: transportRefused = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestInterim(t *testing.T) {
	js := []idem.Header{{Name: "content-type", Value: "application/json"}}
	sse := []idem.Header{{Name: "content-type", Value: "text/event-stream"}}
	interim := `{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","inputRequests":{"a":{"method":"elicitation/create"}},"requestState":"s1"}}`
	for _, tc := range []struct {
		name string
		rs   idem.Response
		want bool
	}{
		{"input required", idem.Response{Status: 200, Headers: js, Body: []byte(interim)}, true},
		{"input required in a stream", idem.Response{Status: 200, Headers: sse, Body: []byte("data: " + interim + "\n\n")}, true},
		{"complete", idem.Response{Status: 200, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"result":{"resultType":"complete","content":[]}}`)}, false},
		{"no resultType", idem.Response{Status: 200, Headers: js, Body: []byte(`{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`)}, false},
		{"to another id", idem.Response{Status: 200, Headers: js, Body: []byte(strings.Replace(interim, `"id":7`, `"id":8`, 1))}, false},
		{"not 2xx", idem.Response{Status: 500, Headers: js, Body: []byte(interim)}, false},
		{"body not kept", idem.Response{Status: 200, Headers: js, BodyOmitted: true}, false},
	} {
		if got := isInterim(tc.rs, []byte(`7`)); got != tc.want {
			t.Errorf("%s: isInterim = %v, want %v", tc.name, got, tc.want)
		}
	}
}

package attempt

import (
	"errors"
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
	got, err := JSONRPCReplay(idem.Response{Status: 200, Headers: hs("application/json"), Body: []byte(stored)}, []byte(`"r-2"`))
	if err != nil || string(got.Body) != `{"jsonrpc":"2.0", "id" : "r-2","result":{"id":1,"text":"sent"}}` || len(got.Headers) != 3 {
		t.Fatalf("JSON: %s %v %v", got.Body, got.Headers, err)
	}
	stream := "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n" +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"
	got, err = JSONRPCReplay(idem.Response{Status: 200, Headers: hs("text/event-stream; charset=utf-8"), Body: []byte(stream)}, []byte(`7`))
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
		if _, err := JSONRPCReplay(rs, []byte(`1`)); err == nil {
			t.Errorf("%s: replayed", name)
		} else if name != "body omitted" && !errors.Is(err, jsonrpc.ErrNotResponse) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

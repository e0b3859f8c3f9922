package jsonrpc

import (
	"encoding/json"
	"strings"
	"testing"
)

// BenchmarkReplay is the work of a JSON-RPC replay: read the retry's id,
// take the response out of a stored event stream, and rewrite its id.
func BenchmarkReplay(b *testing.B) {
	req := []byte(`{"jsonrpc":"2.0","id":"retry-2","method":"tools/call","params":{"name":"create_order","arguments":{"client_order_id":"o-42"}}}`)
	result := `{"jsonrpc":"2.0","id":"call-1","result":{"content":[{"type":"text","text":"` + strings.Repeat("x", 4000) + `"}]}}`
	stream := []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":0.5}}\n\nevent: message\ndata: " + result + "\n\n")
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for range b.N {
		r, err := ParseRequest(req)
		if err != nil {
			b.Fatal(err)
		}
		resp, err := FinalResponse(stream, json.RawMessage(`"call-1"`))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := RewriteID(resp, r.ID); err != nil {
			b.Fatal(err)
		}
	}
}

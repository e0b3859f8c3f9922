package attempt

import (
	"errors"
	"mime"
	"slices"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
)

// errBodyOmitted: the stored response kept no body (larger than
// max_stored_body, or cut short), so there is no JSON-RPC response to
// replay.
var errBodyOmitted = errors.New("the stored response kept no body")

// JSONRPCReplay is the stored response rs as a replay to the JSON-RPC
// request whose id is id (answers: jsonrpc): its top-level id rewritten to
// id, every other byte as stored (jsonrpc.RewriteID). A stored
// text/event-stream answer (MCP Streamable HTTP may answer a call that
// way) is replayed as its final JSON-RPC response alone
// (jsonrpc.FinalResponse), as application/json: progress notifications
// and server requests sent before it are not replayed. The MCP Go SDK
// client reads an application/json answer to a call as the one response
// (go-sdk v1.8.0 mcp/streamable.go, streamableClientConn.Write: the
// "application/json" case, handleJSON). An error means there is no
// JSON-RPC response to replay (no body kept, or not JSON-RPC): the caller
// answers outcome-unknown rather than a response to the wrong id.
func JSONRPCReplay(rs idem.Response, id []byte) (idem.Response, error) {
	if rs.BodyOmitted {
		return rs, errBodyOmitted
	}
	body, headers := rs.Body, rs.Headers
	ct := ""
	for _, h := range rs.Headers {
		if h.Name == "content-type" {
			ct = h.Value
			break
		}
	}
	if mt, _, _ := mime.ParseMediaType(ct); mt == "text/event-stream" {
		final, err := jsonrpc.FinalResponse(body, nil)
		if err != nil {
			return rs, err
		}
		body = final
		headers = make([]idem.Header, 0, len(rs.Headers))
		for _, h := range rs.Headers {
			if h.Name != "content-type" {
				headers = append(headers, h)
			}
		}
		headers = append(headers, idem.Header{Name: "content-type", Value: "application/json"})
	}
	out, err := jsonrpc.RewriteID(body, id)
	if err != nil {
		return rs, err
	}
	rs.Body, rs.Headers = out, slices.Clip(headers)
	return rs, nil
}

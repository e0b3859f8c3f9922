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

// jsonrpcReplay is the stored response rs as a replay to the JSON-RPC
// request whose id is id (answers: jsonrpc): its top-level id rewritten to
// id, every other byte as stored (jsonrpc.RewriteID). A stored
// text/event-stream answer (MCP Streamable HTTP may answer a call that
// way) is replayed as its final JSON-RPC response alone
// (jsonrpc.FinalResponse), as application/json: progress notifications
// and server requests sent before it are not replayed. The MCP Go SDK
// client reads an application/json answer to a call as the one response
// (go-sdk v1.8.0 mcp/streamable.go, streamableClientConn.Write: the
// "application/json" case, handleJSON). An error means there is no
// JSON-RPC response to replay (no body kept, or not JSON-RPC), and the
// response returned with it is not one: the caller answers outcome-unknown
// rather than a response to the wrong id.
func jsonrpcReplay(rs idem.Response, id []byte) (idem.Response, error) {
	if rs.BodyOmitted {
		return rs, errBodyOmitted
	}
	var err error
	if eventStream(rs) {
		rs.Body, err = jsonrpc.FinalResponse(rs.Body, nil)
		rs.Headers = append(slices.DeleteFunc(slices.Clone(rs.Headers), func(h idem.Header) bool { return h.Name == "content-type" }),
			idem.Header{Name: "content-type", Value: "application/json"})
	}
	if err == nil {
		rs.Body, err = jsonrpc.RewriteID(rs.Body, id)
	}
	rs.Headers = slices.Clip(rs.Headers)
	return rs, err
}

// eventStream reports whether rs's content-type is text/event-stream.
func eventStream(rs idem.Response) bool {
	for _, h := range rs.Headers {
		if h.Name == "content-type" {
			mt, _, _ := mime.ParseMediaType(h.Value)
			return mt == "text/event-stream"
		}
	}
	return false
}

// transportRefused reports whether rs, the upstream's own answer to the
// JSON-RPC call whose id is id (answers: jsonrpc), is the MCP Streamable
// HTTP transport refusing the call before dispatching it, rather than the
// call's outcome: a status the transport sends for a request it does not
// take, and a body that holds no JSON-RPC response to the call. The tool
// then never ran, and the record is released (settleStored), so that the
// agent's retry (in a new session, with a fresh token) runs it; storing it
// would answer every retry with -33063 for the whole retention.
//
// The statuses, as the MCP specification gives them for the transport and
// its authorization (MCP 2025-06-18, Basic, Transports and Authorization;
// 2026-07-28, Basic, Transports, Streamable HTTP, the newest revision):
//   - 404: a terminated or unknown session ("MUST respond to requests
//     containing that session ID with HTTP 404 Not Found", 2025-06-18
//     Session Management; the Go SDK writes "session not found" as
//     text/plain, go-sdk v1.8.0 mcp/streamable.go); in 2026-07-28 also a
//     method the server does not implement, with a JSON-RPC -32601 error;
//   - 400: a request without the session id a server requires, an invalid
//     or unsupported MCP-Protocol-Version, input the server cannot accept;
//     in 2026-07-28 also a header that does not match the body (-32020);
//   - 401 and 403: an invalid or expired token, insufficient scope
//     (Authorization, "Error Handling"; servers "MUST validate access tokens
//     before processing the request"), and in 2025-11-25 and later an
//     invalid Origin (403);
//   - 405: a method the endpoint does not serve;
//   - 406 and 415: not named by the specification; RFC 9110 §15.5.7 and
//     §15.5.16 make them a refusal of the request's media types (Accept,
//     Content-Type), which SDKs check before they read the message (go-sdk
//     v1.8.0 answers a wrong Content-Type 415 in mcp/streamable.go).
//
// The 2026-07-28 revision answers its own refusals with a JSON-RPC error
// to the call (Streamable HTTP, "Protocol Version Header" and "Server
// Validation"): 400 with HeaderMismatch (-32020, the headers that mirror
// the body do not match it) or UnsupportedProtocolVersion (-32022), and
// 404 with -32601 for a method the server does not implement. Each is the
// transport's, sent before any handler runs, so each is a refusal too;
// the corrected retry (a client SHOULD retry after HeaderMismatch,
// "Client Behavior") must reach the tool.
//
// What the specification leaves unclear, and is therefore stored: a 5xx
// (a tool server's 500, or a gateway's 502 or 504, may come after the tool
// ran); a 413 (no revision names it); a 2xx that is no JSON-RPC response
// to the call (the server took the request); and any other status whose
// body is a JSON-RPC response to this very call: it answers the call, and
// is replayed to the retry's id. That includes -32021
// (MissingRequiredClientCapability) and -32602 (invalid params), which a
// tool's own handler may return as well: go-sdk v1.8.0 gives a handler's
// -32602 the same 400 (mcp/streamable.go, extractErrorStatus), so neither
// code nor status tells a refusal from an answer. A body omitted from the
// record (larger than max_stored_body, or cut short) cannot be read, so
// its response is stored too.
func transportRefused(rs idem.Response, id []byte) bool {
	if !slices.Contains([]int{400, 401, 403, 404, 405, 406, 415}, rs.Status) || rs.BodyOmitted || id == nil {
		return false
	}
	r, ok := replyTo(rs, id)
	return !ok || r.HasCode && slices.Contains(refusalCodes[rs.Status], r.Code)
}

// The MCP 2026-07-28 refusals of the transport (transportRefused), by the
// status they come with (basic/index.mdx, "Error Codes"; Streamable HTTP,
// "Protocol Version Header"): HeaderMismatch and UnsupportedProtocolVersion
// with 400, MethodNotFound with 404.
var refusalCodes = map[int][]int{400: {jsonrpc.CodeHeaderMismatch, -32022}, 404: {-32601}}

// isInterim reports whether rs, the upstream's answer to the JSON-RPC call
// whose id is id, is an MCP multi round-trip request's interim result
// (jsonrpc.Reply's InputRequired): the server asks the client for input, and the
// client will retry the call with it under a new id
// (modelcontextprotocol, docs/specification/2026-07-28/basic/patterns/
// mrtr.mdx). It is not the call's outcome: the record is released
// (settleStored), so that the continuation, the same operation by its
// fingerprint (policy.ContinuationMembers), runs the final step and
// stores its result, which a retry of the call from its first round then
// gets. A stored text/event-stream answer is judged by its final response.
func isInterim(rs idem.Response, id []byte) bool {
	if rs.Status < 200 || rs.Status > 299 || rs.BodyOmitted || id == nil {
		return false
	}
	r, ok := replyTo(rs, id)
	return ok && r.InputRequired
}

// replyTo is rs's response to the call whose id is id: of a
// text/event-stream answer, its final JSON-RPC response
// (jsonrpc.FinalResponse); false when rs holds none.
func replyTo(rs idem.Response, id []byte) (jsonrpc.Reply, bool) {
	body := rs.Body
	if eventStream(rs) {
		body, _ = jsonrpc.FinalResponse(body, id) // nil, no response, when it holds none
	}
	return jsonrpc.ReplyTo(body, id)
}

package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// A JSON-RPC error answer (answers: jsonrpc) goes with HTTP 200
// (jsonrpc.HTTPStatus; MCP 2026-07-28's HeaderMismatch, whose status the
// specification names with its code, with 400). An agent must see the
// JSON-RPC error, not a transport failure:
//   - MCP 2025-06-18, Transports, "Sending Messages to the Server": to a
//     POSTed JSON-RPC request the server answers with Content-Type
//     application/json (one JSON object) or text/event-stream; an HTTP
//     error status is for input it cannot accept at all. A JSON-RPC error
//     response is an answer to the request, so it goes as 200
//     application/json, as the SDK's own server sends JSON-RPC errors;
//   - the official Go SDK client (go-sdk v1.8.0 mcp/streamable.go,
//     streamableClientConn.checkResponse) turns 500, 502, 503, 504 and 429
//     into a bare "rejected" error without reading the body
//     (isTransientHTTPStatus), and other non-2xx statuses into an error
//     that wraps the body's JSON-RPC error only when MCPGODEBUG does not
//     say noprotocolerrorbody=1; at 200 it delivers the response to the
//     call (handleJSON), with its code and data intact.
//
// The HTTP problem's own status stays in the error's data.status, and
// Retry-After is still sent (and in data.retryAfter).

// jsonrpcProblem answers with the JSON-RPC error response standing for
// prob, to the request's own id (id), at jsonrpc.HTTPStatus. When no id could be
// read from the body (none arrived yet, or none in the bytes that did:
// refuseUnread) the id is null, as JSON-RPC 2.0 section 5 asks, and the
// HTTP status is the problem's own: such a message cannot be answered as
// the request it may be (MCP 2025-06-18, Transports, "Sending Messages to
// the Server": input the server cannot accept gets an HTTP error status,
// and its body may be a JSON-RPC error response without an id). A client
// then sees the call fail rather than a response to no call, which the Go
// SDK client would take for a broken connection (go-sdk v1.8.0
// mcp/streamable.go handleJSON) and the TypeScript one could match to no
// request; a 503 it even retries without closing the session
// (isTransientHTTPStatus).
func jsonrpcProblem(prob *problem.Problem, id []byte) *extprocv3.ProcessingResponse {
	status := jsonrpc.HTTPStatus(prob.Kind)
	body, err := jsonrpc.ErrorResponse(id, prob)
	if err != nil {
		// Every problem kind has a code and the id was checked when read,
		// so this does not happen; never answer a wrong id, though.
		id = nil
		body, err = jsonrpc.ErrorResponse(nil, prob)
		if err != nil {
			return problemResponse(prob)
		}
	}
	if id == nil {
		status = prob.Status
	}
	return problemAnswer(prob, status, "application/json", body)
}

// bodyDecision is what the protocol side keeps of a request deferred to
// its body (attempt.Verdict.AtBody): whether its answers are JSON-RPC, to which
// id, and what its answer teaches of the tools.
type bodyDecision struct {
	// jsonrpc: answers in the upstream's place are JSON-RPC responses to
	// id: the one the matching policy read, or for a body refused before
	// that, the one its bytes at hand carry (jsonrpc.ScanID). nil, answered
	// as null (JSON-RPC 2.0 §5), when none could be read
	// (jsonrpcProblem).
	jsonrpc bool
	id      []byte
	// tools is set for a tools/list passed where a policy learns the
	// tools' annotations from its answer (tools.go); nil otherwise.
	tools *toolsLearning
}

// learning is the tools' annotations the request's answer is read for;
// nil for none, or for a request not deferred to its body (d nil).
func (d *bodyDecision) learning() *toolsLearning {
	if d == nil {
		return nil
	}
	return d.tools
}

// answersJSONRPC reports whether the request's answers are JSON-RPC; d is
// nil for a request not deferred to its body.
func (d *bodyDecision) answersJSONRPC() bool { return d != nil && d.jsonrpc }

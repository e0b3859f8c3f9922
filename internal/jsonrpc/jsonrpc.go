// Package jsonrpc holds the JSON-RPC 2.0 helpers the idempotency answers
// of MCP policies need: it tells a request's id, a
// notification (no id) and a batch (an array) apart, rewrites the id of a
// stored response to the id of the retry it is replayed to, builds the
// JSON-RPC error responses that stand for the HTTP problems, and takes the
// final JSON-RPC response out of a stored text/event-stream body (MCP's
// Streamable HTTP transport). It is protocol-free; policies with answers:
// jsonrpc use it (attempt.jsonrpcReplay, extproc's JSON-RPC answers,
// docs/mcp.md).
//
// JSON-RPC 2.0 is https://www.jsonrpc.org/specification; MCP's use of it
// is the "Base Protocol" of the MCP specification (2025-06-18), whose
// requests carry a string or integer id that MUST NOT be null.
package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

var (
	// ErrInvalidID: a request's id is neither a string nor a number (MCP
	// forbids null; an object or array is no id at all in JSON-RPC 2.0).
	ErrInvalidID = errors.New("JSON-RPC id is neither a string nor a number")
	// ErrNotResponse: a stored body holds no JSON-RPC response object.
	ErrNotResponse = errors.New("no JSON-RPC response")
)

var (
	idPtr     = mustPointer("/id")
	methodPtr = mustPointer("/method")
)

func mustPointer(s string) jsonpointer.Pointer {
	p, err := jsonpointer.Parse(s)
	if err != nil {
		panic(err) // only for the constant pointers above
	}
	return p
}

// RewriteID returns the stored response with the value of its top-level
// "id" member replaced by id (the retry's own id, as the policy read
// it), every other byte unchanged, so that a replay answers the retry and
// not the first attempt.
func RewriteID(response []byte, id json.RawMessage) ([]byte, error) {
	if !validID(id) {
		return nil, ErrInvalidID
	}
	vs, err := jsonpointer.Find(response, idPtr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotResponse, err)
	}
	old := vs[0]
	if !old.Found() {
		return nil, fmt.Errorf("%w: it has no id", ErrNotResponse)
	}
	out := make([]byte, 0, len(response)-len(old.Raw)+len(id))
	out = append(out, response[:old.Offset]...)
	out = append(out, id...)
	return append(out, response[old.Offset+len(old.Raw):]...), nil
}

// validID reports whether id is exactly one JSON string or number.
func validID(id json.RawMessage) bool {
	vs, err := jsonpointer.Find(wrapID(id), idPtr)
	return err == nil && (vs[0].Kind == jsonpointer.KindString || vs[0].Kind == jsonpointer.KindNumber) &&
		len(vs[0].Raw) == len(id)
}

// The JSON-RPC error codes of the idempotency answers, outside the range
// JSON-RPC 2.0 reserves (-32768 to -32000): MCP 2026-07-28 reserves
// -32020 to -32099 for codes the specification defines, keeps -32000 to
// -32019 for legacy use ("new implementations SHOULD NOT use codes from
// this sub-range") and says new codes "SHOULD be allocated outside the
// JSON-RPC reserved range" (modelcontextprotocol, docs/specification/
// 2026-07-28/basic/index.mdx, "Error Codes"). They are clear of every code
// the official Go, TypeScript and Python SDKs use (TestCodesAvoidPeersOwn)
// and keep the last two digits earlier versions answered with
// (-32061 to -32074, docs/mcp.md "JSON-RPC answers").
const (
	CodeKeyReused        = -33061 // problem.KeyReused: same key, different request
	CodeInProgress       = -33062 // problem.InProgress: the first attempt still runs
	CodeOutcomeUnknown   = -33063 // problem.OutcomeUnknown
	CodeStoreUnavailable = -33064 // problem.StoreUnavailable
	CodeCapacityExceeded = -33065 // problem.CapacityExceeded
	CodeHomeOutOfReach   = -33066 // problem.HomeOutOfReach
	CodeHomesDisagree    = -33067 // problem.HomesDisagree
	CodeKeyMissing       = -33070 // problem.KeyMissing
	CodeKeyInvalid       = -33071 // problem.KeyInvalid
	CodeBodyTooLarge     = -33072 // problem.BodyTooLarge
	CodeBodyIncomplete   = -33073 // problem.BodyIncomplete
	CodePrincipalMissing = -33074 // problem.PrincipalMissing
	// CodeParseError is JSON-RPC 2.0's own "Parse error" (section 5.1:
	// invalid JSON was received by the server), for problem.BodyUnreadable:
	// a body the server cannot read as JSON, which a client's JSON-RPC
	// library already knows as such.
	CodeParseError = -32700
	// CodeHeaderMismatch is MCP 2026-07-28's HeaderMismatch, for
	// problem.HeaderMismatch: the code a compliant server answers a
	// request whose headers do not match its body with, "400 Bad Request
	// HTTP status and JSON-RPC error code -32020"
	// (modelcontextprotocol, docs/specification/2026-07-28/basic/
	// transports/streamable-http.mdx, "Server Behavior for Custom
	// Headers"; basic/index.mdx, "Error Codes").
	CodeHeaderMismatch = -32020
)

var codes = map[string]int{
	problem.KeyReused.Slug:        CodeKeyReused,
	problem.InProgress.Slug:       CodeInProgress,
	problem.OutcomeUnknown.Slug:   CodeOutcomeUnknown,
	problem.StoreUnavailable.Slug: CodeStoreUnavailable,
	problem.CapacityExceeded.Slug: CodeCapacityExceeded,
	problem.HomeOutOfReach.Slug:   CodeHomeOutOfReach,
	problem.HomesDisagree.Slug:    CodeHomesDisagree,
	problem.KeyMissing.Slug:       CodeKeyMissing,
	problem.KeyInvalid.Slug:       CodeKeyInvalid,
	problem.BodyTooLarge.Slug:     CodeBodyTooLarge,
	problem.BodyIncomplete.Slug:   CodeBodyIncomplete,
	problem.PrincipalMissing.Slug: CodePrincipalMissing,
	problem.BodyUnreadable.Slug:   CodeParseError,
	problem.HeaderMismatch.Slug:   CodeHeaderMismatch,
}

// HTTPStatus is the HTTP status a JSON-RPC error answer standing for k
// goes with: 200, the answer to the call (extproc's jsonrpcProblem says
// why), except where the specification names the status with the code,
// as MCP 2026-07-28 does for HeaderMismatch (400).
func HTTPStatus(k problem.Kind) int {
	if k.Slug == problem.HeaderMismatch.Slug {
		return k.Status
	}
	return 200
}

// Code returns the JSON-RPC error code that stands for problem kind k.
func Code(k problem.Kind) (int, bool) {
	c, ok := codes[k.Slug]
	return c, ok
}

// ErrorData is the "data" member of an idempotency error response: the
// HTTP problem it stands for (RFC 9457 members), so that an agent can
// tell the cases apart by type URI as an HTTP client would.
type ErrorData struct {
	Type   string `json:"type"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// RetryAfter is the Retry-After of the HTTP answer, in whole seconds.
	RetryAfter int `json:"retryAfter,omitempty"`
}

// ErrorResponse builds the JSON-RPC error response that stands for p,
// answering the request whose id is id (nil, when the id could not be
// read, gives null as JSON-RPC 2.0 section 5 asks). Its message is the
// problem's title.
func ErrorResponse(id json.RawMessage, p *problem.Problem) ([]byte, error) {
	code, ok := Code(p.Kind)
	if !ok {
		return nil, fmt.Errorf("jsonrpc: no error code for problem %q", p.Slug)
	}
	if id == nil {
		id = json.RawMessage("null")
	} else if !validID(id) {
		return nil, ErrInvalidID
	}
	type rpcError struct {
		Code    int       `json:"code"`
		Message string    `json:"message"`
		Data    ErrorData `json:"data"`
	}
	return json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   rpcError        `json:"error"`
	}{"2.0", id, rpcError{code, p.Title, ErrorData{
		Type: p.Type(), Status: p.Status, Detail: p.Detail, RetryAfter: int(p.RetryAfter.Seconds()),
	}}})
}

// Reply is what a JSON-RPC response says to the call it answers (ReplyTo).
type Reply struct {
	// Error: an error response; Code, its code when it is an integer
	// (HasCode).
	Error   bool
	Code    int
	HasCode bool
	// InputRequired: a result that asks the client for input before the
	// call can complete: MCP 2026-07-28's multi round-trip requests, a
	// result with "resultType": "input_required" (modelcontextprotocol,
	// docs/specification/2026-07-28/basic/patterns/mrtr.mdx; a result
	// without resultType is complete).
	InputRequired bool
}

// ReplyTo reads msg, in one pass, as the response to the request whose id
// is id: false when msg is no JSON-RPC response (isResponse) or answers
// another request.
func ReplyTo(msg []byte, id json.RawMessage) (Reply, bool) {
	vs, err := jsonpointer.Find(msg, idPtr, methodPtr, resultPtr, errorPtr, errorCodePtr, resultTypePtr)
	if err != nil || !response(vs) || !sameID(vs[0], id) {
		return Reply{}, false
	}
	r := Reply{Error: vs[3].Found()}
	if vs[4].Kind == jsonpointer.KindNumber {
		code, err := strconv.Atoi(string(vs[4].Raw))
		r.Code, r.HasCode = code, err == nil
	}
	if vs[5].Kind == jsonpointer.KindString {
		t, err := vs[5].Text()
		r.InputRequired = err == nil && t == "input_required"
	}
	return r, true
}

// isResponse reports whether msg is a JSON-RPC response: an object with
// an id and a result or an error, and no method (JSON-RPC 2.0 section 5;
// a request or notification carries a method).
func isResponse(msg []byte) (jsonpointer.Value, bool) {
	vs, err := jsonpointer.Find(msg, idPtr, methodPtr, resultPtr, errorPtr)
	if err != nil || !response(vs) {
		return jsonpointer.Value{}, false
	}
	return vs[0], true
}

// response reports whether vs, the values at idPtr, methodPtr, resultPtr
// and errorPtr, are a response's (isResponse).
func response(vs []jsonpointer.Value) bool {
	return vs[0].Found() && !vs[1].Found() && (vs[2].Found() || vs[3].Found())
}

var (
	resultPtr     = mustPointer("/result")
	errorPtr      = mustPointer("/error")
	errorCodePtr  = mustPointer("/error/code")
	resultTypePtr = mustPointer("/result/resultType")
)

// sameID compares two ids as values: strings by their decoded text,
// numbers by their literal (JSON-RPC 2.0 leaves number equality to the
// implementations; the SDKs echo the literal they received).
func sameID(a jsonpointer.Value, b json.RawMessage) bool {
	vs, err := jsonpointer.Find(wrapID(b), idPtr)
	if err != nil || vs[0].Kind != a.Kind {
		return false
	}
	if a.Kind == jsonpointer.KindString {
		x, _ := a.Text()
		y, _ := vs[0].Text()
		return x == y
	}
	return bytes.Equal(a.Raw, vs[0].Raw)
}

// wrapID returns {"id":<id>} in a new slice: id often aliases the body it
// was read from, which must not be written to.
func wrapID(id json.RawMessage) []byte {
	b := make([]byte, 0, len(id)+7)
	b = append(b, `{"id":`...)
	b = append(b, id...)
	return append(b, '}')
}

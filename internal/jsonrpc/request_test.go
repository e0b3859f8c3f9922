package jsonrpc

import (
	"encoding/json"
	"errors"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
)

// The tests' reading of a whole JSON-RPC request, by the pointer finder:
// the reference ScanID, the SDK's requests and the benchmarks are held to.
// The server itself reads a request's id where a policy reads it
// (policy.Policy.MatchBodyWhy).

// Request is what protection needs to know of a JSON-RPC request body.
type Request struct {
	// Batch is set for a top-level array (a JSON-RPC batch, which MCP
	// 2025-06-18 no longer allows): never protected.
	Batch bool
	// ID is the id exactly as sent (`"a-1"`, `7`), nil for a
	// notification, which gets no response and is never protected. It
	// aliases the body ParseRequest read.
	ID json.RawMessage
	// Method is the decoded "method" member, "" when absent.
	Method string
}

// Notification reports a request without an id.
func (r Request) Notification() bool { return !r.Batch && r.ID == nil }

// ParseRequest reads a request body in one pass. A batch is reported, not
// refused; the jsonpointer errors (ErrNotJSON, ErrDuplicateMember,
// ErrNotObject) and ErrInvalidID are returned as they are.
func ParseRequest(body []byte) (Request, error) {
	vs, err := jsonpointer.Find(body, idPtr, methodPtr)
	if errors.Is(err, jsonpointer.ErrTopLevelArray) {
		return Request{Batch: true}, nil
	}
	if err != nil {
		return Request{}, err
	}
	var r Request
	if id := vs[0]; id.Found() {
		if id.Kind != jsonpointer.KindString && id.Kind != jsonpointer.KindNumber {
			return Request{}, ErrInvalidID
		}
		r.ID = json.RawMessage(id.Raw)
	}
	if m, err := vs[1].Text(); err == nil {
		r.Method = m
	}
	return r, nil
}

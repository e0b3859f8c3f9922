package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
)

// KeySource names where a policy reads a request's key (key.from).
type KeySource uint8

const (
	// KeyFromHeader reads the key from the policy's key header (the
	// default, key.header).
	KeyFromHeader KeySource = iota
	// KeyFromBody reads it from a string member of a JSON body, by RFC
	// 6901 pointer (key.pointer): Square's idempotency_key, say.
	KeyFromBody
	// KeyFromDerived makes it: a hash of chosen members of a JSON body
	// (key.derive), for clients that send no key at all; an identical
	// retry within the retention is the same operation.
	KeyFromDerived
	// KeyFromMCPParam reads it from the tool parameter KeyParam of a
	// tools/call, whose value an MCP 2026-07-28 client mirrors in an
	// Mcp-Param header when the tool marks the parameter with
	// x-mcp-header (Streamable HTTP, "Custom Headers from Tool
	// Parameters"). The key is the body's value; the header, when the
	// upstream's tools/list says which it is, must agree with it
	// (MCPParamMismatch).
	KeyFromMCPParam
)

func (s KeySource) String() string { return idem.EnumName(s, "header", "body", "derived", "mcp_param") }

// DerivedNamespaceSuffix is appended to a policy's record namespace for
// derived keys, so a derived key never names the record of a key a client
// sent (in a header or the body), whatever that key's text: policy names
// cannot contain '#'.
const DerivedNamespaceSuffix = "#derived"

// MCPSessionHeader is MCP's session header (MCP 2025-06-18, Transports,
// "Session Management"). It never takes part in a key's scope or a
// fingerprint (an agent that reconnects gets a new session and must still
// be recognised), and a JSON-RPC policy never stores it.
const MCPSessionHeader = "mcp-session-id"

// ContinuationMembers are the members an MCP multi round-trip request adds
// when the client retries the original call with the input the server
// asked for: "the client retries the original request with a new JSON-RPC
// id, adding params.inputResponses and echoing params.requestState"
// (modelcontextprotocol, docs/specification/2026-07-28/basic/patterns/
// mrtr.mdx). The continuation is the same operation as the call it
// continues, so a JSON-RPC policy's JSON fingerprint leaves them out
// (Policy.OmitContinuation).
var ContinuationMembers = []jsonpointer.Pointer{mustPointer("/params/inputResponses"), mustPointer("/params/requestState")}

// OmitContinuation adds ContinuationMembers to the fingerprint's excluded
// members of a JSON-RPC policy with a JSON fingerprint that names no
// included members (those that do leave them out already), once.
func (p *Policy) OmitContinuation() {
	if p.Answers != AnswersJSONRPC || !p.FingerprintJSON || len(p.FingerprintInclude) > 0 {
		return
	}
	for _, m := range ContinuationMembers {
		if !slices.ContainsFunc(p.FingerprintExclude, func(e jsonpointer.Pointer) bool { return e.String() == m.String() }) {
			p.FingerprintExclude = append(p.FingerprintExclude, m)
		}
	}
}

// Answers says in which protocol the server answers in the upstream's
// place (answers).
type Answers uint8

const (
	// AnswersHTTP: RFC 9457 problems and stored HTTP responses (default).
	AnswersHTTP Answers = iota
	// AnswersJSONRPC: JSON-RPC 2.0 error responses to the request's own
	// id, and replays rewritten to that id (MCP, docs/mcp.md).
	AnswersJSONRPC
)

func (a Answers) String() string { return idem.EnumName(a, "http", "jsonrpc") }

// JSONCriterion is one body criterion of a match (match.json): the string
// member at Pointer must equal one of OneOf (equals is a list of one).
type JSONCriterion struct {
	Pointer jsonpointer.Pointer
	OneOf   []string
}

// BodyKeyRules are the body parts of the key group: key.from, key.pointer,
// key.derive.
type BodyKeyRules struct {
	// KeySources are tried in order; the first that yields a key wins.
	// Empty means the header alone.
	KeySources []KeySource
	// KeyPointer locates the key for KeyFromBody.
	KeyPointer jsonpointer.Pointer
	// KeyDerive are the members hashed into a KeyFromDerived key.
	KeyDerive []jsonpointer.Pointer
	// KeyParam is the tool parameter a KeyFromMCPParam key is read
	// from: its pointer in a tools/call body, under /params/arguments
	// (deeper for a nested parameter). Which Mcp-Param header mirrors it
	// is the tool's to say, by an x-mcp-header mark in its input schema
	// (MCPParamMismatch).
	KeyParam jsonpointer.Pointer
}

// KeyParamPath is KeyParam's path of property names under the call's
// arguments, as a tool's input schema nests them.
func (r *BodyKeyRules) KeyParamPath() []string {
	if r.KeyParam.Len() <= len(ArgumentsPointer.Tokens()) {
		return nil
	}
	return r.KeyParam.Tokens()[len(ArgumentsPointer.Tokens()):]
}

// ArgumentsPointer is where a tools/call carries the tool's arguments
// (schema.ts CallToolRequestParams.arguments); key.param lies under it.
var ArgumentsPointer = mustPointer("/params/arguments")

// KeyFrom reports whether src is one of the policy's key sources.
func (p *Policy) KeyFrom(src KeySource) bool {
	if len(p.KeySources) == 0 {
		return src == KeyFromHeader
	}
	for _, s := range p.KeySources {
		if s == src {
			return true
		}
	}
	return false
}

// NeedsBody reports whether the policy decides a request only once its
// body is read: it matches on the body (match.json), answers in JSON-RPC
// (which needs the request's id, and passes notifications and batches),
// or reads its key from the body.
func (p *Policy) NeedsBody() bool {
	return len(p.Match.JSON) > 0 || p.Answers == AnswersJSONRPC || p.KeyFrom(KeyFromBody) || p.KeyFrom(KeyFromDerived)
}

// BodyMiss says why a policy's body criteria did not hold for a body.
type BodyMiss uint8

const (
	// BodyMatched: every body criterion holds (or the policy has none).
	BodyMatched BodyMiss = iota
	// BodyNotJSON: the body is read and is not an object (a string,
	// number, boolean or null), or there is no body at all (none, or
	// white space only): no JSON reader takes it for a call.
	BodyNotJSON
	// BodyBatch: a top-level array, a JSON-RPC batch (MCP 2025-06-18
	// no longer allows them) none of whose messages meets the criteria:
	// never protected. A batch holding one that does is BodyUnreadable
	// (ErrProtectedBatch).
	BodyBatch
	// BodyNotification: a JSON-RPC message without an id (a
	// notification), or without a method (a response the client posts
	// back), on a policy that answers in JSON-RPC: nothing to replay.
	BodyNotification
	// BodyCriteria: a match.json criterion does not hold.
	BodyCriteria
	// BodyHinted: the criteria hold, but the call's tool is one the
	// upstream listed as read-only or idempotent, and the policy protects
	// only the others (tools.protect: unless_hinted; Policy.ToolHinted).
	BodyHinted
	// BodyUnreadable: the body cannot be read (ErrBodyUnreadable), so
	// whether the criteria hold cannot be told: another reader may well
	// take it for a call that meets them. It is not a miss like the
	// others: see attempt.admitUnreadable.
	BodyUnreadable
	// BodySubscription: an MCP subscriptions/listen request, on a policy
	// that answers in JSON-RPC, whatever its criteria say: never protected
	// (SubscriptionsListen).
	BodySubscription
)

// SubscriptionsListen is the MCP 2026-07-28 method that opens a
// long-lived notification stream, answered by an event stream that "stays
// open and delivers the change notifications the client opted in to"
// until the client or the server closes it (modelcontextprotocol,
// docs/specification/2026-07-28/basic/transports/streamable-http.mdx,
// "Receiving Messages"; basic/patterns/subscriptions.mdx, "Cancellation").
// It changes nothing upstream and has no one answer to store or replay,
// and the route that carries it leaves its answer unprocessed
// (envoy/envoy-mcp.yaml), so a policy that took it would hold a record
// no response ever settles.
const SubscriptionsListen = "subscriptions/listen"

func (m BodyMiss) String() string {
	return [...]string{"matched", "not-json", "batch", "notification", "criteria", "hinted", "unreadable", "subscription"}[m]
}

// ErrBodyUnreadable: a request body that is there but is not JSON this
// server reads whole: not JSON by RFC 8259 (a syntax error anywhere,
// a trailing comma, nesting deeper than the reader's limit), an object
// with two members of one name, or text that is not UTF-8 (RFC 8259
// section 8.1; MCP 2025-06-18, Transports: JSON-RPC messages MUST be
// UTF-8). Other readers differ on each: Go's encoding/json nests up to
// 10000 levels, takes the last of two names and replaces bytes that are
// not UTF-8; the MCP Go SDK nests up to 1000 (go-sdk v1.8.0
// internal/json); lenient readers take trailing commas. Such a body may
// be a call the policy protects, read otherwise upstream.
var ErrBodyUnreadable = errors.New("the body cannot be read as JSON")

// FindInBody reads the values at ptrs in a request body, as body criteria
// and keys from the body do: jsonpointer.Find, with ErrBodyUnreadable
// (wrapping the reason) for a body that is not blank and that Find
// refuses as not JSON or for a duplicate member name, or that is not
// UTF-8. A blank body (none, or white space only) fails with Find's
// jsonpointer.ErrNotJSON: there is no body, which no reader takes for a
// call. An array or a scalar fails as with Find.
func FindInBody(body []byte, ptrs ...jsonpointer.Pointer) ([]jsonpointer.Value, error) {
	blank := len(bytes.TrimLeft(body, " \t\r\n")) == 0
	if !blank && !utf8.Valid(body) {
		return nil, fmt.Errorf("%w: it is not UTF-8", ErrBodyUnreadable)
	}
	vs, err := jsonpointer.Find(body, ptrs...)
	switch {
	case err == nil, blank, errors.Is(err, jsonpointer.ErrTopLevelArray), errors.Is(err, jsonpointer.ErrNotObject):
		return vs, err
	}
	return nil, fmt.Errorf("%w: %w", ErrBodyUnreadable, err)
}

// bodyString is the string at ptr in a request body; ok is false when
// the body has none there, or is one FindInBody refuses.
func bodyString(body []byte, ptr jsonpointer.Pointer) (s string, ok bool) {
	vs, err := FindInBody(body, ptr)
	if err != nil || vs[0].Kind != jsonpointer.KindString {
		return "", false
	}
	s, err = vs[0].Text()
	return s, err == nil
}

var (
	idPointer     = mustPointer("/id")
	methodPointer = mustPointer("/method")
)

func mustPointer(s string) jsonpointer.Pointer {
	p, err := jsonpointer.Parse(s)
	if err != nil {
		panic(err) // constant pointers only
	}
	return p
}

// MatchBody judges the body criteria of p (match.json, and for answers:
// jsonrpc a JSON-RPC request with an id) on a complete request body, in
// one pass over it. For a JSON-RPC policy it returns the request's id as
// sent (a copy), which every answer in the upstream's place carries.
func (p *Policy) MatchBody(body []byte) (id []byte, miss BodyMiss) {
	id, miss, _ = p.MatchBodyWhy(body)
	return id, miss
}

// MatchBodyWhy is MatchBody, and for BodyUnreadable the reason: the
// ErrBodyUnreadable of FindInBody, or ErrProtectedBatch.
func (p *Policy) MatchBodyWhy(body []byte) (id []byte, miss BodyMiss, unreadable error) {
	if !p.bodyCriteria() {
		return nil, BodyMatched, nil
	}
	ptrs := make([]jsonpointer.Pointer, 0, 2+len(p.Match.JSON))
	ptrs = append(ptrs, idPointer, methodPointer)
	for _, c := range p.Match.JSON {
		ptrs = append(ptrs, c.Pointer)
	}
	vs, err := FindInBody(body, ptrs...)
	switch {
	case errors.Is(err, ErrBodyUnreadable):
		return nil, BodyUnreadable, err
	case errors.Is(err, jsonpointer.ErrTopLevelArray):
		if m := p.matchBatch(body); m == BodyUnreadable {
			return nil, m, ErrProtectedBatch
		}
		return nil, BodyBatch, nil
	case err != nil:
		return nil, BodyNotJSON, nil
	}
	if p.Answers == AnswersJSONRPC {
		idv, method := vs[0], vs[1]
		if idv.Kind != jsonpointer.KindString && idv.Kind != jsonpointer.KindNumber {
			// No id (a notification); null, an object or an array is no
			// id a request may carry (MCP 2025-06-18, Base Protocol).
			return nil, BodyNotification, nil
		}
		if method.Kind != jsonpointer.KindString {
			return nil, BodyNotification, nil // a response, not a request
		}
		if method.OneOf(SubscriptionsListen) {
			return nil, BodySubscription, nil
		}
		if p.Tools.Protect == ToolsUnlessHinted && !method.OneOf("tools/call") {
			return nil, BodyCriteria, nil // the policy protects tool calls only
		}
		id = bytes.Clone(idv.Raw)
	}
	for i, c := range p.Match.JSON {
		if !vs[2+i].OneOf(c.OneOf...) {
			return nil, BodyCriteria, nil
		}
	}
	return id, BodyMatched, nil
}

// ErrProtectedBatch: a JSON-RPC batch (a top-level array) holding a message
// that meets the policy's body criteria. A batch is never protected: it has
// no one answer to store under one key. But servers still run the calls in
// one: JSON-RPC 2.0 §6 defines batches, MCP 2025-03-26 allows them, and the
// MCP Go SDK's server (go-sdk v1.8.0 mcp/streamable.go, servePOST) accepts a
// batch whenever the MCP-Protocol-Version header is absent or older than
// 2025-06-18. So such a batch is refused like a body that cannot be read,
// never passed unprotected.
var ErrProtectedBatch = fmt.Errorf("%w: a JSON-RPC batch holds a call this endpoint protects, and batches are never protected", ErrBodyUnreadable)

// matchBatch judges a batch by its messages: BodyUnreadable (for
// ErrProtectedBatch) when one of them meets the body criteria or cannot be
// read, BodyBatch when none does. An element that is itself an array is no
// message (JSON-RPC 2.0 §6: a batch holds Request objects) and is not
// looked into: reading nested arrays level by level would cost time
// quadratic in their depth.
func (p *Policy) matchBatch(body []byte) BodyMiss {
	var msgs []json.RawMessage
	if err := json.Unmarshal(body, &msgs); err != nil {
		return BodyUnreadable // Find read it whole already; not reached
	}
	for _, m := range msgs {
		if t := bytes.TrimLeft(m, " \t\r\n"); len(t) > 0 && t[0] == '[' {
			continue
		}
		if _, miss := p.MatchBody(m); miss == BodyMatched || miss == BodyUnreadable {
			return BodyUnreadable
		}
	}
	return BodyBatch
}

// BodyCandidates returns the policies a request deferred to its body may
// end with, in order: first (the first whose header criteria hold, which
// NeedsBody) and every later one whose header criteria hold, up to and
// including the first that has no body criteria (it takes every body).
func (s *Set) BodyCandidates(r Request, first *Policy) []*Policy {
	var out []*Policy
	on := false
	for _, p := range s.Policies {
		if p == first {
			on = true
		}
		if !on || !p.Match.Matches(r) {
			continue
		}
		out = append(out, p)
		if !p.bodyCriteria() {
			break
		}
	}
	return out
}

// bodyCriteria reports whether the policy takes only some bodies.
func (p *Policy) bodyCriteria() bool {
	return len(p.Match.JSON) > 0 || p.Answers == AnswersJSONRPC
}

// FingerprintOptions are the pointers the fingerprint narrows a JSON body
// with (fingerprint.include, fingerprint.exclude).
func (p *Policy) FingerprintOptions() fingerprint.JSONOptions {
	return fingerprint.JSONOptions{Include: p.FingerprintInclude, Exclude: p.FingerprintExclude}
}

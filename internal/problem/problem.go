// Package problem builds the RFC 9457 "problem details" answers that
// idem-extproc sends in place of an upstream response.
package problem

import (
	"encoding/json"
	"strconv"
	"time"
)

// ContentType is the media type of every body this package encodes.
const ContentType = "application/problem+json"

// TypeBase prefixes every problem type slug to form its type URI. The URIs
// identify the problems and lead to their documentation; clients should
// compare them, not fetch them.
const TypeBase = "https://github.com/idem-extproc/idem-extproc/blob/main/docs/problems.md#"

// Kind is one documented problem type.
type Kind struct {
	Slug   string
	Title  string
	Status int
}

// The problem types, documented in docs/problems.md.
var (
	KeyMissing       = Kind{"idempotency-key-missing", "Idempotency-Key header is required", 400}
	KeyInvalid       = Kind{"idempotency-key-invalid", "Idempotency-Key header is malformed", 400}
	KeyReused        = Kind{"idempotency-key-reused", "Idempotency-Key was used for a different request", 422}
	InProgress       = Kind{"request-in-progress", "A request with this Idempotency-Key is still being processed", 409}
	OutcomeUnknown   = Kind{"outcome-unknown", "The outcome of the earlier request with this Idempotency-Key is unknown", 409}
	StoreUnavailable = Kind{"idempotency-store-unavailable", "Idempotency store is unavailable", 503}
	BodyTooLarge     = Kind{"request-body-too-large", "Request body is too large to be checked for idempotency", 413}
	BodyIncomplete   = Kind{"request-body-incomplete", "Request body did not arrive whole", 413}
	PrincipalMissing = Kind{"principal-missing", "The request's principal is required to scope its Idempotency-Key", 401}
	CapacityExceeded = Kind{"idempotency-capacity-exceeded", "The idempotency server has no room to buffer this request now", 503}
	// HomeOutOfReach and HomesDisagree refuse a key whose scope is homed
	// in another region (docs/regions.md) before anything is reserved.
	HomeOutOfReach = Kind{"idempotency-home-out-of-reach", "The key's home region cannot be asked within the proxy's timers", 503}
	HomesDisagree  = Kind{"idempotency-homes-disagree", "The servers' homes maps disagree about the key's home region", 503}
	BodyUnreadable = Kind{"request-body-unreadable", "Request body cannot be read as JSON", 400}
	// HeaderMismatch is MCP 2026-07-28's: the headers that mirror a
	// call's method and name do not match its body (answers: jsonrpc).
	HeaderMismatch = Kind{"mcp-header-mismatch", "HeaderMismatch", 400}
)

// Problem is one answer: a kind with the specific detail of this case.
type Problem struct {
	Kind
	Detail string
	// RetryAfter, when positive, is sent as the Retry-After header.
	RetryAfter time.Duration
}

// New returns a problem of kind k with the given detail.
func New(k Kind, detail string) *Problem { return &Problem{Kind: k, Detail: detail} }

// Type returns the problem's type URI.
func (p *Problem) Type() string { return TypeBase + p.Slug }

// RetryAfterHeader returns the Retry-After value in whole seconds (at least
// 1), or "" when the problem carries none.
func (p *Problem) RetryAfterHeader() string {
	if p.RetryAfter <= 0 {
		return ""
	}
	s := int64((p.RetryAfter + time.Second - 1) / time.Second)
	return strconv.FormatInt(s, 10)
}

// Body encodes the problem as RFC 9457 JSON.
func (p *Problem) Body() []byte {
	// Marshalling strings and an int cannot fail.
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{p.Type(), p.Title, p.Status, p.Detail})
	return b
}

// Error makes a Problem usable as an error inside the server.
func (p *Problem) Error() string { return p.Slug + ": " + p.Detail }

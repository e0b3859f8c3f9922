package idemclient

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// ProblemType returns the type URI idem-extproc gives the problem with the
// given slug (docs/problems.md), e.g. ProblemType("outcome-unknown").
func ProblemType(slug string) string { return problem.TypeBase + slug }

// Sentinels a *ProblemError matches with errors.Is, by its problem type.
var (
	// ErrProblem matches every *ProblemError.
	ErrProblem = errors.New("idemclient: problem answer")
	// ErrKeyReused: 422 idempotency-key-reused. The key was used for a
	// different request; nothing was executed. Use a new key for a new
	// operation.
	ErrKeyReused = errors.New("idemclient: idempotency key reused for a different request")
	// ErrOutcomeUnknown: 409 outcome-unknown. An earlier attempt may or may
	// not have taken effect, and the server will not run it again: read the
	// resource; if the operation did not happen, retry with a new key.
	ErrOutcomeUnknown = errors.New("idemclient: outcome of the operation is unknown")
	// ErrKeyMissing: 400 idempotency-key-missing (the route requires a key).
	ErrKeyMissing = errors.New("idemclient: the server requires an Idempotency-Key")
	// ErrUnknownProblem: a problem type this package does not know, so it
	// cannot tell whether another attempt would be safe.
	ErrUnknownProblem = errors.New("idemclient: unknown problem type")
)

// knownProblems are the problem types of docs/problems.md, by slug, with the
// sentinel a ProblemError of that type matches (nil: ErrProblem only).
var knownProblems = map[string]error{
	problem.KeyMissing.Slug:       ErrKeyMissing,
	problem.KeyInvalid.Slug:       nil,
	problem.KeyReused.Slug:        ErrKeyReused,
	problem.InProgress.Slug:       nil,
	problem.OutcomeUnknown.Slug:   ErrOutcomeUnknown,
	problem.StoreUnavailable.Slug: nil,
	problem.BodyTooLarge.Slug:     nil,
	problem.BodyIncomplete.Slug:   nil,
	problem.PrincipalMissing.Slug: nil,
	problem.CapacityExceeded.Slug: nil,
	problem.BodyUnreadable.Slug:   nil,
	problem.HeaderMismatch.Slug:   nil,
	problem.HomeOutOfReach.Slug:   nil,
	problem.HomesDisagree.Slug:    nil,
}

// ProblemError is an RFC 9457 answer that ended the chain: one the contract
// says not to retry (422 idempotency-key-reused, 409 outcome-unknown, the
// 400s, 401 and 413s), or one whose type is unknown. The body was read whole
// (up to maxProblemBody) and closed.
type ProblemError struct {
	Status int
	// Type is the problem's type URI; Title and Detail are its text.
	Type, Title, Detail string
	// RetryAfter is the answer's Retry-After, 0 when it had none.
	RetryAfter time.Duration
	// Key is the operation key ("" for a request without one), Attempt the
	// number of the attempt that got this answer, RequestID its X-Request-Id.
	Key       string
	Attempt   int
	RequestID string
	Header    http.Header
	Body      []byte
}

// Slug returns the problem's slug when it is one of idem-extproc's types
// (docs/problems.md), else "".
func (e *ProblemError) Slug() string {
	s, ok := strings.CutPrefix(e.Type, problem.TypeBase)
	if !ok {
		return ""
	}
	if _, known := knownProblems[s]; !known {
		return ""
	}
	return s
}

func (e *ProblemError) Error() string {
	name := e.Slug()
	if name == "" {
		name = fmt.Sprintf("unknown problem type %q", e.Type)
	}
	msg := fmt.Sprintf("idemclient: %d %s", e.Status, name)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg + fmt.Sprintf(" (key %q, attempt %d, request id %s)", e.Key, e.Attempt, e.RequestID)
}

// Is matches ErrProblem, the sentinel of the problem's type, and
// ErrUnknownProblem for a type this package does not know.
func (e *ProblemError) Is(target error) bool {
	if target == ErrProblem {
		return true
	}
	s := e.Slug()
	if s == "" {
		return target == ErrUnknownProblem
	}
	sentinel := knownProblems[s]
	return sentinel != nil && target == sentinel
}

// Error is a chain that ended without an answer to return: a transport
// error that was not retried, or the last of the retries, or the deadline
// or cancellation of the request's context. It unwraps to the last
// attempt's error (so errors.Is(err, context.DeadlineExceeded) works).
type Error struct {
	// Key is the operation key ("" for a request without one), Attempts how
	// many attempts were sent, RequestID the last one's X-Request-Id.
	Key       string
	Attempts  int
	RequestID string
	// Reason says why the chain stopped here.
	Reason string
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("idemclient: %s after %d attempt(s) (key %q, request id %s): %v",
		e.Reason, e.Attempts, e.Key, e.RequestID, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

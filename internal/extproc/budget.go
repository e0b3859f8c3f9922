package extproc

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// bodyBudget bounds the body bytes all streams together buffer: the
// request bodies read to be fingerprinted, and the response bodies read to
// be stored. Each message is bounded by itself (the gRPC server's largest
// message, a policy's max_request_body and max_stored_body), but a burst of
// large protected requests would hold them all at once and exhaust the
// process's memory, failing every stream. Past the budget, a new protected
// request is refused with a 503 idempotency-capacity-exceeded before
// anything is reserved, and a response is stored without its body (as one
// over max_stored_body is); what a stream holds returns to the budget once
// its request is decided and when the stream ends.
type bodyBudget struct {
	limit int64
	used  atomic.Int64
}

// take charges n bytes, or reports false when they would pass the limit.
func (b *bodyBudget) take(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

func (b *bodyBudget) give(n int64) { b.used.Add(-n) }

// hold charges n more buffered bytes to a stream that holds *held; false
// when the budget has no room for them. Without a budget (nil) it always
// holds.
func (b *bodyBudget) hold(held *int64, n int) bool {
	if b == nil || n == 0 {
		return true
	}
	if !b.take(int64(n)) {
		return false
	}
	*held += int64(n)
	return true
}

// holdRequestBody charges cost more bytes for a request body that will be
// size bytes long with its next chunk, or returns the problem to answer:
// 413 when the body alone would pass the whole budget (it could never be
// taken; a retry would not help), 503 with Retry-After when the budget is
// only full for now.
func (b *bodyBudget) holdRequestBody(held *int64, size, cost int, retryAfter time.Duration) *problem.Problem {
	if b != nil && int64(size) > b.limit {
		return attempt.BodyTooLarge(int(b.limit))
	}
	if !b.hold(held, cost) {
		return b.capacityProblem(retryAfter)
	}
	return nil
}

// BufferedBytes is what all streams' bodies hold of the budget now (0
// without a budget).
func (s *Server) BufferedBytes() int64 {
	if s.budget == nil {
		return 0
	}
	return s.budget.used.Load()
}

// release returns every byte a stream holds to the budget.
func (b *bodyBudget) release(held *int64) {
	if *held > 0 {
		b.give(*held)
		*held = 0
	}
}

// full reports a budget with no room left at all: a new protected request
// is then refused at its headers.
func (b *bodyBudget) full() bool {
	return b != nil && b.used.Load() >= b.limit
}

// capacityProblem is the answer to a protected request the budget has no
// room for: nothing was reserved or executed, so a retry with the same key
// after Retry-After is safe.
func (b *bodyBudget) capacityProblem(retryAfter time.Duration) *problem.Problem {
	prob := problem.New(problem.CapacityExceeded, fmt.Sprintf(
		"the idempotency server is buffering as many bodies as its memory budget allows (%d bytes); retry later",
		b.limit))
	prob.RetryAfter = retryAfter
	return prob
}

package extproc

import (
	"fmt"
	"sync/atomic"

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

// hold charges n more buffered bytes to this stream; false when the
// server's budget has no room for them. Without a budget it always holds.
func (p *processor) hold(n int) bool {
	b := p.srv.budget
	if b == nil || n == 0 {
		return true
	}
	if !b.take(int64(n)) {
		return false
	}
	p.held += int64(n)
	return true
}

// holdRequestBody charges the next n bytes of the request body, or returns
// the problem to answer: 413 when the body alone would pass the whole
// budget (it could never be taken; a retry would not help), 503 with
// Retry-After when the budget is only full for now.
func (p *processor) holdRequestBody(n int) *problem.Problem {
	if b := p.srv.budget; b != nil && int64(len(p.reqBody)+n) > b.limit {
		return bodyTooLarge(int(b.limit))
	}
	if !p.hold(n) {
		return p.capacityProblem()
	}
	return nil
}

// releaseHeld returns every byte this stream holds to the budget.
func (p *processor) releaseHeld() {
	if p.held > 0 {
		p.srv.budget.give(p.held)
		p.held = 0
	}
}

// budgetFull reports a budget with no room left at all: a new protected
// request is then refused at its headers.
func (p *processor) budgetFull() bool {
	b := p.srv.budget
	return b != nil && b.used.Load() >= b.limit
}

// capacityProblem is the answer to a protected request the budget has no
// room for: nothing was reserved or executed, so a retry with the same key
// after Retry-After is safe.
func (p *processor) capacityProblem() *problem.Problem {
	prob := problem.New(problem.CapacityExceeded, fmt.Sprintf(
		"the idempotency server is buffering as many bodies as its memory budget allows (%d bytes); retry later",
		p.srv.budget.limit))
	prob.RetryAfter = p.att.Policy.RetryAfter
	return prob
}

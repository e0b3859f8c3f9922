package extproc

import (
	"fmt"
	"sync/atomic"
	"time"

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
	small atomic.Int64 // of used, what bodies that came in small messages hold
	// smallBody is called as a body comes to count as small; nil: none.
	smallBody func()
}

// A body that arrives in small messages (a client trickling it a byte at a
// time, which Envoy passes on as a message each) makes some hundreds of
// bytes of garbage per body byte, so the collector runs all through it
// and the heap sits at its goal: at the default --gc-percent 400 the body
// would cost its size plus four times the rest of the heap. The budget
// tells such bodies apart, so that the daemon's collector pacing can give
// them, and the heap while they are held, a tighter goal
// (internal/daemon/gc.go). A body counts as small once it has come in at
// least smallBodyMessages messages averaging under smallBodyMessage bytes
// of the budget each. Envoy does not state the size of the chunks it
// streams; it reads a connection into buffer slices of 16 KiB
// (source/common/buffer/buffer_impl.h, default_slice_size_), so a body
// sent at speed comes in chunks well above the threshold.
const (
	smallBodyMessages = 64
	smallBodyMessage  = 4 << 10
)

// holding is what one stream's bodies take of the budget.
type holding struct {
	bytes    int64 // charged to the budget
	messages int64 // body messages kept since the last release
	small    bool  // bytes are counted in the budget's small too
}

// hold charges a body message's n more buffered bytes to a stream that
// holds *h; false when the budget has no room for them. Without a budget
// (nil) it always holds.
func (b *bodyBudget) hold(h *holding, n int) bool {
	if b == nil {
		return true
	}
	for u := b.used.Load(); n > 0; u = b.used.Load() {
		if u+int64(n) > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+int64(n)) {
			break
		}
	}
	h.bytes += int64(n)
	h.messages++
	switch {
	case h.small:
		b.small.Add(int64(n))
	case h.messages >= smallBodyMessages && h.bytes < h.messages*smallBodyMessage:
		h.small = true
		b.small.Add(h.bytes)
		if b.smallBody != nil {
			b.smallBody()
		}
	}
	return true
}

// BufferedBytes is what all streams' bodies hold of the budget now, and
// of that what bodies that came in small messages hold (0 without a
// budget).
func (s *Server) BufferedBytes() (all, small int64) {
	if s.budget == nil {
		return 0, 0
	}
	return s.budget.used.Load(), s.budget.small.Load()
}

// release returns every byte a stream holds to the budget.
func (b *bodyBudget) release(h *holding) {
	if h.bytes > 0 {
		b.used.Add(-h.bytes)
		if h.small {
			b.small.Add(-h.bytes)
		}
	}
	*h = holding{}
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

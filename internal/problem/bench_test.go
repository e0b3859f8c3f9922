package problem

import (
	"testing"
	"time"
)

// BenchmarkBody encodes the answer the server sends most often after a
// replay: 409 request-in-progress with its Retry-After.
func BenchmarkBody(b *testing.B) {
	p := New(InProgress, "an earlier request with this Idempotency-Key is still being processed; retry later")
	p.RetryAfter = time.Second
	b.ReportAllocs()
	for range b.N {
		_ = p.Body()
		_ = p.RetryAfterHeader()
	}
}

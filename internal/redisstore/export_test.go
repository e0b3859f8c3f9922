package redisstore

import "github.com/idem-extproc/idem-extproc/internal/idem"

// Unbatched makes every script call of s run on its own, as before
// batching, for tests and benchmarks that compare the two.
func Unbatched(s *Store) *Store { s.batch = nil; return s }

// Batching reports the batch slots taken and the calls queued on a
// single-primary store: the events the batching tests wait for.
func Batching(s *Store) (busy, queued int) {
	b := &s.batch.one
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.busy, len(b.pending)
}

// BatchedCalls is how many calls of batches a single-primary store has
// handed to Redis.
func BatchedCalls(s *Store) int64 { return s.batch.one.sent.Load() }

// MaxBatches is DefaultBatchSlots, for tests that fill every slot.
const MaxBatches = DefaultBatchSlots

// EncodeHead is the response head as the store writes it.
func EncodeHead(r *idem.Response) []byte { return encodeResponseHead(r) }

// IsBatched reports whether the store batches its script calls.
func IsBatched(s *Store) bool { return s.batch != nil }

package redisstore_test

import (
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisstore"
)

// TestBatchingFor: batching up to BatchedUpTo, none beyond (the figures
// behind the threshold are in docs/redis.md, "Pipelining").
func TestBatchingFor(t *testing.T) {
	for _, tc := range []struct {
		rtt       time.Duration
		unbatched bool
	}{
		{0, false}, {80 * time.Microsecond, false}, {redisstore.BatchedUpTo, false},
		{redisstore.BatchedUpTo + time.Microsecond, true}, {time.Millisecond, true}, {30 * time.Millisecond, true},
	} {
		o := redisstore.BatchingFor(tc.rtt)
		if o.Unbatched != tc.unbatched || (!o.Unbatched && o.BatchSlots != redisstore.DefaultBatchSlots) {
			t.Errorf("BatchingFor(%v) = %+v", tc.rtt, o)
		}
	}
}

func TestUnbatchedOption(t *testing.T) {
	for _, unbatched := range []bool{false, true} {
		s := redisstore.New(nil, redisstore.Options{Unbatched: unbatched})
		if redisstore.IsBatched(s) == unbatched {
			t.Errorf("Options{Unbatched: %v}: batched %v", unbatched, redisstore.IsBatched(s))
		}
	}
}

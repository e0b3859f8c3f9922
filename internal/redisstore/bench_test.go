package redisstore_test

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redistest"
	"github.com/idem-extproc/idem-extproc/internal/storetest"
)

// BenchmarkStore times each store operation on a real redis-server on
// loopback (storetest.Benchmark): one round trip and one script each, so
// the figures are mostly Redis and the network stack, plus the client's
// encoding and the reply's parsing.
func BenchmarkStore(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	storetest.Benchmark(b, redistest.OpenStore(b, srv.URL(), idem.DefaultStoreTimeout))
}

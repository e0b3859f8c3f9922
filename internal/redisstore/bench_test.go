package redisstore_test

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/redistest"
	"github.com/idem-extproc/idem-extproc/internal/storetest"
)

// BenchmarkStore times each store operation on a real redis-server on
// loopback (storetest.Benchmark): one round trip and one script each, so
// the figures are mostly Redis and the network stack, plus the client's
// encoding and the reply's parsing.
func BenchmarkStore(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	rdb, err := redisstore.NewClient(srv.URL(), redisstore.DefaultCallTimeout)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = rdb.Close() })
	st := redisstore.New(rdb, redisstore.Options{})
	b.Cleanup(func() { _ = st.Close() })
	storetest.Benchmark(b, st)
}

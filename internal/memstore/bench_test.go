package memstore_test

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/storetest"
)

// BenchmarkStore times each store operation in memory (storetest.Benchmark).
func BenchmarkStore(b *testing.B) {
	st := memstore.New(memstore.Options{})
	b.Cleanup(func() { _ = st.Close() })
	storetest.Benchmark(b, st)
}

package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/storetest"
)

// BenchmarkStore times each store operation on a real redis-server on
// loopback (storetest.Benchmark): one round trip and one script each, so
// the figures are mostly Redis and the network stack, plus the client's
// encoding and the reply's parsing.
func BenchmarkStore(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	storetest.Benchmark(b, redistest.OpenStore(b, srv.URL(), idem.DefaultStoreTimeout))
}

// BenchmarkConcurrentScripts: a reservation and its completion (1 KiB
// body), as one protected first write makes them, from 1 or 32 concurrent
// streams on one redis-server, with the calls of concurrent streams
// batched (the store as built) and each on its own (as before batching).
// The two modes take turns within each stream count, -count times, so
// that the machine's drift hits both alike. reads/op is Redis's count of
// socket reads per write (INFO stats total_reads_processed), cpu-µs/op
// the CPU (user and system) this process spent per write: the client's
// side, less noisy than ns/op on a shared machine.
func BenchmarkConcurrentScripts(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	resp := storetest.BenchResponse()
	for _, streams := range []int{1, 32} {
		for _, mode := range []string{"unbatched", "batched"} {
			b.Run(fmt.Sprintf("streams=%d/%s", streams, mode), func(b *testing.B) {
				s := redistest.OpenStore(b, srv.URL(), time.Second)
				if mode == "unbatched" {
					redisstore.Unbatched(s)
				}
				readsBefore, cpuBefore := benchReads(b, srv), processCPU(b)
				runConcurrently(b, streams, storeWrite(s, resp))
				b.ReportMetric(float64(benchReads(b, srv)-readsBefore)/float64(b.N), "reads/op")
				b.ReportMetric(float64(processCPU(b)-cpuBefore)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// benchReservation is a fresh key's reservation, as a first write makes it.
func benchReservation() idem.Reservation {
	return idem.Reservation{
		ID:          idem.RecordIDFor("bench", "scope", idem.NewToken().String()),
		Fingerprint: idem.Fingerprint{1}, Token: idem.NewToken(),
		Lease: 5 * time.Second, Retention: 5 * time.Second,
	}
}

// storeWrite is one first write's store calls on s: reserve, then complete
// with resp.
func storeWrite(s idem.Store, resp idem.Response) func(context.Context) error {
	return func(ctx context.Context) error {
		r := benchReservation()
		if _, err := s.Reserve(ctx, r); err != nil {
			return err
		}
		return s.Complete(ctx, r.ID, r.Token, resp, 5*time.Second)
	}
}

// runConcurrently runs op b.N times in all, from callers goroutines at
// once, timing only that; the first error fails the benchmark.
func runConcurrently(b *testing.B, callers int, op func(context.Context) error) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := op(ctx); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}

func benchReads(b *testing.B, srv *redistest.Server) int64 {
	var n int64
	if _, err := fmt.Sscan(srv.Info(context.Background(), "stats", "total_reads_processed"), &n); err != nil {
		b.Fatal(err)
	}
	return n
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

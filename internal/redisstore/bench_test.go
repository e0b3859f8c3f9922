package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/compress"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
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

// BenchmarkFirstWriteCorpus: a first write's store calls (reserve, then
// complete) with the answers of the generated corpus (package corpus),
// stored as they came or compressed first as the server compresses them:
// with the built-in dictionary in auto and zstd modes, or with one trained
// on the class. cpu-µs/op is
// this process's CPU per write (compression and the client), the server's
// share of the cost; redis-cpu-µs/op redis-server's; stored-bytes/op what
// the record holds of the answer. From one stream: the figures are CPU,
// not throughput. redis-cpu-µs/op counts clock ticks: use -benchtime of
// at least 20000x for it.
func BenchmarkFirstWriteCorpus(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	pid, err := strconv.Atoi(srv.Info(context.Background(), "server", "process_id"))
	if err != nil {
		b.Fatalf("redis-server pid: %v", err)
	}
	for _, c := range corpus.Classes {
		answers := corpus.New(1).Answers(c, 256)
		for _, mode := range []string{"uncompressed", "auto", "zstd", "trained"} {
			b.Run(string(c)+"/"+mode, func(b *testing.B) {
				var codec *compress.Codec
				switch mode {
				case "auto":
					codec = benchCodec(b, compress.Options{})
				case "zstd":
					codec = benchCodec(b, compress.Options{Mode: compress.Zstd})
				case "trained":
					codec = benchCodec(b, compress.Options{Dictionary: benchDictionary(b, c)})
				}
				s := redistest.OpenStore(b, srv.URL(), time.Second)
				ctx := context.Background()
				var stored int
				cpuBefore, redisBefore := processCPU(b), redisCPU(b, pid)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					resp := answers[i%len(answers)]
					if codec != nil {
						resp = codec.Compress(resp)
					}
					stored += len(resp.Body)
					if err := storeWrite(s, resp)(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(processCPU(b)-cpuBefore)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
				b.ReportMetric(float64(redisCPU(b, pid)-redisBefore)/float64(time.Microsecond)/float64(b.N), "redis-cpu-µs/op")
				b.ReportMetric(float64(stored)/float64(b.N), "stored-bytes/op")
			})
		}
	}
}

func benchCodec(b *testing.B, o compress.Options) *compress.Codec {
	c, err := compress.New(o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return c
}

// benchDictionary is a dictionary trained on 500 answers of class c
// other than those written; on 100 under the race detector, whose run
// (the suite's one benchmark pass, -test.bench=. -test.benchtime=1x) shows the benchmark works, not its
// figures, and where training on 500 took most of the package's time.
func benchDictionary(b *testing.B, c corpus.Class) *compress.Dictionary {
	n := 500
	if underRace {
		n = 100
	}
	var samples [][]byte
	for _, r := range corpus.New(1000).Answers(c, n) {
		samples = append(samples, idem.AppendContents(nil, &r))
	}
	raw, err := compress.Train(samples, 40000, 16<<10)
	if err != nil {
		b.Fatal(err)
	}
	d, err := compress.ParseDictionary(string(c), raw)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkScriptsOverDelay: a first write's reservation and completion,
// as BenchmarkConcurrentScripts makes them, through a userspace delay link
// (redistest.DelayLink) that adds half the round trip each way: 0 (the
// link alone), 0.5, 1 and 2.5 ms, the distances to a Redis in the same
// host, zone or another zone. From 8 and 32 streams; unbatched, and the
// batcher with 2 slots (DefaultBatchSlots) and with 8. The modes take
// turns within each round trip and stream count, -count times. A timing
// comparison: run it on a quiet machine (docs/redis.md, "Pipelining").
func BenchmarkScriptsOverDelay(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	link := redistest.NewDelayLink(b, srv.Addr())
	resp := storetest.BenchResponse()
	for _, rtt := range []time.Duration{0, 500 * time.Microsecond, time.Millisecond, 2500 * time.Microsecond} {
		link.SetDelay(rtt/2, rtt/2)
		for _, streams := range []int{8, 32} {
			for _, mode := range []string{"unbatched", "slots=2", "slots=8"} {
				b.Run(fmt.Sprintf("rtt=%v/streams=%d/%s", rtt, streams, mode), func(b *testing.B) {
					slots := 0
					if _, err := fmt.Sscanf(mode, "slots=%d", &slots); err != nil && mode != "unbatched" {
						b.Fatal(err)
					}
					rdb, err := redisstore.NewClient(link.URL(), 5*time.Second)
					if err != nil {
						b.Fatal(err)
					}
					s := redisstore.New(rdb, redisstore.Options{CallTimeout: 5 * time.Second, BatchSlots: slots})
					b.Cleanup(func() {
						_ = s.Close()
						_ = rdb.Close()
					})
					if mode == "unbatched" {
						redisstore.Unbatched(s)
					}
					cpuBefore := processCPU(b)
					runConcurrently(b, streams, storeWrite(s, resp))
					b.ReportMetric(float64(processCPU(b)-cpuBefore)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
				})
			}
		}
	}
}

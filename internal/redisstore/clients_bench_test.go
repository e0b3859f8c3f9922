package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/storetest"
)

// BenchmarkScriptClients runs what one protected first write sends, a
// reservation and its completion (1 KiB body), through the store as built
// (go-redis under the batcher, batch.go), from 1, 8, 32 and 128 concurrent
// callers on one redis-server. It compared other clients for these calls
// too, which lost and were removed with their code: rueidis v1.0.79's
// automatic pipelining (on its default two connections and on one; the
// benchmark as it ran is at commit 223608b) and every call handed to
// long-lived sender goroutines (at 200aa66); docs/redis.md, "Which client".
//
// cpu-µs/op is this process's CPU (user and system) per write,
// redis-cpu-µs/op redis-server's (/proc/PID/stat, clock ticks: use
// -benchtime of at least 20000x), total-cpu-µs/op their sum: on a machine
// whose cores the server and Redis share, throughput follows that sum.
func BenchmarkScriptClients(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	pid, err := strconv.Atoi(srv.Info(context.Background(), "server", "process_id"))
	if err != nil {
		b.Fatalf("redis-server pid: %v", err)
	}
	resp := storetest.BenchResponse()
	for _, callers := range []int{1, 8, 32, 128} {
		b.Run(fmt.Sprintf("callers=%d/batcher", callers), func(b *testing.B) {
			write := storeWrite(redistest.OpenStore(b, srv.URL(), time.Second), resp)
			cpuBefore, redisBefore := processCPU(b), redisCPU(b, pid)
			b.ReportAllocs()
			runConcurrently(b, callers, write)
			client := float64(processCPU(b)-cpuBefore) / float64(time.Microsecond) / float64(b.N)
			server := float64(redisCPU(b, pid)-redisBefore) / float64(time.Microsecond) / float64(b.N)
			b.ReportMetric(client, "cpu-µs/op")
			b.ReportMetric(server, "redis-cpu-µs/op")
			b.ReportMetric(client+server, "total-cpu-µs/op")
		})
	}
}

// redisCPU is redis-server's CPU time so far: utime and stime of
// /proc/<pid>/stat, in clock ticks of 10 ms (procfs.ProcStat.CPUTime).
func redisCPU(b *testing.B, pid int) time.Duration {
	p, err := procfs.NewProc(pid)
	if err != nil {
		b.Fatal(err)
	}
	st, err := p.Stat()
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(st.CPUTime() * float64(time.Second))
}

package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	"github.com/redis/rueidis"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	luascripts "github.com/idem-extproc/idem-extproc/internal/redisstore/scripts"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/storetest"
)

// BenchmarkScriptClients compares the clients the hot script calls could
// go through: a reservation and its completion (1 KiB body),
// as one protected first write makes them, EVALSHA of the store's own
// scripts with the ARGV the store sends (ReserveArgs, CompleteArgs), from
// 1, 8, 32 and 128 concurrent callers on one redis-server:
//
//   - batcher: the store as built, go-redis under the batcher (batch.go);
//   - rueidis: rueidis v1.0.79's Lua.Exec on a client with automatic
//     pipelining (its default), caching off, each call under its own
//     deadline as Store.bound gives it;
//   - rueidis-1conn: the same on one pipelined connection
//     (PipelineMultiplex -1) instead of its default of two on two vCPUs
//     (rueidis.go singleClientMultiplex: log2(GOMAXPROCS), at most 2);
//
// A fourth variant, every call handed to long-lived sender goroutines, was
// measured at 200aa66 and removed with its hook once it lost
// (docs/redis.md, "Which client").
//
// The variants take turns within each caller count, -count times, so the
// machine's drift hits all alike. cpu-µs/op is this process's CPU (user
// and system) per write, redis-cpu-µs/op redis-server's (/proc/PID/stat,
// clock ticks: use -benchtime of at least 20000x), total-cpu-µs/op their
// sum: on a machine whose cores the server and Redis share, throughput
// follows that sum.
func BenchmarkScriptClients(b *testing.B) {
	srv := redistest.Start(b, redistest.Options{})
	pid, err := strconv.Atoi(srv.Info(context.Background(), "server", "process_id"))
	if err != nil {
		b.Fatalf("redis-server pid: %v", err)
	}
	resp := storetest.BenchResponse()
	for _, callers := range []int{1, 8, 32, 128} {
		for _, variant := range []string{"batcher", "rueidis", "rueidis-1conn"} {
			b.Run(fmt.Sprintf("callers=%d/%s", callers, variant), func(b *testing.B) {
				write := benchWriter(b, srv, variant, resp)
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
}

// benchWriter returns one write of the variant: reserve, then complete.
func benchWriter(b *testing.B, srv *redistest.Server, variant string, resp idem.Response) func(context.Context) error {
	const budget = time.Second
	if !strings.HasPrefix(variant, "rueidis") {
		return storeWrite(redistest.OpenStore(b, srv.URL(), budget), resp)
	}
	opt := rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true}
	if variant == "rueidis-1conn" {
		opt.PipelineMultiplex = -1
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	reserve := rueidis.NewLuaScript(luascripts.Source("reserve"))
	complete := rueidis.NewLuaScript(luascripts.Source("complete"))
	return func(ctx context.Context) error {
		r := benchReservation()
		key := []string{redisstore.DefaultPrefix + "{" + string(r.ID) + "}"} // Store.Key
		rctx, cancel := context.WithTimeout(ctx, budget)
		keys := []string{key[0], key[0] + ":cancelled:" + r.Token.String()} // reserve.lua's KEYS (store.go, cancelledSep)
		v, err := reserve.Exec(rctx, c, keys, ruArgs(redisstore.ReserveArgs(&r))).ToArray()
		cancel()
		if err != nil {
			return err
		}
		if out, _ := v[0].ToString(); out != "reserved" {
			return fmt.Errorf("reserve: %s", out)
		}
		cctx, cancel := context.WithTimeout(ctx, budget)
		n, err := complete.Exec(cctx, c, key, ruArgs(redisstore.CompleteArgs(r.Token, &resp, 5*time.Second))).AsInt64()
		cancel()
		if err == nil && n != 1 {
			err = fmt.Errorf("complete: %d", n)
		}
		return err
	}
}

// ruArgs turns the store's ARGV into rueidis's strings, as go-redis's
// writer would encode them: bytes as they are (no copy), integers in
// decimal.
func ruArgs(args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case []byte:
			out[i] = rueidis.BinaryString(v)
		case string:
			out[i] = v
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		default:
			panic(fmt.Sprintf("argument of type %T", a))
		}
	}
	return out
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

package extproc_test

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
)

// What holding a body costs the server in resident memory, which is what
// a container's limit counts: the live heap (BenchmarkBodyMemory) plus the
// garbage the collector lets accumulate before it runs (--gc-percent) and
// what the runtime has not yet handed back to the kernel. The server is
// the daemon itself, at its shipped defaults (collector, body budget,
// message size, in-memory store), in a process of its own: this test
// binary run again as TestResidentChild. The client sends one body of N
// bytes, incompressible, in chunks of each size, and reads the child's
// /proc/<pid>/status before and after: the peak resident set (VmHWM,
// reset after a warm-up request by writing 5 to clear_refs) less the
// resident set before the body. Two sizes of body separate what grows
// with the body (the slope) from what does not (the constant).

// residentChildEnv holds the daemon's flags in the child process.
const residentChildEnv = "IDEM_EXTPROC_RESIDENT_CHILD"

var residentGCPercent = flag.Int("resident-gc-percent", 0,
	"--gc-percent of the server BenchmarkResidentMemory measures; 0: the daemon's default")

// TestResidentChild is the server process of BenchmarkResidentMemory.
func TestResidentChild(t *testing.T) {
	flags := os.Getenv(residentChildEnv)
	if flags == "" {
		t.Skip("the server process of BenchmarkResidentMemory")
	}
	os.Exit(daemon.Main(context.Background(), strings.Fields(flags), os.Getenv, os.Stderr))
}

// residentServer is the daemon in a child process and a client of it.
type residentServer struct {
	cmd *exec.Cmd
	cc  *grpc.ClientConn
}

// residentPolicy lets the largest body measured be held and stored; every
// other setting is the default policy's.
const residentPolicy = "defaults:\n  max_request_body: 64MiB\n  max_stored_body: 64MiB\n"

func startResident(tb testing.TB) *residentServer {
	tb.Helper()
	dir := tb.TempDir()
	cfg := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(cfg, []byte(residentPolicy), 0o600); err != nil {
		tb.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestResidentChild$")
	// The collector at its shipped default: no GOGC or GOMEMLIMIT of the
	// caller's.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	flags := "--listen=" + addr + " --admin-listen= --config=" + cfg
	if *residentGCPercent > 0 {
		flags += " --gc-percent=" + strconv.Itoa(*residentGCPercent)
	}
	cmd.Env = append(cmd.Env, residentChildEnv+"="+flags)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	s := &residentServer{cmd: cmd}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the server did not listen on %s:\n%s", addr, stderr.String())
		}
	}
	s.cc, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(), grpc.WithDefaultCallOptions(grpc.ForceCodec(plainCodec{})))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.cc.Close() })
	return s
}

// status reads the child's resident set and its peak, in bytes.
func (s *residentServer) status(tb testing.TB) (rss, hwm int64) {
	tb.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), ":")
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch {
		case err != nil:
		case name == "VmRSS":
			rss = kb << 10
		case name == "VmHWM":
			hwm = kb << 10
		}
	}
	if rss == 0 || hwm == 0 {
		tb.Fatal("no VmRSS or VmHWM in the child's status")
	}
	return rss, hwm
}

// resetPeak makes the child's VmHWM its resident set now
// (Documentation/filesystems/proc.rst, clear_refs: 5).
func (s *residentServer) resetPeak(tb testing.TB) {
	tb.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", s.cmd.Process.Pid), []byte("5"), 0); err != nil {
		tb.Fatal(err)
	}
}

// residentGrowth runs the case's body n times, each under a key of its
// own, through a new server process after a warm-up request of the same
// mode and direction, and returns how far its peak resident set rose
// above its resident set before each body, and the resident set before
// the first.
func residentGrowth(tb testing.TB, c bodyCase, body []byte, n int) (growth []int64, base int64) {
	tb.Helper()
	s := startResident(tb)
	var replies atomic.Int64
	warm := c
	warm.size = 16 << 10
	sendBody(tb, s.cc, warm, "warm", body, &replies)
	for i := range n {
		s.resetPeak(tb)
		before, _ := s.status(tb)
		if i == 0 {
			base = before
		}
		sendBody(tb, s.cc, c, fmt.Sprintf("measured-%d", i), body, &replies)
		_, hwm := s.status(tb)
		growth = append(growth, hwm-before)
	}
	return growth, base
}

// residentSizes are the two body sizes each case is measured at: 4 and
// 16 MiB (a BUFFERED body is one message, within the shipped 32 MiB
// --max-message-size); 1-byte chunks, a message each, take long enough at
// 1 and 4 MiB.
// Under the race detector (the suite's one benchmark pass, -test.bench=. -test.benchtime=1x) they are
// 64 and 256 KiB, 4 and 16 KiB in 1-byte chunks (a message each, about
// 20 s for 64 KiB under the detector): that run shows the benchmark works,
// not its figures.
func residentSizes(chunk int) [2]int {
	if underRace && chunk == 1 {
		return [2]int{4 << 10, 16 << 10}
	}
	if underRace {
		return [2]int{64 << 10, 256 << 10}
	}
	if chunk == 1 {
		return [2]int{1 << 20, 4 << 20}
	}
	return [2]int{4 << 20, 16 << 20}
}

// BenchmarkResidentMemory reports, for one body in each mode and direction
// cut into chunks of 1 byte, 1 KiB and 64 KiB (BUFFERED: one message):
// rss-B/B, the peak resident memory the larger body added per body byte;
// slope-B/B, what each further body byte adds (between the two sizes);
// const-MiB, what the body added besides (the slope's intercept);
// base-MiB, the server's resident set before the body; and again-B/B,
// what the same smaller body added per byte when sent once more, to the
// same process: the figures before measure a body that is the first of
// its kind in the process, which may cost more than the next. One run each
// (-benchtime=1x); its time per operation is not a figure to compare.
func BenchmarkResidentMemory(b *testing.B) {
	if _, err := os.Stat("/proc/self/clear_refs"); err != nil {
		b.Skip("needs Linux's /proc/<pid>/status and clear_refs")
	}
	body := make([]byte, 16<<20)
	rng := rand.NewChaCha8([32]byte{1})
	_, _ = rng.Read(body)
	for _, mode := range bodyModes {
		chunks := []int{1, 1 << 10, 64 << 10}
		if mode == procmodev3.ProcessingMode_BUFFERED {
			chunks = []int{0} // one message
		}
		for _, chunk := range chunks {
			for _, response := range directions(mode) {
				for _, declared := range []bool{false, true} {
					if declared && chunk <= 1 {
						continue // declared lengths are measured at 1 KiB and 64 KiB chunks
					}
					name := fmt.Sprintf("%s/response=%v/chunk=%d", mode, response, chunk)
					if declared {
						name += "/content-length"
					}
					b.Run(name, func(b *testing.B) {
						residentCase(b, bodyCase{mode: mode, response: response, chunk: chunk, declared: declared}, body)
					})
				}
			}
		}
	}
}

// residentCase measures c at both residentSizes and reports the figures.
func residentCase(b *testing.B, c bodyCase, body []byte) {
	sizes := residentSizes(c.chunk)
	var growth [2]int64
	var again, base int64
	for b.Loop() {
		c.size = sizes[0]
		g, _ := residentGrowth(b, c, body, 2)
		growth[0], again = g[0], g[1]
		c.size = sizes[1]
		g, base = residentGrowth(b, c, body, 1)
		growth[1] = g[0]
	}
	slope := float64(growth[1]-growth[0]) / float64(sizes[1]-sizes[0])
	b.ReportMetric(float64(growth[1])/float64(sizes[1]), "rss-B/B")
	b.ReportMetric(slope, "slope-B/B")
	b.ReportMetric((float64(growth[0])-slope*float64(sizes[0]))/(1<<20), "const-MiB")
	b.ReportMetric(float64(base)/(1<<20), "base-MiB")
	b.ReportMetric(float64(again)/float64(sizes[0]), "again-B/B")
}

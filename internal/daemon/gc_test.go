package daemon

import (
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// TestPlanGC: the default percent with a soft limit from the cgroup or the
// body budget; the flag over GOGC; GOGC and GOMEMLIMIT left to the runtime
// as it read them, a high GOGC still paired with a limit.
func TestPlanGC(t *testing.T) {
	cgroup := map[string]string{"/sys/fs/cgroup/memory.max": "536870912\n"}
	const budget = 128 << 20
	for _, tc := range []struct {
		name        string
		flag        int
		env, files  map[string]string
		wantPercent int
		wantLimit   int64
	}{
		{"default, no cgroup limit", 0, nil, nil, DefaultGCPercent, 2*budget + gcSoftLimitBase},
		{"default, cgroup limit", 0, nil, cgroup, DefaultGCPercent, 536870912 / 10 * 9},
		{"flag", 250, nil, nil, 250, 2*budget + gcSoftLimitBase},
		{"flag over GOGC", 250, map[string]string{"GOGC": "50"}, nil, 250, 2*budget + gcSoftLimitBase},
		{"flag at most 100: no limit", 100, nil, cgroup, 100, 0},
		{"GOGC low: left alone", 0, map[string]string{"GOGC": "80"}, cgroup, 0, 0},
		{"GOGC high: paired with a limit", 0, map[string]string{"GOGC": "800"}, cgroup, 0, 536870912 / 10 * 9},
		{"GOGC off: paired with a limit", 0, map[string]string{"GOGC": "off"}, nil, 0, 2*budget + gcSoftLimitBase},
		{"GOMEMLIMIT left alone", 0, map[string]string{"GOMEMLIMIT": "300MiB"}, cgroup, DefaultGCPercent, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planGC(Config{GCPercent: tc.flag}, budget, func(k string) string { return tc.env[k] },
				func(p string) ([]byte, error) {
					if v, ok := tc.files[p]; ok {
						return []byte(v), nil
					}
					return nil, fs.ErrNotExist
				})
			if got.percent != tc.wantPercent || got.memoryLimit != tc.wantLimit {
				t.Fatalf("percent %d limit %d (%s, %s), want %d and %d",
					got.percent, got.memoryLimit, got.percentFrom, got.limitFrom, tc.wantPercent, tc.wantLimit)
			}
		})
	}
}

// TestGCSettingsApply: the runtime gets the plan's values, and apply
// reports what is in force.
func TestGCSettingsApply(t *testing.T) {
	oldPercent := debug.SetGCPercent(100)
	oldLimit := debug.SetMemoryLimit(-1)
	defer func() {
		debug.SetGCPercent(oldPercent)
		debug.SetMemoryLimit(oldLimit)
	}()
	percent, limit := gcSettings{percent: 321, memoryLimit: 700 << 20}.apply()
	if percent != 321 || limit != 700<<20 {
		t.Fatalf("in force: %d, %d", percent, limit)
	}
	if p := debug.SetGCPercent(100); p != 321 {
		t.Fatalf("runtime percent %d", p)
	}
	if percent, _ := (gcSettings{}).apply(); percent != 100 {
		t.Fatalf("an empty plan changed the percent to %d", percent)
	}
}

// TestGCPercentFlagErrors: a bad --gc-percent or IDEM_GC_PERCENT stops the
// start, naming the flag.
func TestGCPercentFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--gc-percent", "-5"}, nil, "--gc-percent: -5 is not a percent above 0"},
		{nil, map[string]string{"IDEM_GC_PERCENT": "-1"}, "--gc-percent (from IDEM_GC_PERCENT): -1 is not a percent"},
		{nil, map[string]string{"IDEM_GC_PERCENT": "lots"}, "IDEM_GC_PERCENT (flag --gc-percent)"},
	} {
		_, err := ParseConfig(tc.args, env(tc.env), &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want %q", tc.args, tc.env, err, tc.want)
		}
	}
	var usage strings.Builder
	if _, err := ParseConfig([]string{"--gc-percent", "x"}, env(nil), &usage); err == nil || !strings.Contains(usage.String(), "-gc-percent") {
		t.Errorf("--gc-percent x: error %v, usage %q", err, usage.String())
	}
	cfg, err := ParseConfig([]string{"--gc-percent", "250"}, env(nil), &strings.Builder{})
	if err != nil || cfg.GCPercent != 250 {
		t.Fatalf("--gc-percent 250: %+v, %v", cfg.GCPercent, err)
	}
}

// TestPacedPercent: bodies get bodyHeadroomPercent of headroom, the rest
// of the heap the daemon's percent; nothing held, no change. While bodies
// that came in small messages are held, the whole heap gets smallHeadroom,
// whatever their size.
func TestPacedPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		percent                 int
		live, held, small, want int64
	}{
		{400, 100, 0, 0, 400},
		{400, 100, 50, 0, 225},                 // 50 × 5 + 50 × 1.5 = 325: +225 %
		{400, 100, 100, 0, 50},                 // all bodies
		{400, 100, 500, 0, 50},                 // held bodies already garbage count no more than live
		{100, 100, 50, 0, 75},                  // 50 × 2 + 50 × 1.5 = 175
		{25, 100, 100, 0, 25},                  // never more headroom than the daemon's own
		{-1, 100, 100, 0, -1},                  // collection off stays off
		{400, 0, 100, 0, 400},                  // no collection yet
		{1, 1000, 999, 0, 1},                   // never 0, which collects at every allocation
		{400, 40 * mib, 1 * mib, 1 * mib, 2},   // a small-message body: 1 MiB of headroom in 40
		{400, 40 * mib, 8 * mib, 8 * mib, 2},   // 1 MiB whatever its size
		{400, 40 * mib, 4 * mib, 64 << 10, 2},  // or the share of it that came small
		{10, 40 * mib, 40 * mib, 40 * mib, 2},  // 1 MiB in 40, though the percent's own is more
		{1, 40 * mib, 40 * mib, 40 * mib, 1},   // never more than the percent's own
		{400, 1 * mib, 64 << 10, 64 << 10, 50}, // 2 MiB: 100 % would make the runtime's minimum heap 4 MiB
		{400, mib / 2, 64 << 10, 64 << 10, 37}, // 1.5 MiB
		{50, 40 * mib, 0, 1 * mib, 50},         // nothing held: the daemon's percent
	} {
		if got := pacedPercent(c.percent, c.live, c.held, c.small); int64(got) != c.want {
			t.Errorf("pacedPercent(%d, live %d, held %d, small %d) = %d, want %d", c.percent, c.live, c.held, c.small, got, c.want)
		}
	}
}

// TestBodyPacerFollowsCollections: after a collection that finds most of
// the heap held as bodies, the percent in force is the paced one; stop
// puts the daemon's back.
func TestBodyPacerFollowsCollections(t *testing.T) {
	old := debug.SetGCPercent(400)
	defer debug.SetGCPercent(old)
	body := make([]byte, 64<<20)
	p := startBodyPacer(400)
	p.track(func() (all, small int64) { return int64(len(body)), 0 })
	gogc := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	for deadline := time.Now().Add(time.Minute); ; {
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // the cleanup runs on its own goroutine
		if metrics.Read(gogc); gogc[0].Value.Uint64() < 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the percent stayed %d with 64 MiB of the heap held as bodies", gogc[0].Value.Uint64())
		}
	}
	runtime.KeepAlive(body)
	p.stop()
	if metrics.Read(gogc); gogc[0].Value.Uint64() != 400 {
		t.Errorf("after stop the percent is %d, want 400", gogc[0].Value.Uint64())
	}
}

// TestBodyPacerPacesBetweenCollections: pace, as called when a body comes
// to count as small, sets the paced percent at once, with no collection
// between (a collection in between would pace too, so the test retries
// until none came).
func TestBodyPacerPacesBetweenCollections(t *testing.T) {
	old := debug.SetGCPercent(400)
	defer debug.SetGCPercent(old)
	var small atomic.Int64
	p := startBodyPacer(400)
	p.track(func() (int64, int64) { return small.Load(), small.Load() })
	defer p.stop()
	samples := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/cycles/total:gc-cycles"}}
	for range 100 {
		small.Store(0)
		runtime.GC()                      // with no body held the percent goes back to 400
		time.Sleep(10 * time.Millisecond) // the cleanup runs on its own goroutine
		if metrics.Read(samples); samples[0].Value.Uint64() != 400 {
			continue
		}
		cycles := samples[1].Value.Uint64()
		small.Store(64)
		p.pace()
		metrics.Read(samples)
		if samples[1].Value.Uint64() != cycles {
			continue // a collection paced it; try again
		}
		if got := samples[0].Value.Uint64(); got >= 400 {
			t.Fatalf("after pace with a small body held the percent is %d, want below 400", got)
		}
		return
	}
	t.Fatal("in every try the percent was not back at 400, or a collection came between")
}

// pacerChildEnv marks the process TestBodyPacerPacesTheFirstBody starts.
const pacerChildEnv = "IDEM_EXTPROC_PACER_CHILD"

// TestBodyPacerPacesTheFirstBody: in a process the runtime has not yet
// collected in, as the daemon's is when it starts the pacer, the first
// body that comes in small messages is paced at once. Without a collection
// of its own the pacer would read a live heap of 0 and leave the percent
// alone, and the heap would grow to the runtime's minimum goal (16 MiB at
// 400) before anything was paced. The process is this test binary run
// again with the collector off until the test sets the percent, so that
// nothing collected before.
func TestBodyPacerPacesTheFirstBody(t *testing.T) {
	if os.Getenv(pacerChildEnv) != "" {
		cycles := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
		if metrics.Read(cycles); cycles[0].Value.Uint64() != 0 {
			fmt.Printf("%d collections before the test\n", cycles[0].Value.Uint64())
			os.Exit(3)
		}
		debug.SetGCPercent(400)
		p := startBodyPacer(400)
		p.track(func() (int64, int64) { return 64, 64 })
		p.pace()
		fmt.Printf("percent %d\n", debug.SetGCPercent(-1))
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBodyPacerPacesTheFirstBody$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOGC=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, pacerChildEnv+"=1", "GOGC=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child process: %v\n%s", err, out)
	}
	var percent int
	if _, err := fmt.Sscanf(string(out), "percent %d", &percent); err != nil {
		t.Fatalf("the child printed %q: %v", out, err)
	}
	if percent >= 400 {
		t.Errorf("the first small body left the percent at %d, want it paced below 400", percent)
	}
}

// TestStartPacesSmallBodies: the server start builds is wired to the
// pacer it is given, so that a body that comes in 1-byte chunks (as
// Envoy's STREAMED mode passes a trickled upload on) is paced while it is
// held: the pacer reads a held small body. The pacer is given the server's
// body bytes before it serves (track), and the server calls pace as the
// body turns small (extproc.Config.OnSmallBody).
func TestStartPacesSmallBodies(t *testing.T) {
	old := debug.SetGCPercent(400)
	defer debug.SetGCPercent(old)
	cfg, err := ParseConfig([]string{"--listen", "127.0.0.1:0", "--admin-listen", ""}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	pacer := startBodyPacer(400)
	defer pacer.stop()
	d, err := start(cfg, slog.New(slog.DiscardHandler), func(string) string { return "" }, pacer)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown()
	var sawSmall atomic.Bool
	pacer.track(func() (all, small int64) {
		all, small = d.ext.BufferedBytes()
		if small > 0 {
			sawSmall.Store(true)
		}
		return all, small
	})
	filter := envoysim.RecommendedConfig()
	filter.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
	filter.AllowModeOverride = false // else the server asks for it BUFFERED, one message (extproc, render.go)
	env := harness.Start(t, harness.Options{ServerAddr: d.Addr(), Store: harness.Memory(memstore.Options{}),
		Filter: filter, FilterOptions: envoysim.Options{ChunkSize: 1}})
	if r := env.Post("/orders", "trickled", `{"note":"`+strings.Repeat("x", 200)+`"}`); r.Status != 201 {
		t.Fatalf("the trickled request: %d %s", r.Status, r.Body)
	}
	if !sawSmall.Load() {
		t.Fatal("the pacer never read a small body held, though one came in 1-byte chunks")
	}
}

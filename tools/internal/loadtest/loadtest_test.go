package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
)

// TestMain lets the test binary stand in for idem-loadtest: the tool starts
// its servers by running its own executable with a serve-* argument.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && selfCommand(os.Args[1]) {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestSmoke runs every scenario against every server for a moment: each
// server answers every request without error, the report prints its
// targets and memory sections. The figures themselves are not judged here
// (docs/performance.md has the command that measures them).
func TestSmoke(t *testing.T) {
	var out, progress bytes.Buffer
	code := Main(context.Background(), []string{
		"-duration=300ms", "-reps=1", "-slices=1", "-warmup=0", "-initial-warmup=100ms",
		"-concurrency=4", "-keys=20", "-memory-records=50", "-work-dir=" + t.TempDir(),
		"-servers=noop,floor,minimal,lean,idem-extproc",
		// A request is judged by its answer, not its speed: a loaded
		// machine can stall a Redis call past the product's 100 ms.
		"-store-timeout=5s", "-message-timeout=10s",
	}, &out, &progress)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, progress.String(), out.String())
	}
	report := out.String()
	for _, want := range []string{"== first-write", "== replay", "== unprotected", "== targets", "completed: MEMORY USAGE",
		"idem-extproc / minimal: throughput", "idem-extproc / lean: throughput", "protected first write: throughput", "x minimal"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if rows := medianErrors(t, report); rows < 15 {
		t.Errorf("%d median rows, want one per scenario and server\n%s", rows, report)
	}
	if t.Failed() {
		t.Log(report)
	}
}

// medianErrors checks that every median row of report shows no errors and
// returns how many there were.
func medianErrors(t *testing.T, report string) int {
	t.Helper()
	rows := 0
	for _, line := range strings.Split(report, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "median" {
			continue
		}
		rows++
		if errs := f[len(f)-1]; errs != "0" {
			t.Errorf("%s: %s errors", strings.Join(f[:2], " "), errs)
		}
	}
	return rows
}

// TestParseFlags covers the flags that name what a run measures: several
// idem-extproc builds, several concurrencies, and the Redis topologies.
func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		servers []string
		kinds   map[string]string
		bins    map[string]string
		concs   []int
		topos   []string
		err     string
	}{
		{name: "defaults", args: nil,
			servers: []string{"noop", "floor", "idem-extproc"}, bins: map[string]string{"idem-extproc": ""},
			concs: []int{32}, topos: []string{"standalone"}},
		{name: "one bare binary", args: []string{"-server-bin", "/tmp/x", "-servers", "floor,idem-extproc"},
			servers: []string{"floor", "idem-extproc"}, bins: map[string]string{"idem-extproc": "/tmp/x"}},
		{name: "two labelled, comma-separated, in the place of idem-extproc",
			args:    []string{"-server-bin", "base=/tmp/a, new=/tmp/b", "-servers", "noop,idem-extproc,floor"},
			servers: []string{"noop", "base", "new", "floor"},
			kinds:   map[string]string{"noop": "noop", "base": "idem-extproc", "new": "idem-extproc", "floor": "floor"},
			bins:    map[string]string{"base": "/tmp/a", "new": "/tmp/b"}},
		{name: "two labelled, the flag repeated", args: []string{"-server-bin", "base=/tmp/a", "-server-bin", "new=/tmp/b"},
			servers: []string{"noop", "floor", "base", "new"}, bins: map[string]string{"base": "/tmp/a", "new": "/tmp/b"}},
		{name: "concurrencies and topologies", args: []string{"-concurrency", "8, 32,128,256,32", "-redis", "standalone,cluster"},
			concs: []int{8, 32, 128, 256}, topos: []string{"standalone", "cluster"}},
		{name: "a bare binary among several", args: []string{"-server-bin", "/tmp/a,new=/tmp/b"}, err: "label=path"},
		{name: "a label twice", args: []string{"-server-bin", "a=/tmp/a", "-server-bin", "a=/tmp/b"}, err: `label "a" twice`},
		{name: "a label that is another server", args: []string{"-server-bin", "floor=/tmp/a,b=/tmp/b"}, err: `label "floor"`},
		{name: "a label that is the minimal server", args: []string{"-server-bin", "minimal=/tmp/a,b=/tmp/b"}, err: `label "minimal"`},
		{name: "the minimal server among the others", args: []string{"-servers", "minimal,floor,idem-extproc"},
			servers: []string{"minimal", "floor", "idem-extproc"}, kinds: map[string]string{"minimal": "minimal", "floor": "floor"}},
		{name: "a label that is the lean server", args: []string{"-server-bin", "lean=/tmp/a,b=/tmp/b"}, err: `label "lean"`},
		{name: "the lean server among the others", args: []string{"-servers", "floor,lean,idem-extproc"},
			servers: []string{"floor", "lean", "idem-extproc"}, kinds: map[string]string{"lean": "lean", "floor": "floor"}},
		{name: "an unknown server", args: []string{"-servers", "noop,bare"}, err: `--servers: unknown "bare"`},
		{name: "no path", args: []string{"-server-bin", "a="}, err: "want label=path"},
		{name: "zero streams", args: []string{"-concurrency", "1,0"}, err: "--concurrency"},
		{name: "not a number", args: []string{"-concurrency", "four"}, err: "--concurrency"},
		{name: "unknown topology", args: []string{"-redis", "sentinel"}, err: `"sentinel" is not standalone or cluster`},
		{name: "an answer of an unknown class", args: []string{"-response-from", "invoice"}, err: `--response-from: unknown "invoice"`},
		{name: "a cluster with --redis-url", args: []string{"-redis", "cluster", "-redis-url", "redis://127.0.0.1:1/0"}, err: "--redis-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cfg, err := parseFlags(tc.args, &stderr)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.servers != nil && !slices.Equal(cfg.servers, tc.servers) {
				t.Errorf("servers %q, want %q", cfg.servers, tc.servers)
			}
			for name, kind := range tc.kinds {
				if cfg.kinds[name] != kind {
					t.Errorf("%s is a %q, want %q", name, cfg.kinds[name], kind)
				}
			}
			for label, bin := range tc.bins {
				if got := cfg.binOf(label); got != bin || !slices.Contains(cfg.idemServers(), label) {
					t.Errorf("build %s: binary %q (idem-extproc servers %q), want %q", label, got, cfg.idemServers(), bin)
				}
			}
			if tc.concs != nil && !slices.Equal(cfg.concurrencies, tc.concs) {
				t.Errorf("concurrencies %v, want %v", cfg.concurrencies, tc.concs)
			}
			if tc.topos != nil && !slices.Equal(cfg.topologies, tc.topos) {
				t.Errorf("topologies %q, want %q", cfg.topologies, tc.topos)
			}
		})
	}
}

// TestResponseFrom: --response-from makes the upstream answer every write
// with one answer of the corpus class, the same bytes each time (a replay
// is checked against them), and the report says so.
func TestResponseFrom(t *testing.T) {
	var stderr bytes.Buffer
	plain, err := parseFlags([]string{"-response-from", "filler", "-response-body", "300"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if b := plain.responseBody(); len(b) != 300 || !json.Valid(b) {
		t.Errorf("filler answer: %d bytes (valid JSON %v), want a JSON object of 300", len(b), json.Valid(b))
	}
	cfg, err := parseFlags(nil, &stderr) // an object answer of the corpus unless told otherwise
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.responseBody()
	if !json.Valid(b) || !bytes.Contains(b, []byte(`"amount"`)) || len(b) < 512 {
		t.Errorf("object answer %q: want a payment-intent-like JSON object of the corpus", b)
	}
	if !bytes.Equal(b, cfg.responseBody()) {
		t.Error("two calls gave two answers: a replay could not be checked against the first")
	}
	if d := describe(cfg, scenarioFirstWrite); !strings.Contains(d, "JSON object of the generated corpus") {
		t.Errorf("report says %q, want it to name the corpus answer", d)
	}
}

// TestBuildsStreamsAndCluster runs two idem-extproc binaries (this test
// binary's serve-idem behind two scripts) with the floor and the no-op at
// two concurrencies on a standalone Redis and then on a 3-primary Redis
// Cluster the tool starts: every server answers every request right on
// both (on the cluster that needs the floor's and the daemon's cluster
// clients: a plain client would get MOVED), the report compares the second
// build with the first, and prints the latency and scale sections with
// Redis CPU read on the cluster too. No figure is judged.
func TestBuildsStreamsAndCluster(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var bins []string
	for _, label := range []string{"a", "b"} {
		script := filepath.Join(dir, label+".sh")
		if err := os.WriteFile(script, []byte("#!/bin/sh\nexec '"+self+"' serve-idem -- \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		bins = append(bins, label+"="+script)
	}
	var out, progress bytes.Buffer
	code := Main(context.Background(), []string{
		"-server-bin=" + strings.Join(bins, ","), "-servers=noop,floor,idem-extproc",
		"-scenario=first-write,replay", "-concurrency=1,3", "-redis=standalone,cluster",
		"-duration=100ms", "-reps=1", "-slices=1", "-warmup=0", "-initial-warmup=50ms",
		"-keys=10", "-skip-memory", "-work-dir=" + filepath.Join(dir, "work"),
		"-store-timeout=5s", "-message-timeout=10s",
	}, &out, &progress)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, progress.String(), out.String())
	}
	report := out.String()
	for _, want := range []string{
		"#### standalone Redis, 1 concurrent streams", "#### cluster Redis, 3 concurrent streams",
		"b / a: throughput", "b / floor: throughput", "a / noop: throughput",
		"== latency a user feels", "target at 1 stream, b:",
		"== scale", "== targets (set at",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// 2 topologies x 2 concurrencies x (first write: 4 servers, replay: 4
	// and the floor's first write as its reference).
	if rows := medianErrors(t, report); rows != 2*2*(4+5) {
		t.Errorf("%d median rows, want %d", rows, 2*2*(4+5))
	}
	// The scale table's rows for the floor on the cluster carry Redis CPU,
	// read from the cluster's nodes ("-" when it could not be read). Its
	// value and its ratio to the standalone Redis's are not judged: a
	// slice this short may see no 10 ms clock tick of Redis CPU at all.
	var clusterRows int
	for _, line := range strings.Split(report, "\n") {
		f := strings.Fields(line)
		if len(f) == 11 && f[1] == "floor" && f[2] == "cluster" {
			clusterRows++
			if _, err := strconv.ParseFloat(f[8], 64); err != nil {
				t.Errorf("scale row without Redis CPU: %s", line)
			}
		}
	}
	if clusterRows != 4 {
		t.Errorf("%d scale rows of the floor on the cluster, want 4", clusterRows)
	}
	if t.Failed() {
		t.Log(report)
	}
}

// fakeRun is a measured run with the given whole-request p50 and p99.
func fakeRun(rep, conc int, topo, srv string, p50, p99 time.Duration, cpu, redisCPU time.Duration) *runResult {
	return &runResult{rep: rep, scenario: scenarioFirstWrite, server: srv, concurrency: conc, topology: topo,
		elapsed: time.Second, n: 1000, total: dist{n: 1000, p50: p50, p99: p99}, cpu: cpu, redisCPU: redisCPU,
		haveRedisCPU: true, phases: map[envoysim.Phase]dist{}}
}

// TestLatencyAndScaleSections checks the arithmetic of the latency and
// scale sections on made-up runs: the added p50 is the median of each
// repetition's own difference, the 1-stream target's verdict follows its
// bounds, and Redis CPU on the cluster is compared with the standalone
// Redis's at the same concurrency.
func TestLatencyAndScaleSections(t *testing.T) {
	var out bytes.Buffer
	cfg := &config{scenarios: []string{scenarioFirstWrite}, servers: []string{"noop", "floor", "new"},
		kinds:         map[string]string{"noop": serverNoop, "floor": serverFloor, "new": serverIdem},
		concurrencies: []int{1, 4}, topologies: []string{topologyStandalone, topologyCluster}, reps: 3, out: &out}
	us := time.Microsecond
	var results []*runResult
	for _, topo := range cfg.topologies {
		redis := 100 * us
		if topo == topologyCluster {
			redis = 150 * us
		}
		for _, conc := range cfg.concurrencies {
			// Repetition 2 is slower for every server alike: the
			// differences stay 80, 120, 90 µs over the floor at 1 stream.
			for rep, slow := range []time.Duration{0, 400 * us, 0} {
				add := []time.Duration{80 * us, 120 * us, 90 * us}[rep]
				results = append(results,
					fakeRun(rep+1, conc, topo, "noop", 500*us+slow, 2000*us, 100*us*1000, 0),
					fakeRun(rep+1, conc, topo, "floor", 900*us+slow, 4000*us, 150*us*1000, redis*1000),
					fakeRun(rep+1, conc, topo, "new", 900*us+slow+add, 4100*us, 200*us*1000, redis*1000))
			}
		}
	}
	printLatency(cfg, results)
	printScale(cfg, results)
	report := out.String()
	for _, want := range []string{
		"new, standalone Redis, 1 streams, each rep: +p50 over floor [80 120 90] µs, +p99 over floor [100 100 100] µs, p99 / floor [1.02 1.02 1.02]",
		"target at 1 stream, new: added p50 over the floor 90 µs (<= 100: met); p99 1.02 x the floor's (<= 1.05: met)",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// The scale row of new on the cluster at 4 streams: server CPU 200
	// against the no-op's 100, Redis CPU 150 against the standalone's 100.
	want := "first-write new cluster 4 1000 4100 200.0 2.00 150.0 1.50 0"
	found := false
	for _, line := range strings.Split(report, "\n") {
		found = found || strings.Join(strings.Fields(line), " ") == want
	}
	if !found {
		t.Errorf("scale section lacks the row %q", want)
	}
	if t.Failed() {
		t.Log(report)
	}
}

// flakyFirstTry is a no-op server that fails every stream but those of
// a key prepare tried a second time (the "-1" suffix), or every stream
// with failAll.
type flakyFirstTry struct {
	noopServer
	failAll bool
}

func (f flakyFirstTry) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	req, err := stream.Recv()
	if err != nil {
		return nil
	}
	key := string(rawHeader(req.GetRequestHeaders().GetHeaders(), "idempotency-key"))
	// prepare's keys are p<time>-<run>-<i>, its retries <key>-<attempt>.
	if f.failAll || strings.Count(key, "-") != 3 || !strings.HasSuffix(key, "-1") {
		return status.Error(codes.Unavailable, "flaky: first try of "+key)
	}
	if err := stream.Send(continueReply(req, nil)); err != nil {
		return err
	}
	return noopServer{}.Process(stream)
}

// TestPrepareReplacesAFailedKey: a key whose first write fails is replaced
// by a fresh one, and prepare gives up only after prepareAttempts failures
// in a row, saying so.
func TestPrepareReplacesAFailedKey(t *testing.T) {
	for _, failAll := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		addr, err := freeAddr()
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- serveGRPC(ctx, addr, flakyFirstTry{failAll: failAll}, daemonGRPC) }()
		if err := (&server{name: "flaky", exited: make(chan error, 1)}).waitUntil(tcpReady(addr)); err != nil {
			t.Fatal(err)
		}
		wl := newWorkload(scenarioReplay, 16, jsonBody(16, "id"))
		wl.messageTimeout = 10 * time.Second
		d, err := newDriver(addr, 1, 2, serverNoop, wl)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := d.prepare(ctx, 5)
		d.close()
		cancel()
		if err := <-served; err != nil {
			t.Fatal(err)
		}
		if failAll {
			if err == nil || !strings.Contains(err.Error(), "3 keys in a row") {
				t.Errorf("every write failing: error %v, want one after 3 keys in a row", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("second tries succeeding: %v", err)
		}
		if len(keys) != 5 {
			t.Fatalf("%d keys, want 5", len(keys))
		}
		for _, k := range keys {
			if strings.Count(k, "-") != 3 || !strings.HasSuffix(k, "-1") {
				t.Errorf("key %q: not the retry that succeeded", k)
			}
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/norace"
	"github.com/idem-extproc/idem-extproc/internal/testing/ports"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
	"github.com/idem-extproc/idem-extproc/test/grpcxds"
)

// These tests run the built binary, started with the documented flags, the
// way the conformance run and an operator do.

// versionVar is the variable a release build stamps; testVersion is what
// the tests stamp into it.
const (
	versionVar  = "github.com/idem-extproc/idem-extproc/internal/version.version"
	testVersion = "v0.0.0-test.1"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idem-extproc-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "idem-extproc")
		// Stamped and tagged as a release build is (Dockerfile,
		// CHANGELOG.md), so that TestBinaryVersion sees the stamp arrive
		// and TestBinaryLinksOnlyWhatItCalls sees what the tag leaves out.
		out, err := exec.Command("go", append(buildArgs(), "-ldflags", "-X "+versionVar+"="+testVersion, "-o", binPath, ".")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// buildArgs are the go command's arguments that build the binary the
// tests run: the release build's flags (-trimpath -tags grpcnotrace,
// Dockerfile), and the race detector when this test binary has it, as
// under README.md's test command. So the build links what the suite
// compiled instead of compiling the whole dependency graph once more
// without the detector, and a race in a server that start runs fails the
// test. Whether methods survive the linker's dead-code elimination
// (TestBinaryLinksOnlyWhatItCalls) does not depend on the detector: its
// test is whether a reachable call needs them
// (cmd/link/internal/ld/deadcode.go).
func buildArgs() []string {
	return []string{"build", "-race=" + strconv.FormatBool(norace.RaceBuilt()), "-trimpath", "-tags", "grpcnotrace"}
}

// TestMain runs the tests with grpc-go's ext_proc client filter enabled,
// which TestBinaryBehindProxylessGRPC needs and grpc-go reads only from the
// environment at process start.
//
// A binary built with the race detector sleeps a second before it exits
// ("atexit_sleep_ms (default 1000)", https://go.dev/doc/articles/race_detector#Options);
// the binaries these tests start (buildArgs) exit at once instead, which
// halves this package's time: most of its runs last well under a second.
func TestMain(m *testing.M) {
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	code := grpcxds.EnableExtProcAndRun(m)
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

type process struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr *harness.LogBuffer
	listen string
	admin  string
	// done is closed when the process has exited and its output is
	// all in stderr; exitErr is then cmd.Wait's error.
	done    chan struct{}
	exitErr error
}

// start runs the binary on the given addresses with extra flags and waits
// until /healthz answers. Empty addresses are picked and held here (see
// startEnv). The binary gets the harness's generous store budget
// (harness.TestStoreTimeout) through IDEM_STORE_TIMEOUT, so that a loaded
// machine's slow Redis does not fail tests about something else; a test
// about the budget passes its own, in env or as --store-timeout, which
// wins over the environment.
func start(t *testing.T, listen, admin string, extra ...string) *process {
	t.Helper()
	return startEnv(t, nil, listen, admin, extra...)
}

// startEnv is start with env added to the test's environment. Addresses
// picked here are held for the whole test (ports.Hold), so that no other
// process takes one before the binary binds it.
func startEnv(t *testing.T, env []string, listen, admin string, extra ...string) *process {
	t.Helper()
	if listen == "" && admin == "" {
		listen, admin = ports.Hold(t), ports.Hold(t)
	}
	p, exitErr := launch(t, env, listen, admin, extra...)
	if exitErr != nil {
		t.Fatalf("server exited at start (%v):\n%s", exitErr, p.stderr.String())
	}
	return p
}

// launch starts the binary and waits until /healthz answers; it returns
// the exit error if the binary exits first.
func launch(t *testing.T, env []string, listen, admin string, extra ...string) (*process, error) {
	t.Helper()
	args := append([]string{"--listen", listen, "--admin-listen", admin}, extra...)
	p := &process{t: t, stderr: &harness.LogBuffer{}, listen: listen, admin: admin, done: make(chan struct{})}
	p.cmd = exec.Command(binary(t), args...)
	p.cmd.Stderr = p.stderr
	// Of duplicate keys in Env the last is used (os/exec, Cmd.Env).
	p.cmd.Env = append(append(os.Environ(), "IDEM_STORE_TIMEOUT="+harness.TestStoreTimeout.String()), env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		// The detector reports each race on standard error as it finds
		// it (runtime/race/output_test.go, "WARNING: DATA RACE").
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("the server reported a data race")
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", p.stderr.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for p.get("/healthz") != http.StatusOK {
		select {
		case <-p.done:
			err := p.exitErr
			if err == nil {
				err = errors.New("exit status 0")
			}
			return p, err
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not healthy within 10s:\n%s", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p, nil
}

func (p *process) get(path string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.admin + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (p *process) wait(timeout time.Duration) (int, bool) {
	select {
	case <-p.done:
		if ee, ok := p.exitErr.(*exec.ExitError); ok {
			return ee.ExitCode(), true
		}
		return 0, true
	case <-time.After(timeout):
		return -1, false
	}
}

func recordState(t *testing.T, env *harness.Env, key string) idem.State {
	t.Helper()
	rec, err := env.Store.Get(context.Background(), idem.RecordIDFor("default", strings.TrimPrefix(env.URL, "http://"), key))
	if err != nil {
		return 0
	}
	return rec.State
}

// TestBinaryWithRedis starts the binary with exactly --listen,
// --admin-listen and --redis-url and plays Envoy's side against it.
func TestBinaryWithRedis(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	p := start(t, "", "", "--redis-url", redis.URL())
	if code := p.get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d with Redis up", code)
	}
	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.OnRedis(redis)})

	first := env.Post("/orders", "bin-1", `{"a":1}`)
	if first.Status != http.StatusCreated {
		t.Fatalf("first = %d %s", first.Status, first.Body)
	}
	replay := env.Post("/orders", "bin-1", `{"a":1}`)
	if replay.Status != http.StatusCreated || replay.Body != first.Body || replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay = %d %s %v", replay.Status, replay.Body, replay.Header)
	}
	if r := env.Post("/orders", "bin-1", `{"a":2}`); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("mismatch = %d %s", r.Status, r.Body)
	}
	if r := env.Post("/orders", `"`, `{}`); r.Status != http.StatusBadRequest {
		t.Fatalf("malformed key = %d %s", r.Status, r.Body)
	}
	if r := env.Do(http.MethodGet, "/orders", "", 0, "Idempotency-Key", "bin-1"); r.Status != http.StatusOK {
		t.Fatalf("GET = %d", r.Status)
	}
	if n := env.Upstream.CountKey("bin-1"); n != 2 { // the POST and the GET
		t.Fatalf("effects = %d, want 2", n)
	}

	redis.Kill()
	testwait.Until(t, "/readyz fails without Redis", func() bool { return p.get("/readyz") == http.StatusServiceUnavailable })
	if code := p.get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d: the process is alive", code)
	}
	if r := env.Post("/orders", "bin-2", `{}`); r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("with Redis down = %d %v %s", r.Status, r.Header, r.Body)
	}
	redis.Restart()
	testwait.Until(t, "/readyz recovers", func() bool { return p.get("/readyz") == http.StatusOK })
	if r := env.Post("/orders", "bin-2", `{}`); r.Status != http.StatusCreated {
		t.Fatalf("after Redis came back = %d %s", r.Status, r.Body)
	}
	// Through the outage, every line the process wrote is a JSON log
	// record: go-redis's own messages included (they go to the log at
	// debug level, not as free-form lines on stderr).
	for _, line := range strings.Split(strings.TrimSpace(p.stderr.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Fatalf("stderr has a line that is not a JSON log record: %q", line)
		}
	}
}

// TestBinaryBehindProxylessGRPC starts the binary with exactly --listen,
// --admin-listen and --redis-url and puts it behind grpc-go's own ext_proc
// filter, configured over xDS with grpcxds.FilterConfig: what the
// in-process tests of test/grpcxds show, the process an operator
// deploys does too, wiring (flags, store, server options) included.
func TestBinaryBehindProxylessGRPC(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	p := start(t, "", "", "--redis-url", redis.URL())
	env := grpcxds.Start(t, grpcxds.Options{ServerAddr: p.listen, Redis: redis})

	steps := []struct {
		name    string
		payload string
		code    codes.Code
		// text is the response payload when code is OK, else the start of
		// the status message.
		text string
	}{
		{"first call executes", "book", codes.OK, "order-1"},
		{"retry is replayed", "book", codes.AlreadyExists, "idempotent-replay: operation already completed with status OK"},
		{"other payload is refused", "ten books", codes.FailedPrecondition, "idempotency-key-reused:"},
	}
	callsAfterFirst := 0
	for i, s := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", "bin-grpc-1")
		// WaitForReady: the first call waits for the xDS configuration
		// rather than failing while the client is still receiving it.
		resp, err := env.Client.UnaryCall(ctx,
			&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(s.payload)}}, grpc.WaitForReady(true))
		cancel()
		st := status.Convert(err)
		switch {
		case st.Code() != s.code:
			t.Fatalf("%s: status %v %q, want %v", s.name, st.Code(), st.Message(), s.code)
		case s.code == codes.OK && string(resp.GetPayload().GetBody()) != s.text:
			t.Fatalf("%s: payload %q, want %q", s.name, resp.GetPayload().GetBody(), s.text)
		case s.code != codes.OK && !strings.HasPrefix(st.Message(), s.text):
			t.Fatalf("%s: message %q, want it to start with %q", s.name, st.Message(), s.text)
		}
		if i == 0 {
			callsAfterFirst = env.Upstream.Calls()
		}
	}
	if n := env.Upstream.CountKey("bin-grpc-1"); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
	if n := env.Upstream.Calls(); n != callsAfterFirst {
		t.Fatalf("a refused call reached the upstream (%d calls, want %d)", n, callsAfterFirst)
	}
	// The record is in the Redis the binary was given: the binary, not some
	// other server, answered.
	keys, err := redis.Client().Keys(context.Background(), "idem:{[0-9a-f]*").Result() // records, not the safety marker
	if err != nil || len(keys) != 1 {
		t.Fatalf("records in Redis: %v, %v; want one", keys, err)
	}
}

// TestBinaryDefaultsToMemory: with no --redis-url the binary runs on the
// in-memory store and says it is for one replica only.
func TestBinaryDefaultsToMemory(t *testing.T) {
	p := start(t, "", "")
	// Log lines are written by a background writer: the warning may follow
	// the health answer that ended start.
	testwait.Until(t, "the single-replica warning", func() bool { return strings.Contains(p.stderr.String(), "one replica") })
	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.Memory(memstore.Options{})})
	first := env.Post("/orders", "mem-1", `{}`)
	again := env.Post("/orders", "mem-1", `{}`)
	if first.Status != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || env.Upstream.CountKey("mem-1") != 1 {
		t.Fatalf("first %d, again %d %v, effects %d", first.Status, again.Status, again.Header, env.Upstream.CountKey("mem-1"))
	}
}

// TestBinaryLogFormats: --log-format text gives logfmt lines carrying the
// same decision fields as the JSON default, so an operator may pick either.
func TestBinaryLogFormats(t *testing.T) {
	for _, tc := range []struct{ format, decision, hash string }{
		{"json", `"decision":"reserved"`, `"key_hash":"`},
		{"text", "decision=reserved", "key_hash="},
	} {
		t.Run(tc.format, func(t *testing.T) {
			p := start(t, "", "", "--log-format", tc.format)
			env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.Memory(memstore.Options{})})
			env.Post("/orders", "fmt-1", `{}`)
			testwait.Until(t, "a decision line", func() bool { return strings.Contains(p.stderr.String(), tc.decision) })
			if out := p.stderr.String(); !strings.Contains(out, tc.hash) || strings.Contains(out, "fmt-1") {
				t.Fatalf("%s logs lack the key hash or show the raw key:\n%s", tc.format, out)
			}
		})
	}
}

// TestBinaryMessageSizeLimit: an ext_proc message over --max-message-size
// is refused by gRPC itself, before any decision: Envoy fails closed (500),
// nothing reaches the upstream, no record is left behind, and the same key
// with a body that fits then runs normally.
func TestBinaryMessageSizeLimit(t *testing.T) {
	p := start(t, "", "", "--max-message-size", "1048576")
	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.Memory(memstore.Options{}), ExpectProcessingErrors: true,
		FilterOptions: envoysim.Options{BufferLimit: 4 << 20}})
	big := `{"pad":"` + strings.Repeat("x", 1536<<10) + `"}`
	if r := env.Post("/orders", "size-1", big); r.Status != http.StatusInternalServerError {
		t.Fatalf("a message over the limit answered %d %.200s, want Envoy's 500", r.Status, r.Body)
	}
	if n := env.Upstream.CountKey("size-1"); n != 0 {
		t.Fatalf("the refused request reached the upstream %d times", n)
	}
	if r := env.Post("/orders", "size-1", `{}`); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the same key with a small body: %d replayed=%q, want a first execution", r.Status, r.Header.Get("Idempotent-Replayed"))
	}
}

// TestBinaryExportsTracesOverOTLP: with OTEL_EXPORTER_OTLP_ENDPOINT set the
// binary sends its spans to that collector (OTLP over HTTP, the default
// protocol) under the service name idem-extproc, and flushes them when it
// shuts down. The collector here is an HTTP server decoding the OTLP
// protobuf, as a real collector's receiver does.
func TestBinaryExportsTracesOverOTLP(t *testing.T) {
	var mu sync.Mutex
	spans := map[string]bool{}
	var service string
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, rs := range req.GetResourceSpans() {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					spans[sp.GetName()] = true
				}
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(nil)
	}))
	t.Cleanup(collector.Close)
	p := startEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL}, "", "")
	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.Memory(memstore.Options{})})
	if r := env.Post("/orders", "traced-1", `{}`); r.Status != http.StatusCreated {
		t.Fatalf("status %d", r.Status)
	}
	testwait.Until(t, "the stream to end", func() bool { return strings.Contains(p.stderr.String(), `"outcome":"stored"`) })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, exited := p.wait(10 * time.Second); !exited || code != 0 {
		t.Fatalf("exit %d (exited %v)", code, exited)
	}
	mu.Lock()
	defer mu.Unlock()
	if service != "idem-extproc" || !spans["idem-extproc stream"] || !spans["store.reserve"] {
		t.Fatalf("the collector received service %q, spans %v", service, spans)
	}
}

// TestBinarySignalsDrain: SIGTERM while responses are in flight turns
// readiness false, lets every open stream finish and store its response,
// and exits 0.
func TestBinarySignalsDrain(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			redis := redistest.Start(t, redistest.Options{})
			p := start(t, "", "", "--redis-url", redis.URL())
			env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.OnRedis(redis)})
			const n = 5
			replies := make(chan harness.Reply, n)
			for i := range n {
				go func() {
					replies <- env.Post("/orders", fmt.Sprintf("drain-%d", i), `{}`, "x-upstream-delay", "700ms")
				}()
			}
			testwait.Until(t, "all reserved", func() bool {
				keys, _ := redis.Client().Keys(context.Background(), "idem:{[0-9a-f]*").Result() // records, not the safety marker
				return len(keys) == n
			})
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			testwait.Until(t, "/readyz turns false while draining", func() bool { return p.get("/readyz") == http.StatusServiceUnavailable })
			for range n {
				if r := <-replies; r.Status != http.StatusCreated {
					t.Fatalf("in-flight request answered %d %s", r.Status, r.Body)
				}
			}
			code, exited := p.wait(10 * time.Second)
			if !exited || code != 0 {
				t.Fatalf("exit code %d (exited %v):\n%s", code, exited, p.stderr.String())
			}
			for i := range n {
				if s := recordState(t, env, fmt.Sprintf("drain-%d", i)); s != idem.StateCompleted {
					t.Fatalf("record %d is %v after the drain, want completed", i, s)
				}
			}
		})
	}
}

// TestBinaryDrainIsBounded: a stream still open when --drain-timeout
// passes is cut and the process exits 0; the request it carried was let
// through, so its record is never released for a second execution: the
// retry is refused (409) and the upstream's effect happens once.
func TestBinaryDrainIsBounded(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	p := start(t, "", "", "--redis-url", redis.URL(), "--drain-timeout", "200ms")
	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.OnRedis(redis), ExpectProcessingErrors: true})
	done := make(chan harness.Reply, 1)
	go func() { done <- env.Post("/orders", "cut-1", `{}`, "x-upstream-delay", "5s") }()
	testwait.Until(t, "reserved", func() bool { return recordState(t, env, "cut-1") == idem.StateInFlight })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, exited := p.wait(10 * time.Second)
	if !exited || code != 0 {
		t.Fatalf("exit code %d (exited %v):\n%s", code, exited, p.stderr.String())
	}
	if env.Upstream.CountKey("cut-1") != 0 {
		t.Fatal("the process waited for the upstream: the drain was not cut at --drain-timeout")
	}
	if !strings.Contains(p.stderr.String(), "drain timeout passed") {
		t.Errorf("no log line says the drain was cut:\n%s", p.stderr.String())
	}
	if r := <-done; r.Status != http.StatusInternalServerError {
		t.Fatalf("with its stream cut Envoy fails closed, got %d %s", r.Status, r.Body)
	}
	testwait.Until(t, "the first attempt's effect", func() bool { return env.Upstream.CountKey("cut-1") == 1 })
	start(t, p.listen, p.admin, "--redis-url", redis.URL())
	if r := env.Post("/orders", "cut-1", `{}`); r.Status != http.StatusConflict {
		t.Fatalf("retry after the cut = %d %s, want 409 (outcome unknown)", r.Status, r.Body)
	}
	if n := env.Upstream.CountKey("cut-1"); n != 1 {
		t.Fatalf("effects %d, want exactly the first attempt's", n)
	}
}

// TestBinarySIGKILLKeepsTheReservation: a server killed between the
// reservation and the response leaves its record in Redis; the next server
// process refuses the retry while the lease stands.
func TestBinarySIGKILLKeepsTheReservation(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	listen, admin := ports.Hold(t), ports.Hold(t)
	p := start(t, listen, admin, "--redis-url", redis.URL())
	env := harness.Start(t, harness.Options{ServerAddr: listen, Store: harness.OnRedis(redis), ExpectProcessingErrors: true})
	done := make(chan harness.Reply, 1)
	go func() { done <- env.Post("/orders", "kill-1", `{}`, "x-upstream-delay", "2s") }()
	// Killed while the upstream runs the request: the key is reserved
	// before the reply that lets the request go on, so a kill between the
	// two would keep the reservation with nothing run (which a loaded
	// machine made this test see).
	testwait.Until(t, "reserved and running", func() bool {
		return recordState(t, env, "kill-1") == idem.StateInFlight && env.Upstream.ArrivedKey("kill-1") == 1
	})
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(5 * time.Second)
	if r := <-done; r.Status != http.StatusInternalServerError {
		t.Fatalf("with the server gone Envoy fails closed, got %d", r.Status)
	}
	start(t, listen, admin, "--redis-url", redis.URL())
	r := env.Post("/orders", "kill-1", `{}`)
	if r.Status != http.StatusConflict || !strings.Contains(r.Body, "request-in-progress") {
		t.Fatalf("retry = %d %s, want 409 request-in-progress", r.Status, r.Body)
	}
	if s := recordState(t, env, "kill-1"); s != idem.StateInFlight {
		t.Fatalf("record %v, want in_flight until its lease ends", s)
	}
	if n := env.Upstream.CountKey("kill-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// TestBinaryConfigErrors: a configuration mistake stops the binary at once
// with exit code 2 and names the field.
func TestBinaryConfigErrors(t *testing.T) {
	cmd := exec.Command(binary(t), "--redis-url", "localhost:6379")
	cmd.Env = append(os.Environ(), "IDEM_STORE_TIMEOUT=soon")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, output %s", err, out)
	}
	for _, want := range []string{"--redis-url", "IDEM_STORE_TIMEOUT"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("output does not name %s:\n%s", want, out)
		}
	}
}

// TestBinaryStartupErrorsNameTheFlag: a mistake the flag parser cannot see
// (a file that is missing or empty, a port out of range) still stops the
// start with exit 2 and a line naming the flag, rather than a server that
// runs and fails every admin call or every Redis call.
func TestBinaryStartupErrorsNameTheFlag(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	writeFile(t, empty, "\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--admin-token-file", filepath.Join(t.TempDir(), "missing")}, "--admin-token-file: stat"},
		{[]string{"--admin-token-file", empty}, "--admin-token-file: " + empty + " is empty"},
		{[]string{"--redis-url", "redis://localhost:99999999/0"}, `--redis-url: redis url: address "localhost:99999999": port`},
		{[]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}, "--config: stat"},
		{[]string{"--config", empty}, empty + ": the file is empty"},
		{[]string{"--encryption-keys-file", filepath.Join(t.TempDir(), "missing")}, "--encryption-keys-file: "},
		{[]string{"--tls-cert-file", empty, "--tls-key-file", empty}, "--tls-cert-file, --tls-key-file"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			args := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, tc.args...)
			// A server that starts despite the mistake would serve until
			// killed: end it rather than hang the suite (it then fails
			// below, killed instead of exit 2).
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, binary(t), args...).CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
				t.Fatalf("exit %v, want 2 and %q in:\n%s", err, tc.want, out)
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write then rename, as editors and Kubernetes do: the server never
	// reads a half-written file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const requireKeys = `
policies:
  - name: orders
    match: {methods: [POST], path: {prefix: /orders}}
    key: {required: %s}
`

// TestBinaryConfigReload: the policy file is reloaded on change and on
// SIGHUP without dropping an open stream; a broken file is rejected and
// the previous policies stay in force.
func TestBinaryConfigReload(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	path := filepath.Join(t.TempDir(), "policies.yaml")
	writeFile(t, path, fmt.Sprintf(requireKeys, "true"))
	p := start(t, "", "", "--redis-url", redis.URL(), "--config", path)
	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.OnRedis(redis)})

	if r := env.Post("/orders", "", `{}`); r.Status != http.StatusBadRequest || !strings.Contains(r.Body, "idempotency-key-missing") {
		t.Fatalf("keyless POST under required keys = %d %s", r.Status, r.Body)
	}
	// A request in flight across the reload keeps its policy and finishes.
	slow := make(chan harness.Reply, 1)
	go func() { slow <- env.Post("/orders", "across-reload", `{}`, "x-upstream-delay", "800ms") }()
	testwait.Until(t, "reserved", func() bool {
		keys, _ := redis.Client().Keys(context.Background(), "idem:{[0-9a-f]*").Result() // records, not the safety marker
		return len(keys) == 1
	})

	writeFile(t, path, fmt.Sprintf(requireKeys, "false"))
	testwait.Until(t, "file change reloaded", func() bool { return env.Post("/orders", "", `{}`).Status == http.StatusCreated })
	if r := <-slow; r.Status != http.StatusCreated {
		t.Fatalf("request across the reload = %d %s", r.Status, r.Body)
	}

	writeFile(t, path, "policies:\n  - name: orders\n    match: {methods: [POST]}\n    lease: soon\n")
	testwait.Until(t, "bad reload logged", func() bool { return strings.Contains(p.stderr.String(), "reload rejected") })
	if !strings.Contains(p.stderr.String(), "policies[0].lease") {
		t.Fatalf("the rejection does not name the field:\n%s", p.stderr.String())
	}
	if r := env.Post("/orders", "", `{}`); r.Status != http.StatusCreated {
		t.Fatalf("after a bad reload the old policy must stay: %d %s", r.Status, r.Body)
	}

	// SIGHUP reloads too (here after the file changed back to required).
	writeFile(t, path, fmt.Sprintf(requireKeys, "true"))
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "SIGHUP reloaded", func() bool { return env.Post("/orders", "", `{}`).Status == http.StatusBadRequest })
	if code := p.get("/healthz"); code != http.StatusOK {
		t.Fatal("SIGHUP must not stop the server")
	}

	// Emptied in place (`> policies.yaml`), by the watcher or on SIGHUP: rejected, and
	// keys stay required.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "empty file rejected", func() bool {
		return strings.Contains(p.stderr.String(), path+": the file is empty")
	})
	if r := env.Post("/orders", "", `{}`); r.Status != http.StatusBadRequest {
		t.Fatalf("after an emptied file the old policy must stay: %d %s", r.Status, r.Body)
	}
}

// TestBinaryCrashedReservationTurnsUnknown: a server killed between the
// reservation and the response leaves a record that nobody renews; once
// its lease ends it is unknown, never free.
func TestBinaryCrashedReservationTurnsUnknown(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	path := filepath.Join(t.TempDir(), "policies.yaml")
	writeFile(t, path, "defaults:\n  lease: 1s\n")
	listen, admin := ports.Hold(t), ports.Hold(t)
	p := start(t, listen, admin, "--redis-url", redis.URL(), "--config", path)
	env := harness.Start(t, harness.Options{ServerAddr: listen, Store: harness.OnRedis(redis), ExpectProcessingErrors: true})
	done := make(chan harness.Reply, 1)
	go func() { done <- env.Post("/orders", "crash-1", `{}`, "x-upstream-delay", "300ms") }()
	// Killed once the upstream has the request: its effect then follows.
	testwait.Until(t, "reserved and forwarded", func() bool {
		return recordState(t, env, "crash-1") == idem.StateInFlight && env.Upstream.ArrivedKey("crash-1") == 1
	})
	_ = p.cmd.Process.Kill()
	<-done
	start(t, listen, admin, "--redis-url", redis.URL(), "--config", path)
	time.Sleep(1200 * time.Millisecond) // past the lease
	r := env.Post("/orders", "crash-1", `{}`)
	if r.Status != http.StatusConflict || !strings.Contains(r.Body, "outcome-unknown") {
		t.Fatalf("retry after the lease = %d %s, want 409 outcome-unknown", r.Status, r.Body)
	}
	if n := env.Upstream.CountKey("crash-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// TestBinaryBadConfigFile: a server started on a policy file with mistakes
// exits 2, its message's first line saying it is the configuration, and
// names every mistake of the file, one a line.
func TestBinaryBadConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.yaml")
	writeFile(t, path, threeMistakes)
	cmd := exec.Command(binary(t), "--config", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("exit %v, want 2; stderr %s", err, stderr.String())
	}
	_, msg, ok := strings.Cut(stderr.String(), "idem-extproc: configuration error: ")
	if !ok {
		t.Fatalf("no configuration error line:\n%s", stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(msg, "\n"), "\n")
	want := threeMistakesReport(path)
	if len(lines) != len(want) {
		t.Errorf("%d lines, want one per mistake (%d):\n%s", len(lines), len(want), msg)
	}
	for i, w := range want {
		if i >= len(lines) || !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: want it to start with\n\t%s\nstderr:\n%s", i+1, w, stderr.String())
		}
	}
}

// TestBinaryAdminCLI: `idem-extproc admin` reads and purges records through
// a running server's admin API, named by the default policy's scope: the
// request's :authority, port included.
func TestBinaryAdminCLI(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, "cli-token\n")
	p := start(t, "", "", "--redis-url", redis.URL(), "--admin-token-file", tokenFile)
	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.OnRedis(redis)})
	env.Post("/orders", "cli-1", `{}`)
	scope := strings.TrimPrefix(env.URL, "http://")
	admin := func(args ...string) (string, error) {
		cmd := exec.Command(binary(t), append([]string{"admin"}, args...)...)
		cmd.Env = append(os.Environ(), "IDEM_ADMIN_ADDR=http://"+p.admin, "IDEM_ADMIN_TOKEN_FILE="+tokenFile)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := admin("get", "--policy", "default", "--scope", scope, "--key", "cli-1")
	if err != nil || !strings.Contains(out, `"state":"completed"`) {
		t.Fatalf("admin get: %v\n%s", err, out)
	}
	// The default policy's scope is the :authority with its port: the
	// host alone names another record.
	host, _, _ := strings.Cut(scope, ":")
	if out, err := admin("get", "--policy", "default", "--scope", host, "--key", "cli-1"); err == nil || !strings.Contains(out, "404") {
		t.Fatalf("admin get with the host alone found the record of %s: %v\n%s", scope, err, out)
	}
	if out, err := admin("purge", "--policy", "default", "--scope", scope, "--key", "cli-1"); err != nil || !strings.Contains(out, "purged") {
		t.Fatalf("admin purge: %v\n%s", err, out)
	}
	if out, err := admin("get", "--policy", "default", "--scope", scope, "--key", "cli-1"); err == nil {
		t.Fatalf("admin get after purge should fail:\n%s", out)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	writeFile(t, bad, "wrong")
	if out, err := admin("get", "--token-file", bad, "--policy", "default", "--scope", scope, "--key", "cli-1"); err == nil || !strings.Contains(out, "bearer token") {
		t.Fatalf("a wrong token must be refused:\n%s", out)
	}
}

// abandonInFlight sends a POST and abandons it once it is reserved and has
// reached the upstream, as a client that times out does; the record turns
// unknown and the upstream, which works on, executes it once. It returns
// after both, so the caller's next step cannot race that execution.
func abandonInFlight(t *testing.T, env *harness.Env, key, body string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.URL+"/orders", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("x-upstream-delay", "3s")
	gaveUp := make(chan error, 1)
	go func() {
		resp, err := env.Client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gaveUp <- err
	}()
	testwait.Until(t, "reserved and at the upstream", func() bool {
		return recordState(t, env, key) == idem.StateInFlight && env.Upstream.ArrivedKey(key) == 1
	})
	cancel()
	if err := <-gaveUp; err == nil {
		t.Fatal("the request was answered before the client left")
	}
	testwait.Until(t, "unknown", func() bool { return recordState(t, env, key) == idem.StateUnknown })
	testwait.Until(t, "the abandoned attempt's effect", func() bool { return env.Upstream.CountKey(key) == 1 })
}

// TestBinaryAdminCLIResolve: `idem-extproc admin resolve` settles an
// unknown record as released, so the next attempt runs; an invocation that
// is wrong or ambiguous is refused before it reaches the server, says why
// on stderr and exits non-zero, and leaves the record as it was.
func TestBinaryAdminCLIResolve(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, "cli-token\n")
	p := start(t, "", "", "--redis-url", redis.URL(), "--admin-token-file", tokenFile)
	env := harness.Start(t, harness.Options{ServerAddr: p.listen, Store: harness.OnRedis(redis)})
	scope := strings.TrimPrefix(env.URL, "http://")
	admin := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		return runBinary(t, []string{"IDEM_ADMIN_ADDR=http://" + p.admin, "IDEM_ADMIN_TOKEN_FILE=" + tokenFile}, append([]string{"admin"}, args...)...)
	}
	const body = `{"order":"cli-unknown"}`
	abandonInFlight(t, env, "cli-u1", body)
	name := []string{"--policy", "default", "--scope", scope, "--key", "cli-u1"}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		// Refused by the CLI (usage errors, exit 2).
		{append([]string{"resolve"}, name...), 2, "--action is required"},
		{append([]string{"resolve", "--action", "relase"}, name...), 2, `--action "relase": want release or complete`},
		{append([]string{"resolve", "--action", "release", "--status", "201"}, name...), 2, "--status is for --action complete"},
		{append([]string{"resolve", "--action", "release", "--body", "{}"}, name...), 2, "--body is for --action complete"},
		{append([]string{"resolve", "--action", "complete"}, name...), 2, "--action complete needs --status"},
		{append([]string{"resolve", "release"}, name...), 2, `unexpected argument "release"`},
		{append([]string{"resolv", "--action", "release"}, name...), 2, `unknown subcommand "resolv"`},
		{append([]string{"resolve", "--action", "release", "--header", "no-colon"}, name...), 2, "want name:value"},
		{[]string{"resolve", "--action", "release"}, 2, "name the record: --id"},
		{[]string{"resolve", "--action", "release", "--id", "cli-u1"}, 2, "32-hex-digit"},
		{append([]string{"resolve", "--action", "release", "--token-file", "/nonexistent/token"}, name...), 2, "--token-file"},
		// Refused by the server, its reason passed on (exit 1).
		{[]string{"resolve", "--action", "release", "--policy", "nosuch", "--scope", scope, "--key", "cli-u1"}, 1, `400 Bad Request: no policy "nosuch" in force`},
	} {
		stdout, stderr, code := admin(c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || stdout != "" {
			t.Errorf("admin %s: exit %d, stdout %q, stderr %q; want exit %d and %q on stderr",
				strings.Join(c.args, " "), code, stdout, stderr, c.code, c.want)
		}
	}
	if s := recordState(t, env, "cli-u1"); s != idem.StateUnknown {
		t.Fatalf("after refused invocations the record is %v, want still unknown", s)
	}

	stdout, stderr, code := admin(append([]string{"resolve", "--action", "release"}, name...)...)
	if code != 0 || !strings.Contains(stdout, `"result":"release"`) || stderr != "" {
		t.Fatalf("admin resolve --action release: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if _, stderr, code := admin(append([]string{"get"}, name...)...); code != 1 || !strings.Contains(stderr, "404 Not Found: no such record") {
		t.Fatalf("admin get after release: exit %d, stderr %q", code, stderr)
	}
	next := env.Post("/orders", "cli-u1", body)
	if next.Status != http.StatusCreated || next.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("attempt after release = %d %v %s, want a fresh 201", next.Status, next.Header, next.Body)
	}
	if n := env.Upstream.CountKey("cli-u1"); n != 2 {
		t.Fatalf("effects = %d, want 2: the abandoned one and the one after release", n)
	}
	// The new execution completed the record: resolving applies no more.
	if _, stderr, code := admin(append([]string{"resolve", "--action", "release"}, name...)...); code != 1 || !strings.Contains(stderr, "409 Conflict: only a record in state unknown") {
		t.Fatalf("resolve on a completed record: exit %d, stderr %q", code, stderr)
	}
	if again := env.Post("/orders", "cli-u1", body); again.Header.Get("Idempotent-Replayed") != "true" || env.Upstream.CountKey("cli-u1") != 2 {
		t.Fatalf("retry after the new execution = %d %v, effects %d", again.Status, again.Header, env.Upstream.CountKey("cli-u1"))
	}
}

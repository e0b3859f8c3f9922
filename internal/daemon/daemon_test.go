package daemon_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idem-extproc/idem-extproc/internal/admin"
	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

type running struct {
	d     *daemon.Daemon
	env   *harness.Env
	redis *redistest.Server
	logs  *harness.LogBuffer
	token string
}

// run starts the daemon in process with a real Redis and an admin token,
// and an Envoy-faithful proxy in front of it.
func run(t *testing.T, extra ...string) *running {
	t.Helper()
	redis := redistest.Start(t, redistest.Options{})
	token := "s3cret-admin-token"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The harness's generous store budget, as every harness test has: these
	// tests judge answers, and a loaded -race run can stall a Redis call
	// past the product's 100 ms (a test about budgets passes its own).
	args := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--redis-url", redis.URL(), "--admin-token-file", tokenFile,
		"--store-timeout", harness.TestStoreTimeout.String()}, extra...)
	cfg, err := daemon.ParseConfig(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &harness.LogBuffer{}
	d, err := daemon.Start(cfg, slog.New(slog.NewJSONHandler(logs, nil)), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Shutdown)
	env := harness.Start(t, harness.Options{ServerAddr: d.Addr(), Store: harness.OnRedis(redis)})
	return &running{d: d, env: env, redis: redis, logs: logs, token: token}
}

func (r *running) adminDo(t *testing.T, method, path, token string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+r.d.AdminAddr()+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func scrape(t *testing.T, d *daemon.Daemon) string {
	t.Helper()
	resp, err := http.Get("http://" + d.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue returns the value of the sample whose line starts with
// prefix (name and labels), or "" when absent.
func metricValue(exposition, prefix string) string {
	for _, line := range strings.Split(exposition, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix+" "); ok {
			return rest
		}
	}
	return ""
}

// TestMetricsFollowDecisions: the counters move as decisions are made.
func TestMetricsFollowDecisions(t *testing.T) {
	r := run(t)
	r.env.Post("/orders", "m-1", `{}`)
	r.env.Post("/orders", "m-1", `{}`)
	r.env.Post("/orders", "m-1", `{"other":1}`)
	r.env.Post("/orders", "", `{}`)
	r.env.Post("/orders", `"`, `{}`)
	// The client has its answer before Envoy ends the last gRPC stream: wait
	// for the server to see every stream end before reading the gauges.
	testwait.Until(t, "open_streams 0", func() bool { return metricValue(scrape(t, r.d), "idem_extproc_open_streams") == "0" })
	m := scrape(t, r.d)
	for prefix, want := range map[string]string{
		`idem_extproc_decisions_total{decision="reserved",policy="default"}`:        "1",
		`idem_extproc_decisions_total{decision="stored",policy="default"}`:          "1",
		`idem_extproc_decisions_total{decision="replayed",policy="default"}`:        "1",
		`idem_extproc_decisions_total{decision="mismatch",policy="default"}`:        "1",
		`idem_extproc_decisions_total{decision="bypassed",policy="default"}`:        "1",
		`idem_extproc_decisions_total{decision="rejected",policy="default"}`:        "1",
		`idem_extproc_store_call_duration_seconds_count{op="reserve",result="ok"}`:  "3",
		`idem_extproc_store_call_duration_seconds_count{op="complete",result="ok"}`: "1",
		`idem_extproc_replay_record_age_seconds_count{policy="default"}`:            "1",
		`idem_extproc_open_streams`: "0",
		// The lease is renewed at half its length (15 s by default): a
		// request shorter than that costs no renewal at all.
		`idem_extproc_store_call_duration_seconds_count{op="renew",result="ok"}`: "",
	} {
		if got := metricValue(m, prefix); got != want {
			t.Errorf("%s = %q, want %s", prefix, got, want)
		}
	}
	if !strings.Contains(m, "idem_extproc_build_info{") || !strings.Contains(m, "go_goroutines") {
		t.Error("build info or runtime metrics missing")
	}
	// A request in flight shows as an open stream.
	done := make(chan harness.Reply)
	go func() { done <- r.env.Post("/orders", "m-2", `{}`, "x-upstream-delay", "500ms") }()
	testwait.Until(t, "open_streams 1", func() bool { return metricValue(scrape(t, r.d), "idem_extproc_open_streams") == "1" })
	<-done
	// Redis down: the 503 is counted and the store error is timed.
	r.redis.Kill()
	r.env.Post("/orders", "m-3", `{}`)
	m = scrape(t, r.d)
	if metricValue(m, `idem_extproc_decisions_total{decision="store_unavailable",policy="default"}`) != "1" {
		t.Error("store_unavailable not counted")
	}
	if !strings.Contains(m, `idem_extproc_store_call_duration_seconds_count{op="reserve",result="error"}`) &&
		!strings.Contains(m, `idem_extproc_store_call_duration_seconds_count{op="reserve",result="timeout"}`) {
		t.Error("the failed reserve is not timed")
	}
}

func TestConfigReloadMetric(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("defaults: {retention: 1h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "--config", path)
	if err := os.WriteFile(path, []byte("defaults: {retention: 2h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("defaults: {retention: never}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Reload(); err == nil {
		t.Fatal("a bad file must be rejected")
	}
	m := scrape(t, r.d)
	ok, rejected := metricValue(m, `idem_extproc_config_reloads_total{result="ok"}`), metricValue(m, `idem_extproc_config_reloads_total{result="rejected"}`)
	// The file watcher may have reloaded too: at least one of each.
	if ok == "" || ok == "0" || rejected == "" || rejected == "0" {
		t.Fatalf("reloads ok=%q rejected=%q", ok, rejected)
	}
}

// TestOnReloadTellsWhatIsInForce: a function given to OnReload is told of
// an accepted reload with the new policies and of a rejected one with its
// error and the policies that stay; Policies follows.
func TestOnReloadTellsWhatIsInForce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	file := func(name string) []byte {
		return []byte("policies:\n  - name: " + name + "\n    match: {methods: [POST]}\n")
	}
	if err := os.WriteFile(path, file("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "--config", path)
	type told struct {
		names []string
		err   error
	}
	var mu sync.Mutex
	var reports []told
	r.d.OnReload(func(set *policy.Set, err error) {
		var names []string
		for _, p := range set.Policies {
			names = append(names, p.Name)
		}
		mu.Lock()
		reports = append(reports, told{names, err})
		mu.Unlock()
	})
	last := func() told {
		mu.Lock()
		defer mu.Unlock()
		if len(reports) == 0 {
			return told{}
		}
		return reports[len(reports)-1]
	}
	if got := r.d.Policies().Policies[0].Name; got != "first" {
		t.Fatalf("in force at start: %q", got)
	}

	if err := os.WriteFile(path, file("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Reload(); err != nil {
		t.Fatal(err)
	}
	// Reload or the file watcher, whichever read the change first, told.
	if got := last(); got.err != nil || strings.Join(got.names, ",") != "second,default" {
		t.Fatalf("after an accepted reload: told %v, %v; want second,default and no error", got.names, got.err)
	}

	if err := os.WriteFile(path, []byte("policies:\n  - name: third\n    retention: never\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Reload(); err == nil {
		t.Fatal("a bad file must be rejected")
	}
	if got := last(); got.err == nil || !strings.Contains(got.err.Error(), "retention") || strings.Join(got.names, ",") != "second,default" {
		t.Fatalf("after a rejected reload: told %v, %v; want second,default and the error naming retention", got.names, got.err)
	}
	if got := r.d.Policies().Policies[0].Name; got != "second" {
		t.Fatalf("in force after the rejected reload: %q", got)
	}
}

// TestHealth: the gRPC health service on the ext_proc port and /readyz
// follow the store; /healthz only says the process is alive.
func TestHealth(t *testing.T) {
	r := run(t)
	cc, err := grpc.NewClient(r.d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
	get := func(path string) int {
		resp, err := http.Get("http://" + r.d.AdminAddr() + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, svc := range []string{"", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		if s := status(svc); s != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health(%q) = %v", svc, s)
		}
	}
	if get("/readyz") != 200 || get("/healthz") != 200 {
		t.Fatal("not ready with Redis up")
	}
	r.redis.Kill()
	testwait.For(t, func() bool { return status("") == healthpb.HealthCheckResponse_NOT_SERVING })
	if get("/readyz") != 503 || get("/healthz") != 200 {
		t.Fatal("readiness must follow the store, liveness must not")
	}
	r.redis.Restart()
	testwait.For(t, func() bool { return status("") == healthpb.HealthCheckResponse_SERVING })
	if get("/readyz") != 200 {
		t.Fatal("not ready again after Redis came back")
	}
	// Shutting down: not serving and not ready first.
	go r.d.Shutdown()
	testwait.For(t, func() bool { return status("") != healthpb.HealthCheckResponse_SERVING })
}

// TestAdminAPI: refused without the token; lookup, purge and resolving an
// unknown record work, and each action is logged.
func TestAdminAPI(t *testing.T) {
	r := run(t)
	scope := strings.TrimPrefix(r.env.URL, "http://")
	q := "?policy=default&scope=" + scope + "&key="

	for _, token := range []string{"", "wrong"} {
		if code, _ := r.adminDo(t, http.MethodGet, admin.Prefix+"records"+q+"k", token, nil); code != http.StatusUnauthorized {
			t.Fatalf("token %q: %d, want 401", token, code)
		}
	}
	if code, _ := r.adminDo(t, http.MethodGet, admin.Prefix+"records"+q+"absent", r.token, nil); code != http.StatusNotFound {
		t.Fatalf("absent record: %d", code)
	}

	r.env.Post("/orders", "adm-1", `{"a":1}`)
	code, rec := r.adminDo(t, http.MethodGet, admin.Prefix+"records"+q+"adm-1", r.token, nil)
	if code != 200 || rec["state"] != "completed" || rec["attempts"] != float64(1) {
		t.Fatalf("lookup: %d %v", code, rec)
	}
	resp := rec["response"].(map[string]any)
	if resp["status"] != float64(201) || resp["compressed"] != true || resp["body_bytes"].(float64) < 1 {
		t.Fatalf("lookup response view: %v", resp)
	}
	// By the key_hash of the logs too.
	if code, byID := r.adminDo(t, http.MethodGet, admin.Prefix+"records?id="+rec["id"].(string), r.token, nil); code != 200 || byID["state"] != "completed" {
		t.Fatalf("lookup by id: %d %v", code, byID)
	}
	// Purge: the key is free; the next attempt runs.
	if code, _ := r.adminDo(t, http.MethodDelete, admin.Prefix+"records"+q+"adm-1", r.token, nil); code != 200 {
		t.Fatalf("purge: %d", code)
	}
	if again := r.env.Post("/orders", "adm-1", `{"a":1}`); again.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("after a purge the operation runs again")
	}

	// An unknown record: the client went away while the upstream worked.
	if err := r.env.Abandon("/orders", "adm-2", `{"u":1}`); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, func() bool {
		_, m := r.adminDo(t, http.MethodGet, admin.Prefix+"records"+q+"adm-2", r.token, nil)
		return m["state"] == "unknown"
	})
	if code, _ := r.adminDo(t, http.MethodPost, admin.Prefix+"records/resolve"+q+"adm-1", r.token, map[string]any{"action": "release"}); code != http.StatusConflict {
		t.Fatalf("resolving a completed record: %d, want 409", code)
	}
	// The operator checked the domain: the order exists; store its answer.
	testwait.For(t, func() bool { return r.env.Upstream.CountKey("adm-2") == 1 })
	code, _ = r.adminDo(t, http.MethodPost, admin.Prefix+"records/resolve"+q+"adm-2", r.token, map[string]any{
		"action": "complete", "status": 201, "headers": [][2]string{{"Content-Type", "application/json"}}, "body": `{"order":"checked-by-hand"}`,
	})
	if code != 200 {
		t.Fatalf("resolve complete: %d", code)
	}
	replay := r.env.Post("/orders", "adm-2", `{"u":1}`)
	if replay.Status != 201 || replay.Body != `{"order":"checked-by-hand"}` || replay.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay after resolve: %d %q %v", replay.Status, replay.Body, replay.Header)
	}
	if n := r.env.Upstream.CountKey("adm-2"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
	for _, action := range []string{`"action":"lookup"`, `"action":"purge"`, `"action":"resolve_complete"`} {
		if !strings.Contains(r.logs.String(), action) {
			t.Errorf("no log line for %s", action)
		}
	}
	if !strings.Contains(scrape(t, r.d), `idem_extproc_admin_actions_total{action="purge",result="ok"} 1`) {
		t.Error("admin action not counted")
	}
	// The adoption report reads the daemon's own counters.
	if code, _ := r.adminDo(t, http.MethodGet, admin.Prefix+"adoption", "wrong", nil); code != http.StatusUnauthorized {
		t.Fatalf("adoption with a wrong token: %d", code)
	}
	code, rep := r.adminDo(t, http.MethodGet, admin.Prefix+"adoption", r.token, nil)
	pols, _ := rep["policies"].([]any)
	if code != 200 || len(pols) != 1 {
		t.Fatalf("adoption: %d %v", code, rep)
	}
	if def := pols[0].(map[string]any); def["policy"] != "default" || def["enforcement"] != "enforce" || def["with_key"] != float64(4) {
		t.Fatalf("adoption of the default policy: %v", def)
	}
}

// adminRaw is adminDo for a GET whose exact bytes matter: what the API
// must never reveal is checked on the wire, not after decoding.
func (r *running) adminRaw(t *testing.T, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+r.d.AdminAddr()+path, nil)
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// leaveMidway abandons a POST once the upstream has it and state says it is
// in flight (Env.AbandonWhen, so the caller sees that state), and
// returns once the record is unknown and the upstream's one execution has
// happened, so nothing the caller does next can race that execution.
func leaveMidway(t *testing.T, env *harness.Env, key, body string, state func() string) {
	t.Helper()
	inFlight := func() bool { return state() == "in_flight" }
	if err := env.AbandonWhen("/orders", key, body, inFlight); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, func() bool { return state() == "unknown" })
	testwait.Until(t, "the abandoned attempt at the upstream", func() bool { return env.Upstream.CountKey(key) == 1 })
}

// TestAdminResolveReleaseUnknown: an operator who found that an unknown
// operation did not take effect releases its record; the record is gone
// and the client's next attempt runs the operation, once.
func TestAdminResolveReleaseUnknown(t *testing.T) {
	r := run(t)
	scope := strings.TrimPrefix(r.env.URL, "http://")
	q := "?policy=default&scope=" + scope + "&key=rel-unk-1"
	state := func() string {
		_, m := r.adminDo(t, http.MethodGet, admin.Prefix+"records"+q, r.token, nil)
		s, _ := m["state"].(string)
		return s
	}
	const body = `{"order":"release-me"}`
	leaveMidway(t, r.env, "rel-unk-1", body, state)
	// Unknown means no retry runs until someone decides.
	if got := r.env.Post("/orders", "rel-unk-1", body); got.Status != http.StatusConflict || !strings.Contains(got.Body, "outcome-unknown") {
		t.Fatalf("retry of an unknown record = %d %s, want 409 outcome-unknown", got.Status, got.Body)
	}

	code, res := r.adminDo(t, http.MethodPost, admin.Prefix+"records/resolve"+q, r.token, map[string]any{"action": "release"})
	if code != http.StatusOK || res["result"] != "release" {
		t.Fatalf("resolve release: %d %v", code, res)
	}
	if code, m := r.adminDo(t, http.MethodGet, admin.Prefix+"records"+q, r.token, nil); code != http.StatusNotFound {
		t.Fatalf("lookup after release: %d %v, want 404", code, m)
	}
	// Nothing left to release: a second word from the operator is refused.
	if code, _ := r.adminDo(t, http.MethodPost, admin.Prefix+"records/resolve"+q, r.token, map[string]any{"action": "release"}); code != http.StatusNotFound {
		t.Fatalf("releasing a released record: %d, want 404", code)
	}

	next := r.env.Post("/orders", "rel-unk-1", body)
	if next.Status != http.StatusCreated || next.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("attempt after release = %d %v %s, want a fresh 201", next.Status, next.Header, next.Body)
	}
	if n := r.env.Upstream.CountKey("rel-unk-1"); n != 2 {
		t.Fatalf("effects = %d, want 2: the abandoned one and the one after release", n)
	}
	// The new execution is an ordinary record again: retries replay it.
	again := r.env.Post("/orders", "rel-unk-1", body)
	if again.Status != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || again.Body != next.Body {
		t.Fatalf("retry after the new execution = %d %v %s, want its replay", again.Status, again.Header, again.Body)
	}
	if n := r.env.Upstream.CountKey("rel-unk-1"); n != 2 {
		t.Fatalf("effects = %d after the replay, want 2", n)
	}
	if !strings.Contains(r.logs.String(), `"action":"resolve_release"`) {
		t.Error("no log line for resolve_release")
	}
	m := scrape(t, r.d)
	if got := metricValue(m, `idem_extproc_admin_actions_total{action="resolve_release",result="ok"}`); got != "1" {
		t.Errorf("resolve_release ok counted %q, want 1", got)
	}
	if got := metricValue(m, `idem_extproc_admin_actions_total{action="resolve_release",result="refused"}`); got != "1" {
		t.Errorf("resolve_release refused counted %q, want 1", got)
	}
}

// TestAdminLookupFields: a lookup shows what docs/observability.md
// promises (state, fingerprint, creation time and age, attempts, lease,
// and a completed record's status, header count and body size) in each
// state a record passes through, and never the stored body or a stored
// header's value (SECURITY.md).
func TestAdminLookupFields(t *testing.T) {
	r := run(t)
	scope := strings.TrimPrefix(r.env.URL, "http://")
	lookup := func(key string) (map[string]any, []byte, time.Time, time.Time) {
		t.Helper()
		from := time.Now()
		code, raw := r.adminRaw(t, admin.Prefix+"records?policy=default&scope="+scope+"&key="+key)
		to := time.Now()
		if code != http.StatusOK {
			t.Fatalf("lookup %s: %d %s", key, code, raw)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("lookup %s: %v in %s", key, err, raw)
		}
		return m, raw, from, to
	}
	// The fingerprint is the request's, as the server computes it: method,
	// path, the default policy's content-type, and the body.
	wantFP := func(body string) string {
		fp := fingerprint.Compute(fingerprint.Request{
			Method: http.MethodPost, Path: "/orders", Body: []byte(body),
			Headers: []idem.Header{{Name: "content-type", Value: "application/json"}},
		}, policy.Default().FingerprintHeaders)
		return hex.EncodeToString(fp[:])
	}
	// created_at is Redis's clock at the reservation (ms), age_seconds the
	// server's clock at the lookup minus it: both bracketed by the test's
	// own readings of the same machine's clock, whatever the machine's speed.
	checkTimes := func(m map[string]any, sent, answered, from, to time.Time) time.Time {
		t.Helper()
		created, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["created_at"]))
		if err != nil {
			t.Fatalf("created_at %v: %v", m["created_at"], err)
		}
		if created.Before(sent.Truncate(time.Millisecond)) || created.After(answered) {
			t.Fatalf("created_at %v outside the request's span [%v, %v]", created, sent, answered)
		}
		age, ok := m["age_seconds"].(float64)
		lo, hi := from.Sub(created).Seconds()-1e-3, to.Sub(created).Seconds()+1e-3
		if !ok || age < lo || age > hi {
			t.Fatalf("age_seconds %v, want within [%v, %v]", m["age_seconds"], lo, hi)
		}
		return created
	}
	keys := func(m map[string]any) string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return strings.Join(ks, ",")
	}

	// A completed record, whose response carries a body and a header that
	// could be anyone's secrets.
	const body = `{"card":"body-marker-4111"}`
	const cookie = "session=header-marker-6e1f"
	sent := time.Now()
	first := r.env.Post("/orders", "look-1", body, "x-upstream-set-cookie", cookie)
	answered := time.Now()
	if first.Status != http.StatusCreated || !strings.Contains(first.Body, "body-marker-4111") {
		t.Fatalf("first = %d %s", first.Status, first.Body)
	}
	// A replay proves both markers are in the stored record, so their
	// absence below means the lookup withheld them.
	replay := r.env.Post("/orders", "look-1", body)
	if replay.Header.Get("Idempotent-Replayed") != "true" || replay.Body != first.Body || replay.Header.Get("Set-Cookie") != cookie {
		t.Fatalf("replay = %d %v %s", replay.Status, replay.Header, replay.Body)
	}
	m, raw, from, to := lookup("look-1")
	if got := keys(m); got != "age_seconds,attempts,created_at,fingerprint,id,response,state" {
		t.Fatalf("completed record's fields: %s in %s", got, raw)
	}
	if m["state"] != "completed" || m["attempts"] != float64(2) || m["fingerprint"] != wantFP(body) {
		t.Fatalf("completed record: %s (want fingerprint %s, attempts 2: the first and the replay)", raw, wantFP(body))
	}
	if m["id"] != string(idem.RecordIDFor("default", scope, "look-1")) {
		t.Fatalf("id %v is not the record's key_hash", m["id"])
	}
	checkTimes(m, sent, answered, from, to)
	stored, err := r.env.Store.Get(context.Background(), idem.RecordIDFor("default", scope, "look-1"))
	if err != nil {
		t.Fatal(err)
	}
	resp, _ := m["response"].(map[string]any)
	if got := keys(resp); got != "body_bytes,body_omitted,compressed,headers,sealed,status" {
		t.Fatalf("response view's fields: %s in %s", got, raw)
	}
	// The record holds headers and body compressed in one frame (the
	// default policy's compression): the view counts what is stored.
	if resp["status"] != float64(201) || resp["headers"] != float64(len(stored.Response.Headers)) ||
		resp["body_bytes"] != float64(len(stored.Response.Body)) || resp["body_omitted"] != false ||
		resp["sealed"] != false || resp["compressed"] != stored.Response.Compressed || !stored.Response.Compressed {
		t.Fatalf("response view: %v (stored headers %d, body %d bytes, compressed %v)", resp,
			len(stored.Response.Headers), len(stored.Response.Body), stored.Response.Compressed)
	}
	for _, secret := range []string{"body-marker-4111", "header-marker-6e1f", first.Body} {
		if bytes.Contains(raw, []byte(secret)) {
			t.Fatalf("the lookup reveals %q: %s", secret, raw)
		}
	}

	// In flight: the lease shows, no response yet. Then unknown: no lease.
	const body2 = `{"card":"body-marker-2"}`
	var inFlight map[string]any
	sent = time.Now()
	leaveMidway(t, r.env, "look-2", body2, func() string {
		code, raw := r.adminRaw(t, admin.Prefix+"records?policy=default&scope="+scope+"&key=look-2")
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		if code == http.StatusOK && m["state"] == "in_flight" && inFlight == nil {
			inFlight = m
		}
		s, _ := m["state"].(string)
		return s
	})
	if got := keys(inFlight); got != "age_seconds,attempts,created_at,fingerprint,id,lease_until,state" {
		t.Fatalf("in-flight record's fields: %s (%v)", got, inFlight)
	}
	created, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(inFlight["created_at"]))
	lease, err := time.Parse(time.RFC3339Nano, fmt.Sprint(inFlight["lease_until"]))
	if err != nil || !lease.After(created) || lease.Sub(created) > policy.Default().Lease {
		t.Fatalf("lease_until %v for a record created %v (lease %v)", inFlight["lease_until"], created, policy.Default().Lease)
	}
	if inFlight["attempts"] != float64(1) || inFlight["fingerprint"] != wantFP(body2) {
		t.Fatalf("in-flight record: %v", inFlight)
	}
	m, raw, from, to = lookup("look-2")
	if got := keys(m); got != "age_seconds,attempts,created_at,fingerprint,id,state" {
		t.Fatalf("unknown record's fields: %s in %s", got, raw)
	}
	if m["state"] != "unknown" || m["attempts"] != float64(1) || m["fingerprint"] != wantFP(body2) {
		t.Fatalf("unknown record: %s", raw)
	}
	if got := checkTimes(m, sent, time.Now(), from, to); !got.Equal(created) {
		t.Fatalf("created_at moved from %v to %v when the record turned unknown", created, got)
	}

	// Settled by hand: the operator's response is withheld just the same,
	// and the record keeps its creation time and attempts.
	code, _ := r.adminDo(t, http.MethodPost, admin.Prefix+"records/resolve?policy=default&scope="+scope+"&key=look-2", r.token, map[string]any{
		"action": "complete", "status": 201, "headers": [][2]string{{"X-Order-Ref", "header-marker-3"}}, "body": `{"order":"body-marker-3"}`,
	})
	if code != http.StatusOK {
		t.Fatalf("resolve complete: %d", code)
	}
	m, raw, _, _ = lookup("look-2")
	resp, _ = m["response"].(map[string]any)
	if m["state"] != "completed" || m["attempts"] != float64(1) || m["fingerprint"] != wantFP(body2) || m["created_at"] != inFlight["created_at"] ||
		resp["status"] != float64(201) || resp["headers"] != float64(1) || resp["body_bytes"] != float64(len(`{"order":"body-marker-3"}`)) {
		t.Fatalf("resolved record: %s (created %v)", raw, inFlight["created_at"])
	}
	for _, secret := range []string{"body-marker-3", "header-marker-3"} {
		if bytes.Contains(raw, []byte(secret)) {
			t.Fatalf("the lookup reveals %q: %s", secret, raw)
		}
	}
}

// TestAdminOffWithoutToken: no token file, no admin API.
func TestAdminOffWithoutToken(t *testing.T) {
	cfg, err := daemon.ParseConfig([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.Start(cfg, slog.New(slog.DiscardHandler), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown()
	resp, err := http.Get("http://" + d.AdminAddr() + admin.Prefix + "records?id=00000000000000000000000000000000")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("admin API answered %d without a token configured", resp.StatusCode)
	}
}

// TestMetricsCountReleasesUnknownsAndFailOpen: the response-side decisions
// a first attempt can end in, and a fail-open pass, each counted once.
func TestMetricsCountReleasesUnknownsAndFailOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	cfg := "policies:\n" +
		"  - name: lenient\n    match: {path: {prefix: /lenient}}\n    store_failure: fail_open\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "--config", path)
	// 429 from the upstream: released, so that a retry may run.
	if got := r.env.Post("/orders", "rel-1", `{}`, "x-upstream-status", "429"); got.Status != http.StatusTooManyRequests {
		t.Fatalf("429 passed through as %d", got.Status)
	}
	// The client leaves after the request was let through: unknown.
	if err := r.env.Abandon("/orders", "unk-1", `{}`); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, func() bool {
		return metricValue(scrape(t, r.d), `idem_extproc_decisions_total{decision="marked_unknown",policy="default"}`) == "1"
	})
	// Redis down under a fail_open policy: passed unprotected, counted.
	r.redis.Kill()
	if got := r.env.Post("/lenient", "open-1", `{}`); got.Status != http.StatusCreated {
		t.Fatalf("fail_open answered %d %s", got.Status, got.Body)
	}
	m := scrape(t, r.d)
	for series, want := range map[string]string{
		`idem_extproc_decisions_total{decision="released",policy="default"}`:  "1",
		`idem_extproc_decisions_total{decision="fail_open",policy="lenient"}`: "1",
		`idem_extproc_decisions_total{decision="stored",policy="default"}`:    "",
	} {
		if got := metricValue(m, series); got != want {
			t.Errorf("%s = %q, want %q", series, got, want)
		}
	}
}

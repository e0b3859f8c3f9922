package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idem-extproc/idem-extproc/internal/admin"
	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// counter sums the samples of a metric whose labels include the given
// name, value pairs.
func counter(t *testing.T, m *observe.Metrics, name string, labels ...string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	sample:
		for _, s := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue sample
				}
			}
			total += s.GetCounter().GetValue()
		}
	}
	return total
}

// conversation lists the phases of the last exchange and their replies.
func conversation(env *harness.Env) string {
	res := env.Results()
	var parts []string
	for _, m := range res[len(res)-1].Messages {
		parts = append(parts, m.Phase.String()+":"+m.Reply)
	}
	return strings.Join(parts, " ")
}

// rolloutPolicies has one shadow and one enforcing policy with the same
// settings, told apart by path, so one run of traffic compares them.
const rolloutPolicies = `
defaults:
  key: {required: true}
  scope: {from: none}
  responses:
    - {status: 503, action: unknown}
policies:
  - name: shadowed
    match: {path: {prefix: /shadow/}}
    enforcement: shadow
    shadow_header: Idempotency-Shadow
  - name: enforced
    match: {path: {prefix: /enforce/}}
default_policy:
  enabled: false
`

// TestShadowNeverBlocksAndCountsWhatEnforceWould: the same traffic under a
// shadow policy and an enforcing one. Enforcement replays, answers 409,
// 422 and 400; shadow lets every request reach the upstream, stores the
// first attempt's response as enforcement would (a duplicate's own
// response never overwrites it), tells the client what it would have done
// in the configured header, and counts exactly the decisions enforcement
// made.
func TestShadowNeverBlocksAndCountsWhatEnforceWould(t *testing.T) {
	m := observe.NewMetrics()
	env := harness.Start(t, harness.Options{Metrics: m, Policies: policies(t, rolloutPolicies)})
	ns := map[string]string{"/shadow/": "shadowed#shadow", "/enforce/": "enforced"}
	state := func(prefix, key string) idem.State {
		rec, err := env.Store.Get(context.Background(), idem.RecordIDFor(ns[prefix], "", key))
		if err != nil {
			return 0
		}
		return rec.State
	}
	run := func(prefix string) []harness.Reply {
		p := prefix + "orders"
		var rs []harness.Reply
		rs = append(rs,
			env.Post(p, "a", `{"n":1}`),                             // reserve
			env.Post(p, "a", `{"n":1}`),                             // replay
			env.Post(p, "a", `{"n":2}`),                             // mismatch
			env.Post(p, "", `{"n":1}`),                              // missing key: reject
			env.Post(p, strings.Repeat("k", 300), `{"n":1}`),        // invalid key: reject
			env.Post(p, "u", `{"n":1}`, "x-upstream-status", "503"), // reserve; the 503 marks it unknown
			env.Post(p, "u", `{"n":1}`, "x-upstream-status", "503"), // unknown
		)
		done := make(chan harness.Reply, 1)
		go func() { done <- env.Post(p, "f", `{"n":1}`, "x-upstream-delay", "400ms") }()
		testwait.For(t, func() bool { return state(prefix, "f") == idem.StateInFlight })
		dup := env.Post(p, "f", `{"n":1}`) // in flight: conflict
		return append(rs, <-done, dup)
	}
	enforced := run("/enforce/")
	wantStatus(t, enforced[0], http.StatusCreated)
	wantReplayOf(t, enforced[1], enforced[0])
	wantProblem(t, enforced[2], problem.KeyReused)
	wantProblem(t, enforced[3], problem.KeyMissing)
	wantProblem(t, enforced[4], problem.KeyInvalid)
	wantProblem(t, enforced[6], problem.OutcomeUnknown)
	wantProblem(t, enforced[8], problem.InProgress)

	shadowed := run("/shadow/")
	wantHeaders := []string{"would-reserve", "would-replay", "would-mismatch", "would-reject", "would-reject",
		"would-reserve", "would-unknown", "would-reserve", "would-conflict"}
	for i, r := range shadowed {
		want := http.StatusCreated
		if i == 5 || i == 6 {
			want = http.StatusServiceUnavailable // the upstream's own 503
		}
		wantStatus(t, r, want)
		if r.Header.Get("Content-Type") == problem.ContentType || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("shadow request %d was answered by the server: %v %s", i, r.Header, r.Body)
		}
		if got := r.Header.Get("Idempotency-Shadow"); got != wantHeaders[i] {
			t.Fatalf("shadow request %d: Idempotency-Shadow %q, want %q", i, got, wantHeaders[i])
		}
	}
	onPath := func(prefix string) int {
		return env.Upstream.Count(func(e harness.Effect) bool { return strings.HasPrefix(e.Path, prefix) })
	}
	if s, e := onPath("/shadow/"), onPath("/enforce/"); s != len(shadowed) || e != 3 {
		t.Fatalf("upstream executions: shadow %d (want every one of %d), enforce %d (want 3)", s, len(shadowed), e)
	}

	// The shadow record holds the first attempt's response, not the
	// duplicate's, and never the shadow header.
	rec, err := env.Store.Get(context.Background(), idem.RecordIDFor("shadowed#shadow", "", "a"))
	if err == nil && rec.Response != nil {
		// Stored compressed (compression.mode defaults to zstd): what it
		// holds is what it expands to.
		var open idem.Response
		open, err = policy.Default().Compression.Codec.Expand(*rec.Response, 1<<20)
		rec.Response = &open
	}
	if err != nil || rec.State != idem.StateCompleted || string(rec.Response.Body) != shadowed[0].Body || shadowed[1].Body == shadowed[0].Body {
		t.Fatalf("shadow record %+v (err %v); first answer %s, duplicate %s", rec, err, shadowed[0].Body, shadowed[1].Body)
	}
	for _, h := range rec.Response.Headers {
		if h.Name == "idempotency-shadow" {
			t.Fatal("the shadow header was stored")
		}
	}
	if st := state("/shadow/", "u"); st != idem.StateUnknown {
		t.Fatalf("shadow record u is %v, want unknown", st)
	}

	// What shadow counted is what enforcement did.
	for shadow, enforce := range map[idem.ShadowDecision]idem.Decision{
		idem.ShadowWouldReserve:  idem.DecisionReserved,
		idem.ShadowWouldReplay:   idem.DecisionReplayed,
		idem.ShadowWouldMismatch: idem.DecisionMismatch,
		idem.ShadowWouldReject:   idem.DecisionRejected,
		idem.ShadowWouldUnknown:  idem.DecisionUnknown,
		idem.ShadowWouldConflict: idem.DecisionConflict,
	} {
		s := counter(t, m, "idem_extproc_shadow_decisions_total", "policy", "shadowed", "decision", string(shadow))
		e := counter(t, m, "idem_extproc_decisions_total", "policy", "enforced", "decision", string(enforce))
		if s != e || s == 0 {
			t.Errorf("shadow counted %v %s, enforcement made %v %s", s, shadow, e, enforce)
		}
	}
	if n := counter(t, m, "idem_extproc_shadow_decisions_total", "policy", "enforced"); n != 0 {
		t.Errorf("the enforcing policy counted %v shadow decisions", n)
	}
	if n := counter(t, m, "idem_extproc_decisions_total", "policy", "shadowed", "decision", "shadowed"); n != float64(len(shadowed)) {
		t.Errorf("shadowed decisions %v, want %d", n, len(shadowed))
	}
	for _, pol := range []string{"shadowed", "enforced"} {
		if with, without := counter(t, m, "idem_extproc_requests_total", "policy", pol, "key", "present"),
			counter(t, m, "idem_extproc_requests_total", "policy", pol, "key", "absent"); with != 8 || without != 1 {
			t.Errorf("%s: requests with key %v, without %v; want 8 and 1", pol, with, without)
		}
	}
}

// TestShadowHeaderOnlyWhenConfigured: without shadow_header the response is
// the upstream's, untouched, and a request shadow lets through at its
// headers costs one ext_proc message; with it, the stream stays open to
// the response headers (and nothing else) to add the header.
func TestShadowHeaderOnlyWhenConfigured(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, `
policies:
  - name: quiet
    match: {path: {prefix: /quiet/}}
    enforcement: shadow
    key: {required: true}
  - name: loud
    match: {path: {prefix: /loud/}}
    enforcement: shadow
    shadow_header: x-idem-shadow
    key: {required: true}
`)})
	first := env.Post("/quiet/orders", "q", `{}`)
	again := env.Post("/quiet/orders", "q", `{}`)
	for _, r := range []harness.Reply{first, again} {
		wantStatus(t, r, http.StatusCreated)
		if r.Header.Get("X-Idem-Shadow") != "" || r.Header.Get("Idempotency-Shadow") != "" || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("a shadow policy without shadow_header changed the response: %v", r.Header)
		}
	}
	wantStatus(t, env.Post("/quiet/orders", "", `{}`), http.StatusCreated)
	if got := conversation(env); got != "request_headers:mode_override" {
		t.Fatalf("keyless request under a quiet shadow policy: %s", got)
	}
	r := env.Post("/loud/orders", "", `{}`)
	if wantStatus(t, r, http.StatusCreated); r.Header.Get("X-Idem-Shadow") != "would-reject" {
		t.Fatalf("X-Idem-Shadow %q", r.Header.Get("X-Idem-Shadow"))
	}
	if got := conversation(env); got != "request_headers:mode_override response_headers:continue" {
		t.Fatalf("keyless request under a loud shadow policy: %s", got)
	}
}

// TestShadowToEnforceNeverReplaysShadowRecords: a policy moved from shadow
// to enforce (a reload; here two servers on one Redis) starts with a clean
// key space: the key a shadow request used runs again, once, and is
// protected from then on. With adopt_shadow_records the enforcing policy
// replays what its shadow phase stored instead.
func TestShadowToEnforceNeverReplaysShadowRecords(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	// Each server has its own proxy and so its own :authority: one key
	// space for the whole policy.
	const base = `
policies:
  - name: orders
    match: {methods: [POST]}
    scope: {from: none}
`
	shadow := harness.Start(t, harness.Options{Store: harness.OnRedis(redis), Policies: policies(t, base+"    enforcement: shadow\n")})
	enforce := harness.Start(t, harness.Options{Store: harness.OnRedis(redis), Policies: policies(t, base)})
	adopt := harness.Start(t, harness.Options{Store: harness.OnRedis(redis), Policies: policies(t, base+"    adopt_shadow_records: true\n")})

	shadowFirst := shadow.Post("/orders", "switch-1", `{"n":1}`)
	wantStatus(t, shadowFirst, http.StatusCreated)
	adoptedFirst := shadow.Post("/orders", "switch-2", `{"n":2}`)
	wantStatus(t, adoptedFirst, http.StatusCreated)

	first := enforce.Post("/orders", "switch-1", `{"n":1}`)
	wantStatus(t, first, http.StatusCreated)
	if first.Header.Get("Idempotent-Replayed") != "" || enforce.Upstream.CountKey("switch-1") != 1 {
		t.Fatalf("enforcement replayed a shadow record: %v", first.Header)
	}
	wantReplayOf(t, enforce.Post("/orders", "switch-1", `{"n":1}`), first)
	if n := enforce.Upstream.CountKey("switch-1"); n != 1 {
		t.Fatalf("enforced executions %d, want 1", n)
	}

	wantReplayOf(t, adopt.Post("/orders", "switch-2", `{"n":2}`), adoptedFirst)
	wantProblem(t, adopt.Post("/orders", "switch-2", `{"n":3}`), problem.KeyReused)
	if n := adopt.Upstream.CountKey("switch-2"); n != 0 {
		t.Fatalf("an adopted shadow record ran again: %d executions", n)
	}
}

// TestKeyGracePeriodEndsAtItsDate: before key.warn_until a request without
// the required key reaches the upstream with a Warning and is counted;
// from that instant on (an injected clock) it is refused with 400. Keyed
// requests are protected throughout.
func TestKeyGracePeriodEndsAtItsDate(t *testing.T) {
	deadline := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var now atomic.Int64
	now.Store(deadline.Add(-time.Second).UnixNano())
	m := observe.NewMetrics()
	env := harness.Start(t, harness.Options{
		Metrics: m,
		Now:     func() time.Time { return time.Unix(0, now.Load()) },
		Policies: policies(t, `
policies:
  - name: payments
    match: {methods: [POST]}
    key: {required: true, warn_until: 2026-03-01}
`),
	})
	r := env.Post("/charges", "", `{"amount":1}`)
	wantStatus(t, r, http.StatusCreated)
	want := `299 idem-extproc "Idempotency-Key will be required from 2026-03-01T00:00:00Z; requests without it will then be refused with 400"`
	if got := r.Header.Get("Warning"); got != want || attempt.GraceWarning("idempotency-key", deadline) != want {
		t.Fatalf("Warning %q, want %q", got, want)
	}
	if got := conversation(env); got != "request_headers:mode_override response_headers:continue" {
		t.Fatalf("keyless request in the grace period: %s", got)
	}
	keyed := env.Post("/charges", "pay-1", `{"amount":1}`)
	wantStatus(t, keyed, http.StatusCreated)
	if keyed.Header.Get("Warning") != "" {
		t.Fatal("a request with a key got the warning")
	}
	wantReplayOf(t, env.Post("/charges", "pay-1", `{"amount":1}`), keyed)
	if n := counter(t, m, "idem_extproc_key_warnings_total", "policy", "payments"); n != 1 {
		t.Fatalf("key warnings %v, want 1", n)
	}

	now.Store(deadline.UnixNano())
	wantProblem(t, env.Post("/charges", "", `{"amount":1}`), problem.KeyMissing)
	if n := env.Upstream.Count(func(e harness.Effect) bool { return e.Key == "" }); n != 1 {
		t.Fatalf("keyless executions %d, want only the one in the grace period", n)
	}
	if n := counter(t, m, "idem_extproc_key_warnings_total", "policy", "payments"); n != 1 {
		t.Fatalf("key warnings %v after the date, want still 1", n)
	}
}

// TestOffPolicyCostsNothing: a policy with enforcement off matches, counts
// requests with and without keys, and otherwise does nothing: duplicates,
// missing and malformed keys all pass, with one ext_proc message each and
// no Redis command.
func TestOffPolicyCostsNothing(t *testing.T) {
	m := observe.NewMetrics()
	env := harness.Start(t, harness.Options{Metrics: m, Policies: policies(t, `
policies:
  - name: legacy
    match: {methods: [POST]}
    enforcement: off
    key: {required: true}
`)})
	ctx := context.Background()
	if err := env.Store.Ping(ctx); err != nil { // warm the connection up
		t.Fatal(err)
	}
	before, err := env.Redis.CommandCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"off-1", "off-1", "", strings.Repeat("k", 300)} {
		r := env.Post("/orders", key, `{}`)
		wantStatus(t, r, http.StatusCreated)
		if got := conversation(env); got != "request_headers:mode_override" {
			t.Fatalf("key %q: %s", key, got)
		}
	}
	after, err := env.Redis.CommandCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("an off policy issued %d Redis commands", after-before)
	}
	if n := len(env.Upstream.Effects()); n != 4 {
		t.Fatalf("upstream executions %d, want 4", n)
	}
	if with, without := counter(t, m, "idem_extproc_requests_total", "policy", "legacy", "key", "present"),
		counter(t, m, "idem_extproc_requests_total", "policy", "legacy", "key", "absent"); with != 3 || without != 1 {
		t.Fatalf("requests with key %v, without %v; want 3 and 1", with, without)
	}
	if n := counter(t, m, "idem_extproc_decisions_total", "policy", "legacy", "decision", "bypassed"); n != 4 {
		t.Fatalf("bypassed %v, want 4", n)
	}
}

// TestShadowPassesWhenTheStoreIsDown: shadow never blocks, not even when
// Redis is gone: the request goes on (as fail_open would) and the failed
// measurement is counted.
func TestShadowPassesWhenTheStoreIsDown(t *testing.T) {
	m := observe.NewMetrics()
	env := harness.Start(t, harness.Options{Metrics: m, StoreTimeout: 200 * time.Millisecond, Policies: policies(t, `
default_policy:
  enforcement: shadow
  shadow_header: idempotency-shadow
`)})
	env.Redis.Kill()
	r := env.Post("/orders", "down-1", `{}`)
	wantStatus(t, r, http.StatusCreated)
	if got := r.Header.Get("Idempotency-Shadow"); got != "store-error" {
		t.Fatalf("Idempotency-Shadow %q", got)
	}
	if n := counter(t, m, "idem_extproc_shadow_decisions_total", "decision", "store_error"); n != 1 {
		t.Fatalf("store errors counted %v, want 1", n)
	}
	if n := counter(t, m, "idem_extproc_decisions_total", "decision", "store_unavailable"); n != 0 {
		t.Fatal("a shadow policy must not count a 503 it did not answer")
	}
}

// TestShadowGRPCNeverBlocks: gRPC calls under a shadow policy all reach
// the upstream, in the buffered and the full-duplex configurations, and
// get no shadow header (it is HTTP only).
func TestShadowGRPCNeverBlocks(t *testing.T) {
	for name, cfg := range map[string]func() *harness.Options{
		"buffered":    func() *harness.Options { return &harness.Options{} },
		"full duplex": func() *harness.Options { return &harness.Options{Filter: fullDuplexConfig()} },
	} {
		t.Run(name, func(t *testing.T) {
			m := observe.NewMetrics()
			opts := cfg()
			opts.Metrics = m
			opts.Policies = policies(t, `
default_policy:
  enforcement: shadow
  shadow_header: idempotency-shadow
`)
			env := harness.Start(t, *opts)
			up := &grpcUpstream{}
			for _, payload := range []string{"book", "book", "pen"} {
				res := grpcCall(env, up, "g-shadow", payload)
				wantGRPC(t, res, codes.OK, "")
				if _, ok := envoysim.Get(res.Response.Headers, "idempotency-shadow"); ok {
					t.Fatal("a gRPC response got the shadow header")
				}
			}
			if n := up.count("g-shadow"); n != 3 {
				t.Fatalf("upstream executions %d, want 3", n)
			}
			for _, d := range []idem.ShadowDecision{idem.ShadowWouldReserve, idem.ShadowWouldReplay, idem.ShadowWouldMismatch} {
				if n := counter(t, m, "idem_extproc_shadow_decisions_total", "decision", string(d)); n != 1 {
					t.Errorf("%s counted %v, want 1", d, n)
				}
			}
		})
	}
}

// TestAdoptionReport: GET /admin/v1/adoption, behind the admin token,
// summarises each policy in force: its enforcement, requests with and
// without keys, what shadow would have done, and what enforcement did.
func TestAdoptionReport(t *testing.T) {
	m := observe.NewMetrics()
	set := policies(t, `
policies:
  - name: legacy
    match: {path: {prefix: /legacy/}}
    enforcement: off
  - name: trial
    match: {path: {prefix: /trial/}}
    enforcement: shadow
    key: {required: true}
  - name: live
    match: {path: {prefix: /live/}}
    key: {required: true, warn_until: 2999-01-01}
default_policy:
  enabled: false
`)
	env := harness.Start(t, harness.Options{Metrics: m, Policies: set})
	for _, req := range []struct{ path, key, body string }{
		{"/legacy/a", "", "{}"}, {"/legacy/a", "", "{}"}, {"/legacy/a", "l-1", "{}"},
		{"/trial/a", "t-1", "{}"}, {"/trial/a", "t-1", "{}"}, {"/trial/a", "t-1", `{"x":1}`}, {"/trial/a", "", "{}"},
		{"/live/a", "v-1", "{}"}, {"/live/a", "v-1", "{}"}, {"/live/a", "v-1", `{"x":1}`}, {"/live/a", "", "{}"},
	} {
		if r := env.Post(req.path, req.key, req.body); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	// On the shadow policy, a duplicate while the first attempt runs
	// (would_conflict), and a retry after a client left mid-flight
	// (would_unknown). Shadow records are real, in the policy's own key
	// space, so their states can be awaited.
	trial := set.Policies[1]
	state := func(key string) idem.State {
		rec, err := env.Store.Get(context.Background(),
			idem.RecordIDFor(trial.RecordNamespace(), strings.TrimPrefix(env.URL, "http://"), key))
		if err != nil {
			return 0
		}
		return rec.State
	}
	slow := make(chan harness.Reply, 1)
	go func() { slow <- env.Post("/trial/a", "t-2", "{}", "x-upstream-delay", "400ms") }()
	testwait.For(t, func() bool { return state("t-2") == idem.StateInFlight })
	env.Post("/trial/a", "t-2", "{}")
	<-slow
	if err := env.Abandon("/trial/a", "t-3", "{}"); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, func() bool { return state("t-3") == idem.StateUnknown })
	env.Post("/trial/a", "t-3", "{}")

	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("adoption-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(admin.Handler(admin.Config{
		Store: env.Store.(admin.Store), Policies: func() *policy.Set { return set }, TokenFile: tokenFile,
		Logger: slog.New(slog.DiscardHandler), Counters: m,
	}))
	t.Cleanup(api.Close)
	get := func(token string) (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodGet, api.URL+admin.Prefix+"adoption", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	if resp, _ := get("wrong"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", resp.StatusCode)
	}
	resp, body := get("adoption-token")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var rep map[string]any
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	byName := map[string]map[string]any{}
	for _, p := range rep["policies"].([]any) {
		pm := p.(map[string]any)
		byName[pm["policy"].(string)] = pm
	}
	check := func(pol, field string, want any) {
		t.Helper()
		v := any(byName[pol])
		for _, part := range strings.Split(field, ".") {
			v = v.(map[string]any)[part]
		}
		if v != want {
			t.Errorf("%s.%s = %v, want %v\n%s", pol, field, v, want, body)
		}
	}
	if len(byName) != 3 || rep["since"] == nil {
		t.Fatalf("report %s", body)
	}
	check("legacy", "enforcement", "off")
	check("legacy", "requests", 3.0)
	check("legacy", "with_key", 1.0)
	check("legacy", "without_key", 2.0)
	check("legacy", "adoption_ratio", 1.0/3)
	check("trial", "enforcement", "shadow")
	check("trial", "adoption_ratio", 7.0/8)
	check("trial", "shadow.would_reserve", 3.0)
	check("trial", "shadow.would_replay", 1.0)
	check("trial", "shadow.would_conflict", 1.0)
	check("trial", "shadow.would_mismatch", 1.0)
	check("trial", "shadow.would_unknown", 1.0)
	check("trial", "shadow.would_reject", 1.0)
	check("trial", "shadow.duplicates_would_be_prevented", 4.0)
	check("trial", "replays_served", 0.0)
	check("live", "enforcement", "enforce")
	check("live", "warn_until", "2999-01-01T00:00:00Z")
	check("live", "key_warnings", 1.0)
	check("live", "replays_served", 1.0)
	check("live", "duplicates_prevented", 2.0)
	check("live", "shadow.would_replay", 0.0)
}

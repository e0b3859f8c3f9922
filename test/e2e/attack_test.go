package e2e

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// The attacks below each have a defined answer and leak nothing. They run
// through the Envoy-faithful proxy against a real Redis.

// TestAttackGuessingAnotherTenantsKey: a tenant who learns or guesses
// another tenant's key gets an operation of its own: never the other's
// stored response, never a 409 that blocks the other, never an overwrite.
func TestAttackGuessingAnotherTenantsKey(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, "defaults:\n  scope: {from: header, header: x-tenant}\n")})
	victim := func(body string, extra ...string) harness.Reply {
		return env.Post("/payments", "pay-2026-0001", body, append([]string{"x-tenant", "victim"}, extra...)...)
	}
	attacker := func(body string) harness.Reply {
		return env.Post("/payments", "pay-2026-0001", body, "x-tenant", "attacker")
	}
	secret := `{"iban":"DE89370400440532013000","amount":1000000}`
	// The victim's attempt is still running: the attacker is not told so.
	done := make(chan harness.Reply, 1)
	go func() { done <- victim(secret, "x-upstream-delay", "300ms") }()
	testwait.For(t, func() bool { return reservedCount(t, env) == 1 })
	probe := attacker(secret)
	wantStatus(t, probe, http.StatusCreated)
	if probe.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("the attacker got a replay")
	}
	orig := <-done
	// Every later attempt by the attacker is its own operation's replay.
	for _, body := range []string{secret, `{}`} {
		r := attacker(body)
		if strings.Contains(r.Body, "DE89") && r.Body == orig.Body {
			t.Fatal("the attacker received the victim's response")
		}
	}
	// The victim's record is untouched.
	wantReplayOf(t, victim(secret), orig)
}

// TestAttackReplayAcrossHostsAndPolicies: the same key under another host
// or another policy names another operation.
func TestAttackReplayAcrossHostsAndPolicies(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, `
policies:
  - name: admin-api
    match: {path: {prefix: /admin}, methods: [POST]}
default_policy:
  match: {methods: [POST]}
`)})
	a := env.Post("/orders", "k", `{"secret":"a"}`, "Host", "tenant-a.example.com")
	b := env.Post("/orders", "k", `{"secret":"a"}`, "Host", "tenant-b.example.com")
	c := env.Post("/admin/orders", "k", `{"secret":"a"}`, "Host", "tenant-a.example.com")
	for name, r := range map[string]harness.Reply{"a": a, "b": b, "c": c} {
		if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s: %d replayed=%q", name, r.Status, r.Header.Get("Idempotent-Replayed"))
		}
	}
	if a.Body == b.Body || a.Body == c.Body {
		t.Fatal("a response crossed hosts or policies")
	}
}

// TestAttackHeaderInjectionThroughStoredHeaders: a record altered in the
// store (or written by a buggy upstream) cannot make a replay carry split,
// smuggled or forbidden headers.
func TestAttackHeaderInjectionThroughStoredHeaders(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	authority := strings.TrimPrefix(env.URL, "http://")
	id := idem.RecordIDFor("default", authority, "injected")
	tok := idem.NewToken()
	ctx := context.Background()
	if _, err := env.Store.Reserve(ctx, idem.Reservation{ID: id, Token: tok, Fingerprint: fingerprintOf(`{}`, "/orders"),
		Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	evil := idem.Response{Status: 201, Body: []byte(`{"ok":true}`), Headers: []idem.Header{
		{Name: "x-fine", Value: "yes"},
		{Name: "x-split", Value: "a\r\nset-cookie: session=stolen"},
		{Name: "x-nul", Value: "a\x00b"},
		{Name: "bad name", Value: "v"},
		{Name: "X-Upper", Value: "v"},
		{Name: ":status", Value: "200"},
		{Name: "content-length", Value: "99999"},
		{Name: "transfer-encoding", Value: "chunked"},
		{Name: "x-envoy-original-path", Value: "/internal"},
		{Name: "idempotent-replayed", Value: "false"},
	}}
	if err := env.Store.Complete(ctx, id, tok, evil, time.Hour); err != nil {
		t.Fatal(err)
	}
	r := env.Post("/orders", "injected", `{}`)
	wantStatus(t, r, http.StatusCreated)
	if r.Header.Get("X-Fine") != "yes" || r.Body != `{"ok":true}` {
		t.Fatalf("the legitimate parts must replay: %v %q", r.Header, r.Body)
	}
	for _, h := range []string{"Set-Cookie", "X-Split", "X-Nul", "X-Upper", "Transfer-Encoding", "X-Envoy-Original-Path"} {
		if v := r.Header.Values(h); len(v) > 0 {
			t.Errorf("%s replayed: %q", h, v)
		}
	}
	if r.Header.Get("Idempotent-Replayed") != "true" || r.Header.Get("Content-Length") != strconv.Itoa(len(r.Body)) {
		t.Fatalf("marker or length forged: %v", r.Header)
	}
}

// TestAttackOversizedInputs: oversized keys, headers and bodies each get
// their defined answer and create no record.
func TestAttackOversizedInputs(t *testing.T) {
	env := harness.Start(t, harness.Options{FilterOptions: envoysimBuffer(8 << 20)})
	wantProblem(t, env.Post("/orders", strings.Repeat("k", 10_000), `{}`), problem.KeyInvalid)
	wantProblem(t, env.Post("/orders", "big-body", strings.Repeat("b", 2<<20)), problem.BodyTooLarge)
	// A huge header outside the fingerprint costs nothing and is forwarded.
	r := env.Post("/orders", "big-header", `{}`, "X-Padding", strings.Repeat("h", 60_000))
	wantStatus(t, r, http.StatusCreated)
	if n := reservedCount(t, env); n != 1 {
		t.Fatalf("records = %d, want only the well-formed request's", n)
	}
}

// TestAttackKeyFloodIsBounded: a flood of distinct keys cannot grow the
// store without bound: the in-memory store stops at its record limit and
// Redis at its maxmemory (noeviction); past them new keys get 503 while
// known keys are still answered.
func TestAttackKeyFloodIsBounded(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		env := harness.Start(t, harness.Options{Store: harness.Memory(memstore.Options{MaxRecords: 50})})
		first := env.Post("/orders", "flood-0", `{}`)
		refused := 0
		for i := 1; i < 200; i++ {
			if r := env.Post("/orders", "flood-"+strconv.Itoa(i), `{}`); r.Status == http.StatusServiceUnavailable {
				refused++
			}
		}
		if refused != 150 {
			t.Fatalf("refused %d of 199 new keys past a limit of 50, want 150", refused)
		}
		wantReplayOf(t, env.Post("/orders", "flood-0", `{}`), first)
	})
	t.Run("redis", func(t *testing.T) {
		env := harness.Start(t, harness.Options{Store: harness.NewRedis("--maxmemory-policy", "noeviction")})
		body := strings.Repeat("x", 900)
		first := env.Post("/orders", "flood-0", body)
		// The limit leaves room for a few hundred records over what Redis
		// holds with the first one (about 1 MiB, the store's scripts
		// loaded): the flood meets it after as many requests, not the
		// thousand or so a fixed 2 MiB takes.
		ctx := context.Background()
		base, err := strconv.Atoi(env.Redis.Info(ctx, "memory", "used_memory"))
		if err != nil {
			t.Fatal(err)
		}
		limit := base + 512<<10
		if err := env.Redis.Do(ctx, "CONFIG", "SET", "maxmemory", strconv.Itoa(limit)).Err(); err != nil {
			t.Fatal(err)
		}
		refused := 0
		for i := 1; i < 3000 && refused < 20; i++ {
			if r := env.Post("/orders", "flood-"+strconv.Itoa(i), body, "x-upstream-size", "1000"); r.Status == http.StatusServiceUnavailable {
				refused++
			}
		}
		if refused < 20 {
			t.Fatal("Redis never refused: the flood was not bounded")
		}
		n, err := strconv.Atoi(env.Redis.Info(ctx, "memory", "used_memory"))
		if err != nil {
			t.Fatal(err)
		}
		if n > limit+1<<20 {
			t.Fatalf("Redis used %d bytes past a maxmemory of %d", n, limit)
		}
		wantReplayOf(t, env.Post("/orders", "flood-0", body), first)
	})
}

// TestNoSecretsInLogs: a full run at debug level, with metrics and tracing
// on, never puts a raw key, a body or a credential header into a log line,
// a metric (label or value) or a span (name, attribute or event).
func TestNoSecretsInLogs(t *testing.T) {
	var logs harness.LogBuffer
	metrics := observe.NewMetrics()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	env := harness.Start(t, harness.Options{
		Logger:         slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:        metrics,
		TracerProvider: tp,
	})
	secrets := []string{"key-S3CR3T-4242", "body-CONFIDENTIAL-9876", "Bearer tok-PRIVATE-1357", "cookie-SESSION-2468"}
	for i := range 3 {
		env.Post("/orders", secrets[0], `{"v":"`+secrets[1]+`"}`, "Authorization", secrets[2], "Cookie", secrets[3],
			"x-upstream-status", []string{"201", "500", "429"}[i])
	}
	env.Post("/orders", secrets[0], `{"other":"`+secrets[1]+`"}`)
	env.Do(http.MethodPost, "/orders", `{"v":"`+secrets[1]+`"}`, 50*time.Millisecond, "Idempotency-Key", secrets[0]+"-2",
		"x-upstream-delay", "200ms", "Authorization", secrets[2])
	time.Sleep(300 * time.Millisecond)

	scrape := httptest.NewRecorder()
	metrics.Handler().ServeHTTP(scrape, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	var traced strings.Builder
	for _, s := range spans.Ended() {
		traced.WriteString(s.Name() + "\n")
		for _, a := range s.Attributes() {
			traced.WriteString(string(a.Key) + "=" + a.Value.String() + "\n")
		}
		for _, e := range s.Events() {
			traced.WriteString(e.Name + "\n")
			for _, a := range e.Attributes {
				traced.WriteString(string(a.Key) + "=" + a.Value.String() + "\n")
			}
		}
	}
	outputs := map[string]string{"logs": logs.String(), "metrics": scrape.Body.String(), "spans": traced.String()}
	for name, proof := range map[string]string{"logs": `"decision"`, "metrics": "idem_extproc_decisions_total", "spans": "idem.key_hash"} {
		if !strings.Contains(outputs[name], proof) {
			t.Fatalf("the %s hold no %s: the scan would prove nothing", name, proof)
		}
	}
	for name, out := range outputs {
		for _, s := range secrets {
			for _, part := range strings.Fields(s) {
				if strings.Contains(out, part) && part != "Bearer" {
					t.Errorf("the %s contain %q", name, part)
				}
			}
		}
	}
}

func envoysimBuffer(n int) envoysim.Options { return envoysim.Options{BufferLimit: n} }

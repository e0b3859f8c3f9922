package e2e

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// logLines returns the JSON log lines whose msg is msg.
func logLines(t *testing.T, logs *harness.LogBuffer, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if line == "" || json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestRedisDownFailsOpen: a fail_open policy lets protected requests
// through unprotected while Redis is down, each one logged (the count of
// such lines is the count of unprotected requests until metrics exist), and
// protects again once Redis is back, without a server restart.
func TestRedisDownFailsOpen(t *testing.T) {
	var logs harness.LogBuffer
	p := policy.Default()
	p.FailureMode = policy.FailOpen
	// A store budget of 100 ms inside a message_timeout of 1 s: the server
	// decides (passes the request) before Envoy's timer, even on a loaded
	// machine (150 ms left a -race run under load too little).
	cfg := envoysim.RecommendedConfig()
	cfg.MessageTimeout = durationpb.New(time.Second)
	env := harness.Start(t, harness.Options{
		Policies: &policy.Set{Policies: []*policy.Policy{p}}, Filter: cfg, StoreTimeout: idem.DefaultStoreTimeout,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	wantStatus(t, env.Post("/orders", "open-before", `{}`), http.StatusCreated)

	env.Redis.Kill()
	const n = 4
	for i := range n {
		// The same key each time: unprotected, every attempt executes.
		r := env.Post("/orders", "open-during", `{}`)
		wantStatus(t, r, http.StatusCreated)
		if r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("attempt %d marked as a replay with the store down", i)
		}
	}
	if got := env.Upstream.CountKey("open-during"); got != n {
		t.Fatalf("effects during the outage = %d, want %d (fail_open passes every request)", got, n)
	}
	lines := logLines(t, &logs, "store unavailable; request passes unprotected (fail_open)")
	if len(lines) != n {
		t.Fatalf("%d fail_open log lines, want one per request (%d)", len(lines), n)
	}
	for _, l := range lines {
		if l["level"] != "WARN" || l["key_hash"] == nil || l["error"] == nil {
			t.Fatalf("fail_open line lacks fields: %v", l)
		}
	}

	env.Redis.Restart()
	var first harness.Reply
	testwait.For(t, func() bool {
		first = env.Post("/orders", "open-after", `{"a":1}`)
		return first.Header.Get("Idempotent-Replayed") == "" && env.Upstream.CountKey("open-after") >= 1 &&
			recordState(t, env, "open-after") == idem.StateCompleted
	})
	wantStatus(t, first, http.StatusCreated)
	wantReplayOf(t, env.Post("/orders", "open-after", `{"a":1}`), first)
}

// TestCompletionLostEndsUnknown: Redis is gone when the upstream's answer
// arrives, so the completion cannot be written, neither at once nor by the
// retries at the stream's end. That is logged at error level; when Redis is
// back (with its data: AOF), the record it kept is in flight with a lease
// nobody renews, and once the lease ends a retry gets 409 outcome-unknown:
// never a second execution.
func TestCompletionLostEndsUnknown(t *testing.T) {
	var logs harness.LogBuffer
	p := policy.Default()
	p.Lease = time.Second
	metrics := observe.NewMetrics()
	env := harness.Start(t, harness.Options{
		Store:        harness.OnRedis(redistest.Start(t, redistest.Options{Persist: true})),
		Policies:     &policy.Set{Policies: []*policy.Policy{p}},
		StoreTimeout: idem.DefaultStoreTimeout,
		Logger:       slog.New(slog.NewJSONHandler(&logs, nil)),
		Metrics:      metrics,
	})
	done := make(chan harness.Reply, 1)
	go func() { done <- env.Post("/orders", "lost-completion", `{}`, "x-upstream-delay", "400ms") }()
	// Kill Redis once the upstream has the request, not once the record
	// exists: the record is there as soon as Redis ran the reservation,
	// before its reply reached the server, and a kill in between is a 503.
	testwait.Until(t, "the request at the upstream", func() bool { return env.Upstream.ArrivedKey("lost-completion") == 1 })
	env.Redis.Kill()
	wantStatus(t, <-done, http.StatusCreated) // the client still gets the upstream's answer
	testwait.For(t, func() bool {
		return len(logLines(t, &logs, "record not settled; it turns unknown when its lease ends")) == 1
	})
	if l := logLines(t, &logs, "record not settled; will retry when the stream ends"); len(l) != 1 || l[0]["outcome"] != "stored" {
		t.Fatalf("first failure not logged as a complete to retry: %v", l)
	}
	if got := settleFailures(t, metrics); got != 1 {
		t.Fatalf("settle failures counted %v, want 1", got)
	}

	env.Redis.Restart()
	// Redis kept the record (AOF) in flight; its one-second lease ended
	// during the five seconds of retries, and nobody renewed it: the
	// outcome is unknown, never a free key.
	testwait.For(t, func() bool { return recordState(t, env, "lost-completion") == idem.StateInFlight })
	wantProblem(t, env.Post("/orders", "lost-completion", `{}`), problem.OutcomeUnknown)
	if n := env.Upstream.CountKey("lost-completion"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// TestCompletionRetriedAtStreamEnd: Redis hangs when the answer arrives, so
// the completion times out within the store budget (the answer is not held
// back for it); Redis recovers as the answer goes out, the stream's end
// retries the completion, and the client's retry is a replay. (The stream's
// end keeps retrying for the server's SettleAtEndTimeout, five seconds: it
// covers a blip, not an outage; TestCompletionLostEndsUnknown covers that.)
func TestCompletionRetriedAtStreamEnd(t *testing.T) {
	var logs harness.LogBuffer
	env := harness.Start(t, harness.Options{StoreTimeout: idem.DefaultStoreTimeout,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	done := make(chan harness.Reply, 1)
	go func() { done <- env.Post("/orders", "late-completion", `{}`, "x-upstream-delay", "300ms") }()
	testwait.For(t, func() bool { return recordState(t, env, "late-completion") == idem.StateInFlight })
	env.Redis.Freeze()
	first := <-done
	env.Redis.Thaw()
	wantStatus(t, first, http.StatusCreated)
	if len(logLines(t, &logs, "record not settled; will retry when the stream ends")) != 1 {
		t.Fatal("the completion should have failed while Redis hung")
	}
	testwait.For(t, func() bool { return len(logLines(t, &logs, "settled on retry")) == 1 })
	wantReplayOf(t, env.Post("/orders", "late-completion", `{}`), first)
	if n := env.Upstream.CountKey("late-completion"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// settleFailures returns how many settle failures m counted.
func settleFailures(t *testing.T, m *observe.Metrics) float64 {
	t.Helper()
	return counterTotal(t, m, "idem_extproc_settle_failures_total")
}

// counterTotal sums every series of the counter family name in m.
func counterTotal(t *testing.T, m *observe.Metrics, name string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() == name {
			for _, s := range f.GetMetric() {
				total += s.GetCounter().GetValue()
			}
		}
	}
	return total
}

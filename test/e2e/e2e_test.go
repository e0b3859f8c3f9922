// Package e2e holds the end-to-end tests: HTTP in through an
// Envoy-faithful proxy, the idem-extproc server over real ext_proc gRPC, a
// real redis-server, and a counting upstream.
package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// leaveAfterExchange posts body with key and gives up as soon as the proxy
// has run the exchange through the filter and the upstream, while the
// response is still held back (the env needs a ResponseDelay): a response
// lost on the way back, after the server saw it.
func leaveAfterExchange(t *testing.T, env *harness.Env, path, key, body string) harness.Reply {
	t.Helper()
	before := len(env.Results())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan harness.Reply, 1)
	go func() {
		done <- env.DoContext(ctx, http.MethodPost, path, body, "Idempotency-Key", key)
	}()
	testwait.For(t, func() bool {
		select {
		case r := <-done:
			t.Fatalf("answered (%d, %v) before the client could leave", r.Status, r.Err)
		default:
		}
		return len(env.Results()) > before
	})
	cancel()
	return <-done
}

// wantProblem checks an RFC 9457 answer of the given kind.
func wantProblem(t *testing.T, r harness.Reply, k problem.Kind) map[string]any {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("request failed: %v", r.Err)
	}
	if r.Status != k.Status {
		t.Fatalf("status = %d, want %d (%s); body %s", r.Status, k.Status, k.Slug, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != problem.ContentType {
		t.Fatalf("content-type = %q, want %q", ct, problem.ContentType)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
		t.Fatalf("problem body %q: %v", r.Body, err)
	}
	if p["type"] != problem.TypeBase+k.Slug || p["title"] != k.Title || p["status"] != float64(k.Status) || p["detail"] == "" {
		t.Fatalf("problem = %v, want type %s", p, k.Slug)
	}
	return p
}

func wantStatus(t *testing.T, r harness.Reply, status int) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("request failed: %v", r.Err)
	}
	if r.Status != status {
		t.Fatalf("status = %d, want %d; body %s", r.Status, status, r.Body)
	}
}

// wantReplayOf checks that r repeats first byte for byte, marked as a replay.
func wantReplayOf(t *testing.T, r, first harness.Reply) {
	t.Helper()
	wantStatus(t, r, first.Status)
	if r.Body != first.Body {
		t.Fatalf("replayed body %q, want %q", r.Body, first.Body)
	}
	if r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay lacks Idempotent-Replayed: true; headers %v", r.Header)
	}
	if first.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("the first answer must not be marked as a replay")
	}
	for name, vals := range first.Header {
		switch http.CanonicalHeaderKey(name) {
		case "Date", "X-Envoy-Upstream-Service-Time", "Content-Length":
			continue
		}
		if got := r.Header.Values(name); strings.Join(got, "\x00") != strings.Join(vals, "\x00") {
			t.Fatalf("replayed %s = %q, want %q", name, got, vals)
		}
	}
}

// TestArticleOutcomes plays the four outcomes of the source article for one
// operation key: first success, response lost after the write, the same
// request again, and a different request under the same key.
func TestArticleOutcomes(t *testing.T) { articleOutcomes(t, standalone) }

// backend starts an Env on one kind of store, so the same scenarios run on
// standalone Redis, Sentinel and Cluster (topology_test.go).
type backend func(t *testing.T, opts harness.Options) *harness.Env

// standalone starts its own redis-server.
func standalone(t *testing.T, opts harness.Options) *harness.Env { return harness.Start(t, opts) }

func articleOutcomes(t *testing.T, start backend) {
	env := start(t, harness.Options{ResponseDelay: 300 * time.Millisecond})
	const key = "order-42"
	body := `{"item":"book","amount":100}`

	// 1. First request: executed once, answered 201.
	first := env.Post("/orders", key, body)
	wantStatus(t, first, http.StatusCreated)
	if n := env.Upstream.CountKey(key); n != 1 {
		t.Fatalf("effects after first request = %d, want 1", n)
	}

	// 2. A second operation whose response is lost after the write: the
	// client gives up before the answer reaches it, the upstream finished.
	// The client leaves once the proxy has run the whole exchange (its
	// result is observed just before the response is held back for
	// ResponseDelay), not after a fixed timeout, which a loaded machine
	// could reach before the request even got to the upstream.
	const key2 = "order-43"
	if lost := leaveAfterExchange(t, env, "/orders", key2, body); lost.Err == nil {
		t.Fatalf("the client should have given up, got %d", lost.Status)
	}
	retry := env.Post("/orders", key2, body)
	wantStatus(t, retry, http.StatusCreated)
	if retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("the retry after a lost response must be a replay")
	}
	if n := env.Upstream.CountKey(key2); n != 1 {
		t.Fatalf("effects for the lost-response operation = %d, want 1", n)
	}

	// 3. The same request again: the same stored result, marked as replay.
	again := env.Post("/orders", key, body)
	wantReplayOf(t, again, first)

	// 4. Same key, different body: a conflict before any new effect.
	other := env.Post("/orders", key, `{"item":"book","amount":10000}`)
	wantProblem(t, other, problem.KeyReused)
	if n := env.Upstream.CountKey(key); n != 1 {
		t.Fatalf("effects after all attempts = %d, want 1", n)
	}
}

// TestConcurrentAttemptsExecuteOnce sends 100 attempts of one operation at
// once: exactly one reaches the upstream; every other is told it is in
// progress (409) or, once the first finished, gets its replay.
func TestConcurrentAttemptsExecuteOnce(t *testing.T) { concurrentAttempts(t, standalone) }

func concurrentAttempts(t *testing.T, start backend) {
	env := start(t, harness.Options{})
	const n = 100
	var wg sync.WaitGroup
	replies := make([]harness.Reply, n)
	gate := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-gate
			replies[i] = env.Post("/orders", "concurrent-1", `{"n":1}`, "x-upstream-delay", "300ms")
		})
	}
	close(gate)
	wg.Wait()
	if got := env.Upstream.CountKey("concurrent-1"); got != 1 {
		t.Fatalf("upstream executed the operation %d times, want 1", got)
	}
	var created, inProgress, replayed int
	for _, r := range replies {
		switch {
		case r.Err != nil:
			t.Fatalf("request failed: %v", r.Err)
		case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "true":
			replayed++
		case r.Status == http.StatusCreated:
			created++
		case r.Status == http.StatusConflict:
			wantProblem(t, r, problem.InProgress)
			if r.Header.Get("Retry-After") != "1" {
				t.Fatalf("409 in progress with Retry-After %q, want 1", r.Header.Get("Retry-After"))
			}
			inProgress++
		default:
			t.Fatalf("unexpected answer %d %s", r.Status, r.Body)
		}
	}
	t.Logf("created %d, in progress %d, replayed %d", created, inProgress, replayed)
	if created != 1 || inProgress+replayed != n-1 {
		t.Fatalf("created %d, in progress %d, replayed %d", created, inProgress, replayed)
	}
}

// TestMismatchWhileInFlight: a different request under a key whose first
// attempt still runs is a 422, not a 409, and causes no effect.
func TestMismatchWhileInFlight(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	done := make(chan harness.Reply)
	go func() { done <- env.Post("/orders", "k-inflight", `{"a":1}`, "x-upstream-delay", "400ms") }()
	testwait.For(t, func() bool { return reservedCount(t, env) == 1 })
	wantProblem(t, env.Post("/orders", "k-inflight", `{"a":2}`), problem.KeyReused)
	wantProblem(t, env.Post("/orders", "k-inflight", `{"a":1}`), problem.InProgress)
	wantStatus(t, <-done, http.StatusCreated)
	if n := env.Upstream.CountKey("k-inflight"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// reservedCount counts the records in Redis.
func reservedCount(t *testing.T, env *harness.Env) int {
	t.Helper()
	keys, err := env.Redis.Client().Keys(context.Background(), "idem:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// TestStreamResetAfterReservation: the client goes away while the upstream
// works; Envoy resets the ext_proc stream. The record turns unknown, so the
// retry gets 409 outcome-unknown, and the upstream count stays 1.
func TestStreamResetAfterReservation(t *testing.T) { streamReset(t, standalone) }

func streamReset(t *testing.T, start backend) {
	env := start(t, harness.Options{})
	if err := env.Abandon("/orders", "reset-1", `{"x":1}`); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, func() bool { return env.Upstream.CountKey("reset-1") == 1 })
	// The ext_proc stream was reset when the client left; the record must
	// say unknown, never be free.
	testwait.For(t, func() bool { return recordState(t, env, "reset-1") == idem.StateUnknown })
	retry := env.Post("/orders", "reset-1", `{"x":1}`)
	wantProblem(t, retry, problem.OutcomeUnknown)
	if n := env.Upstream.CountKey("reset-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// recordState reads the state of key's record under the default policy,
// scoped by the proxy's authority; 0 when there is none.
func recordState(t *testing.T, env *harness.Env, key string) idem.State {
	t.Helper()
	authority := strings.TrimPrefix(env.URL, "http://")
	rec, err := env.Store.Get(context.Background(), idem.RecordIDFor("default", authority, key))
	if err != nil {
		return 0
	}
	return rec.State
}

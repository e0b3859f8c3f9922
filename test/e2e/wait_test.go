package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// waitingEnv runs a policy with wait_for_in_flight behind a filter whose
// message_timeout is shorter than the wait: only the server's
// override_message_timeout (within max_message_timeout) keeps Envoy from
// answering 504 while a duplicate waits.
func waitingEnv(t *testing.T, wait time.Duration, memory bool) *harness.Env {
	p := policy.Default()
	p.WaitForInFlight = wait
	cfg := envoysim.RecommendedConfig()
	cfg.MessageTimeout = durationpb.New(time.Second)
	cfg.MaxMessageTimeout = durationpb.New(30 * time.Second) // above the wait plus two store budgets
	var store harness.StoreOption                            // a redis-server of its own
	if memory {
		store = harness.Memory(memstore.Options{})
	}
	return harness.Start(t, harness.Options{Store: store, Filter: cfg, Policies: &policy.Set{Policies: []*policy.Policy{p}}})
}

// TestWaitForInFlightReplays: 50 duplicates arriving while the first
// attempt runs all wait for it and receive its replay; the operation runs
// once.
func TestWaitForInFlightReplays(t *testing.T) {
	for _, memory := range []bool{false, true} {
		name := "redis"
		if memory {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) {
			env := waitingEnv(t, 5*time.Second, memory)
			first := make(chan harness.Reply, 1)
			go func() { first <- env.Post("/orders", "wait-1", `{"w":1}`, "x-upstream-delay", "1500ms") }()
			testwait.For(t, func() bool {
				return env.Upstream.CountKey("wait-1") == 0 && len(env.Results()) == 0 && recordState(t, env, "wait-1") != 0
			})
			const n = 50
			var wg sync.WaitGroup
			replies := make([]harness.Reply, n)
			for i := range n {
				wg.Go(func() { replies[i] = env.Post("/orders", "wait-1", `{"w":1}`, "x-upstream-delay", "1500ms") })
			}
			wg.Wait()
			orig := <-first
			wantStatus(t, orig, http.StatusCreated)
			for i, r := range replies {
				if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || r.Body != orig.Body {
					t.Fatalf("duplicate %d: %d %q replayed=%q", i, r.Status, r.Body, r.Header.Get("Idempotent-Replayed"))
				}
			}
			if c := env.Upstream.CountKey("wait-1"); c != 1 {
				t.Fatalf("effects = %d, want 1", c)
			}
		})
	}
}

// TestWaitForInFlightIsBounded: past the bound the duplicate gets the 409.
func TestWaitForInFlightIsBounded(t *testing.T) {
	env := waitingEnv(t, 300*time.Millisecond, false)
	first := make(chan harness.Reply, 1)
	go func() { first <- env.Post("/orders", "wait-2", `{}`, "x-upstream-delay", "2s") }()
	testwait.For(t, func() bool { return recordState(t, env, "wait-2") != 0 })
	start := time.Now()
	r := env.Post("/orders", "wait-2", `{}`)
	wantProblem(t, r, problem.InProgress)
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("answered after %v: the duplicate should have waited its bound", waited)
	}
	wantStatus(t, <-first, http.StatusCreated)
}

// TestWaitForInFlightAfterRelease: when the first attempt is released (the
// upstream said 429), a waiting duplicate runs the operation itself.
func TestWaitForInFlightAfterRelease(t *testing.T) {
	env := waitingEnv(t, 5*time.Second, false)
	first := make(chan harness.Reply, 1)
	go func() {
		first <- env.Post("/orders", "wait-3", `{}`, "x-upstream-delay", "500ms", "x-upstream-status", "429")
	}()
	testwait.For(t, func() bool { return recordState(t, env, "wait-3") != 0 })
	r := env.Post("/orders", "wait-3", `{}`)
	wantStatus(t, r, http.StatusCreated)
	if r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("a released operation must run again, not replay")
	}
	if got := (<-first).Status; got != http.StatusTooManyRequests {
		t.Fatalf("first = %d", got)
	}
	if c := env.Upstream.CountKey("wait-3"); c != 2 {
		t.Fatalf("effects = %d, want 2 (the 429 and the retry)", c)
	}
}

// TestWaitForInFlightDoesNotPoll: a duplicate waiting for the first
// attempt is woken by Redis pub/sub (watch.lua marks the record, the
// settling script publishes), so the scripts Redis runs during the wait are
// a fixed handful, however long it lasts. A poller asking every few
// milliseconds would run hundreds in the 1.5 s the first attempt takes.
func TestWaitForInFlightDoesNotPoll(t *testing.T) {
	env := waitingEnv(t, 10*time.Second, false)
	first := make(chan harness.Reply, 1)
	go func() { first <- env.Post("/orders", "poll-1", `{}`, "x-upstream-delay", "1500ms") }()
	testwait.For(t, func() bool { return recordState(t, env, "poll-1") == idem.StateInFlight })
	before := scriptCalls(t, env)
	dup := env.Post("/orders", "poll-1", `{}`)
	orig := <-first
	after := scriptCalls(t, env)
	wantStatus(t, orig, http.StatusCreated)
	if dup.Header.Get("Idempotent-Replayed") != "true" || dup.Body != orig.Body {
		t.Fatalf("the duplicate got %d %q, want the first attempt's replay", dup.Status, dup.Body)
	}
	// The duplicate's reservation, its watch, the first attempt's
	// completion and the duplicate's second reservation: four, plus an
	// EVAL for each script Redis had not cached yet.
	if n := after - before; n > 8 {
		t.Fatalf("Redis ran %d scripts while one duplicate waited 1.5 s: it is being polled", n)
	} else {
		t.Logf("Redis ran %d scripts during the wait", n)
	}
}

// scriptCalls counts the scripts Redis has run (EVALSHA and EVAL, the
// store's only way to read or change a record). INFO commandstats also
// counts the commands scripts call, so the total would say little.
func scriptCalls(t *testing.T, env *harness.Env) int64 {
	t.Helper()
	info, err := env.Redis.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro":
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			c, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatalf("commandstats line %q", line)
			}
			n += c
		}
	}
	return n
}

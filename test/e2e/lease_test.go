package e2e

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// TestLeaseRenewedWhileStreamOpen: a request that outlives its lease keeps
// its reservation while Envoy's stream is open, so no retry sees it as
// abandoned.
func TestLeaseRenewedWhileStreamOpen(t *testing.T) {
	p := policy.Default()
	// The renewal comes at half the lease: a lease of 1 s leaves it 500 ms
	// of slack on a loaded machine (300 ms, as before, left 150 ms, less
	// than a busy -race run can stall a goroutine), and the upstream's 4 s
	// leave the duplicate below ample room to arrive while it is in flight.
	p.Lease = time.Second
	env := harness.Start(t, harness.Options{Policies: &policy.Set{Policies: []*policy.Policy{p}}})
	done := make(chan harness.Reply, 1)
	go func() { done <- env.Post("/orders", "slow", `{}`, "x-upstream-delay", "4s") }()
	testwait.For(t, func() bool { return recordState(t, env, "slow") == idem.StateInFlight })
	time.Sleep(2200 * time.Millisecond) // more than two leases
	wantProblem(t, env.Post("/orders", "slow", `{}`), problem.InProgress)
	wantStatus(t, <-done, http.StatusCreated)
	if s := recordState(t, env, "slow"); s != idem.StateCompleted {
		t.Fatalf("state %v, want completed", s)
	}
}

// TestAttemptsAreTraceable: every decision's log line names the operation
// (hashed key), the scope, the request id and the attempt number, and never
// the raw key.
func TestAttemptsAreTraceable(t *testing.T) {
	var logs harness.LogBuffer
	env := harness.Start(t, harness.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	const key = "trace-me-7f3a"
	for i := 1; i <= 3; i++ {
		env.Post("/orders", key, `{}`, "X-Request-Id", "req-"+string(rune('0'+i)))
	}
	var attempts []float64
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, key) {
			t.Fatalf("raw key in a log line: %s", line)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] != "decision" {
			continue
		}
		if m["key_hash"] == "" || m["scope"] == "" || m["policy"] != "default" || m["latency_ms"] == nil {
			t.Fatalf("decision line lacks fields: %s", line)
		}
		if want := "req-" + string(rune('0'+len(attempts)+1)); m["request_id"] != want {
			t.Fatalf("request_id %v, want %s", m["request_id"], want)
		}
		attempts = append(attempts, m["attempt"].(float64))
	}
	if len(attempts) != 3 || attempts[0] != 1 || attempts[1] != 2 || attempts[2] != 3 {
		t.Fatalf("attempt numbers %v, want 1 2 3", attempts)
	}
}

package idemclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// TestEveryAttemptIsTraceable: one span, one log line and one OnAttempt
// call per attempt, each with the key, the attempt number and its request
// id; the stop carries the problem type.
func TestEveryAttemptIsTraceable(t *testing.T) {
	s := newScript(t, prob(problem.InProgress, "Retry-After", "1"), prob(problem.OutcomeUnknown))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var logs bytes.Buffer
	var mu sync.Mutex
	var hooks []Attempt
	tr, _ := newTestTransport(Options{
		TracerProvider: tp,
		Logger:         slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnAttempt:      func(a Attempt) { mu.Lock(); hooks = append(hooks, a); mu.Unlock() },
	})
	_, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "op-1", "b"))
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("err %v", err)
	}
	sent := s.Seen()
	spans := rec.Ended()
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(sent) != 2 || len(spans) != 2 || len(lines) != 2 || len(hooks) != 2 {
		t.Fatalf("%d attempts, %d spans, %d log lines, %d hooks", len(sent), len(spans), len(lines), len(hooks))
	}
	wantOutcome := []Outcome{OutcomeRetry, OutcomeStop}
	for i := range 2 {
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range spans[i].Attributes() {
			attrs[kv.Key] = kv.Value
		}
		if attrs["idem.key"].AsString() != "op-1" || attrs["idem.attempt"].AsInt64() != int64(i+1) ||
			attrs["http.request.header.x-request-id"].AsString() != sent[i].RequestID ||
			attrs["idem.outcome"].AsString() != string(wantOutcome[i]) || attrs["http.response.status_code"].AsInt64() != 409 {
			t.Fatalf("span %d attributes %v", i+1, attrs)
		}
		var line map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &line); err != nil {
			t.Fatal(err)
		}
		if line["idempotency_key"] != "op-1" || line["attempt"] != float64(i+1) || line["request_id"] != sent[i].RequestID || line["outcome"] != string(wantOutcome[i]) {
			t.Fatalf("log line %d: %v", i+1, line)
		}
		h := hooks[i]
		if h.Key != "op-1" || h.Number != i+1 || h.RequestID != sent[i].RequestID || h.Outcome != wantOutcome[i] || h.Status != 409 {
			t.Fatalf("hook %d: %+v", i+1, h)
		}
	}
	if hooks[1].ProblemType != problem.TypeBase+problem.OutcomeUnknown.Slug || spans[1].Status().Code.String() != "Error" {
		t.Fatalf("the stop lacks its problem: %+v, span status %v", hooks[1], spans[1].Status())
	}
	if lines[0] == "" || !strings.Contains(lines[0], `"level":"INFO"`) || !strings.Contains(lines[1], `"level":"WARN"`) {
		t.Fatalf("levels: %s", logs.String())
	}
}

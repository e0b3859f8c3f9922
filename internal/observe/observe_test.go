package observe_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// TestTracesFollowTheRequest: each ext_proc stream is a span under the
// request's W3C traceparent, with a child per phase and, under those, a
// span per store call.
func TestTracesFollowTheRequest(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	env := harness.Start(t, harness.Options{
		TracerProvider: tp,
		WrapStore: func(st idem.Store) idem.Store {
			return observe.InstrumentStore(st, observe.NewMetrics(), tp)
		},
	})
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	r := env.Post("/orders", "traced", `{}`, "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if r.Status != 201 {
		t.Fatalf("status %d", r.Status)
	}
	// The stream's span ends when Envoy closes the stream, just after the
	// response went out.
	deadline := time.Now().Add(5 * time.Second)
	for !hasSpan(rec.Ended(), "idem-extproc stream") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	stream, ok := spans["idem-extproc stream"]
	if !ok {
		t.Fatalf("no stream span among %v", names(rec.Ended()))
	}
	if stream.SpanContext().TraceID().String() != traceID || stream.Parent().SpanID().String() != parentID {
		t.Fatalf("stream span in trace %s under %s, want %s under %s",
			stream.SpanContext().TraceID(), stream.Parent().SpanID(), traceID, parentID)
	}
	childOf := func(child, parent string) {
		t.Helper()
		c, ok1 := spans[child]
		p, ok2 := spans[parent]
		if !ok1 || !ok2 {
			t.Fatalf("missing %s or %s among %v", child, parent, names(rec.Ended()))
		}
		if c.Parent().SpanID() != p.SpanContext().SpanID() || c.SpanContext().TraceID().String() != traceID {
			t.Fatalf("%s is not a child of %s", child, parent)
		}
	}
	for _, phase := range []string{"request_headers", "request_body", "response_headers", "response_body"} {
		childOf("ext_proc "+phase, "idem-extproc stream")
	}
	childOf("store.reserve", "ext_proc request_body")
	childOf("store.complete", "ext_proc response_body")
	attrs := map[string]string{}
	for _, kv := range stream.Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	if attrs["idem.policy"] != "default" || attrs["idem.decision"] != "stored" || attrs["idem.attempt"] != "1" || attrs["idem.key_hash"] == "" {
		t.Fatalf("stream span attributes %v", attrs)
	}
	for _, v := range attrs {
		if v == "traced" {
			t.Fatal("the raw key must not be on a span")
		}
	}
}

func hasSpan(spans []sdktrace.ReadOnlySpan, name string) bool {
	for _, s := range spans {
		if s.Name() == name {
			return true
		}
	}
	return false
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, 0, len(spans))
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func TestTracingEnabled(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
	} {
		if got := observe.TracingEnabled(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("TracingEnabled(%v) = %v", tc.env, got)
		}
	}
	if _, _, err := observe.NewTracerProvider(context.Background(), func(k string) string {
		return map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}[k]
	}); err == nil {
		t.Error("an unknown OTLP protocol must be an error")
	}
}

package extproc

import (
	"context"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// headerCarrier reads W3C trace context from Envoy's request headers.
type headerCarrier struct{ m *corev3.HeaderMap }

func (c headerCarrier) Get(key string) string {
	for _, h := range c.m.GetHeaders() {
		if h.GetKey() == key {
			return headerValue(h)
		}
	}
	return ""
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c.m.GetHeaders()))
	for _, h := range c.m.GetHeaders() {
		keys = append(keys, h.GetKey())
	}
	return keys
}

var traceContext = propagation.TraceContext{}

// phaseSpanNames name the span of each phase's message.
var phaseSpanNames = [...]string{
	phaseRequestHeaders:   "ext_proc request_headers",
	phaseRequestBody:      "ext_proc request_body",
	phaseRequestTrailers:  "ext_proc request_trailers",
	phaseResponseHeaders:  "ext_proc response_headers",
	phaseResponseBody:     "ext_proc response_body",
	phaseResponseTrailers: "ext_proc response_trailers",
}

// streamTrace is a stream's span; ctx carries it for work done after the
// stream's own context ended. Both are nil when tracing is off.
type streamTrace struct {
	span trace.Span
	ctx  context.Context
}

// startPhase opens the span of one message, as a child of the stream's
// span; the stream's span starts with the first message, under the
// traceparent of the request's headers when there is one.
func (t *streamTrace) startPhase(ctx context.Context, tracer trace.Tracer, m *message) (context.Context, trace.Span) {
	if tracer == nil {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op span, shared
	}
	if t.span == nil {
		parent := ctx
		if m.phase == phaseRequestHeaders {
			parent = traceContext.Extract(ctx, headerCarrier{m.headers.GetHeaders()})
		}
		t.ctx, t.span = tracer.Start(parent, "idem-extproc stream", trace.WithSpanKind(trace.SpanKindServer))
	}
	name := "ext_proc unknown"
	if m.known {
		name = phaseSpanNames[m.phase]
	}
	return tracer.Start(trace.ContextWithSpan(ctx, t.span), name)
}

// background returns a context carrying the stream's span.
func (t *streamTrace) background() context.Context {
	if t.ctx != nil {
		return t.ctx
	}
	return context.Background()
}

// decided puts a decision on the stream's span.
func (t *streamTrace) decided(d idem.Decision) {
	if t.span != nil {
		t.span.AddEvent(string(d))
		t.span.SetAttributes(attribute.String("idem.decision", string(d)))
	}
}

// shadowed puts a shadow policy's decision on the stream's span.
func (t *streamTrace) shadowed(d idem.ShadowDecision) {
	if t.span != nil {
		t.span.SetAttributes(attribute.String("idem.shadow_decision", string(d)))
	}
}

// end closes the stream's span with what is known about the attempt.
func (t *streamTrace) end(a *attempt.Attempt, err error) {
	if t.span == nil {
		return
	}
	if a.Policy != nil {
		t.span.SetAttributes(attribute.String("idem.policy", a.Policy.Name))
	}
	if a.ID != "" {
		t.span.SetAttributes(attribute.String("idem.key_hash", string(a.ID)), attribute.String("idem.scope", a.Scope))
	}
	if a.RequestID != "" {
		t.span.SetAttributes(attribute.String("http.request.header.x-request-id", a.RequestID))
	}
	if a.Number > 0 {
		t.span.SetAttributes(attribute.Int("idem.attempt", a.Number))
	}
	if err != nil {
		t.span.SetStatus(codes.Error, err.Error())
	}
	t.span.End()
}

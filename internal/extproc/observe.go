package extproc

import (
	"context"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

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

// phaseSpanName names the span of a message's phase.
func phaseSpanName(req *extprocv3.ProcessingRequest) string {
	switch req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return "ext_proc request_headers"
	case *extprocv3.ProcessingRequest_RequestBody:
		return "ext_proc request_body"
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return "ext_proc request_trailers"
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return "ext_proc response_headers"
	case *extprocv3.ProcessingRequest_ResponseBody:
		return "ext_proc response_body"
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return "ext_proc response_trailers"
	}
	return "ext_proc unknown"
}

// startPhase opens the span of one message, as a child of the stream's
// span; the stream's span starts with the first message, under the
// traceparent of the request's headers when there is one.
func (p *processor) startPhase(ctx context.Context, req *extprocv3.ProcessingRequest) (context.Context, trace.Span) {
	if p.srv.tracer == nil {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op span, shared
	}
	if p.span == nil {
		parent := ctx
		if hh := req.GetRequestHeaders(); hh != nil {
			parent = traceContext.Extract(ctx, headerCarrier{hh.GetHeaders()})
		}
		p.spanCtx, p.span = p.srv.tracer.Start(parent, "idem-extproc stream", trace.WithSpanKind(trace.SpanKindServer))
	}
	return p.srv.tracer.Start(trace.ContextWithSpan(ctx, p.span), phaseSpanName(req))
}

// spanCtxOr returns a context carrying the stream's span, or def.
func (p *processor) spanCtxOr(def context.Context) context.Context {
	if p.spanCtx != nil {
		return p.spanCtx
	}
	return def
}

// decided reports a decision to the observer and on the stream's span.
func (p *processor) Decided(d idem.Decision) {
	name := ""
	if p.att.Policy != nil {
		name = p.att.Policy.Name
	}
	p.srv.obs.Decided(name, d)
	if p.span != nil {
		p.span.AddEvent(string(d))
		p.span.SetAttributes(attribute.String("idem.decision", string(d)))
	}
}

// endSpan closes the stream's span with what is known about the attempt.
func (p *processor) endSpan(err error) {
	if p.span == nil {
		return
	}
	if p.att.Policy != nil {
		p.span.SetAttributes(attribute.String("idem.policy", p.att.Policy.Name))
	}
	if p.att.ID != "" {
		p.span.SetAttributes(attribute.String("idem.key_hash", string(p.att.ID)), attribute.String("idem.scope", p.att.Scope))
	}
	if p.att.RequestID != "" {
		p.span.SetAttributes(attribute.String("http.request.header.x-request-id", p.att.RequestID))
	}
	if p.att.Number > 0 {
		p.span.SetAttributes(attribute.Int("idem.attempt", p.att.Number))
	}
	if err != nil {
		p.span.SetStatus(codes.Error, err.Error())
	}
	p.span.End()
}

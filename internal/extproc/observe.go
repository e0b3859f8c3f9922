package extproc

import (
	"context"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Decision names what the server did, for metrics and traces.
type Decision string

// The decisions. The first group is made at the request, the second at the
// response or the end of the stream.
const (
	DecisionBypassed         Decision = "bypassed"          // not protected: no policy, or no key where optional
	DecisionRejected         Decision = "rejected"          // 400, 401 or 413 before any store call
	DecisionReserved         Decision = "reserved"          // first attempt: forwarded
	DecisionReplayed         Decision = "replayed"          // completed: the stored answer
	DecisionConflict         Decision = "conflict"          // 409 request-in-progress
	DecisionMismatch         Decision = "mismatch"          // 422 idempotency-key-reused
	DecisionUnknown          Decision = "unknown"           // 409 outcome-unknown
	DecisionStoreUnavailable Decision = "store_unavailable" // 503, failing closed
	DecisionFailOpen         Decision = "fail_open"         // store down, passed unprotected
	DecisionShadowed         Decision = "shadowed"          // a shadow policy decided (ShadowDecision) and let the request on

	DecisionStored        Decision = "stored"         // the response completed the record
	DecisionReleased      Decision = "released"       // the record was deleted for a retry
	DecisionMarkedUnknown Decision = "marked_unknown" // the outcome is unknown
)

// ShadowDecision is what an enforcing policy would have done with a request
// that a shadow policy let through.
type ShadowDecision string

// The shadow decisions.
const (
	ShadowWouldReserve  ShadowDecision = "would_reserve"  // first attempt
	ShadowWouldReplay   ShadowDecision = "would_replay"   // a completed record's answer
	ShadowWouldConflict ShadowDecision = "would_conflict" // 409 request-in-progress
	ShadowWouldMismatch ShadowDecision = "would_mismatch" // 422 idempotency-key-reused
	ShadowWouldUnknown  ShadowDecision = "would_unknown"  // 409 outcome-unknown
	ShadowWouldReject   ShadowDecision = "would_reject"   // 400, 401 or 413 (key missing or invalid, no principal, body too large)
	ShadowStoreError    ShadowDecision = "store_error"    // the store could not be asked: nothing measured
)

// Observer is told what the server decides. Package observe implements it
// with Prometheus metrics.
type Observer interface {
	StreamStarted()
	StreamEnded()
	// Decided reports a decision under a policy ("" when none matched).
	Decided(policy string, d Decision)
	// Replayed reports the age of the record a replay came from.
	Replayed(policy string, age time.Duration)
	// SettleFailed reports a final transition the store refused even after
	// the retry at the stream's end: the record turns unknown when its
	// lease ends.
	SettleFailed(policy, op string)
	// Requested reports a request a policy matched, whatever its
	// enforcement, and whether it carried a key: key adoption.
	Requested(policy string, withKey bool)
	// ShadowDecided reports what a shadow policy would have done.
	ShadowDecided(policy string, d ShadowDecision)
	// KeyWarned reports a request without a required key let through
	// during the policy's grace period (key.warn_until).
	KeyWarned(policy string)
	// MissingAttribute reports a request of a policy that needed an Envoy
	// attribute (response.code_details, a principal, xds.route_name) the
	// filter did not send.
	MissingAttribute(policy, attribute string)
	// ReplayHeadersDropped reports stored headers left out of a replay
	// because Envoy would refuse them (a control character, or past its
	// header count or size limit).
	ReplayHeadersDropped(policy string, n int)
}

type nopObserver struct{}

func (nopObserver) StreamStarted()                       {}
func (nopObserver) StreamEnded()                         {}
func (nopObserver) Decided(string, Decision)             {}
func (nopObserver) Replayed(string, time.Duration)       {}
func (nopObserver) SettleFailed(policy, op string)       {}
func (nopObserver) Requested(string, bool)               {}
func (nopObserver) ShadowDecided(string, ShadowDecision) {}
func (nopObserver) KeyWarned(string)                     {}
func (nopObserver) MissingAttribute(string, string)      {}
func (nopObserver) ReplayHeadersDropped(string, int)     {}

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
func (p *processor) decided(d Decision) {
	name := ""
	if p.pol != nil {
		name = p.pol.Name
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
	if p.pol != nil {
		p.span.SetAttributes(attribute.String("idem.policy", p.pol.Name))
	}
	if p.id != "" {
		p.span.SetAttributes(attribute.String("idem.key_hash", string(p.id)), attribute.String("idem.scope", p.scope))
	}
	if p.requestID != "" {
		p.span.SetAttributes(attribute.String("http.request.header.x-request-id", p.requestID))
	}
	if p.attempt > 0 {
		p.span.SetAttributes(attribute.Int("idem.attempt", p.attempt))
	}
	if err != nil {
		p.span.SetStatus(codes.Error, err.Error())
	}
	p.span.End()
}

package idemclient

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Outcome is what became of one attempt.
type Outcome string

// The outcomes of an attempt.
const (
	// OutcomeDone: its answer is returned to the caller.
	OutcomeDone Outcome = "done"
	// OutcomeRetry: another attempt follows after Attempt.Wait.
	OutcomeRetry Outcome = "retry"
	// OutcomeStop: the chain ends on it without a normal answer: a problem,
	// a transport error that was not retried, or a retryable answer that
	// could not be retried (attempts, deadline, Retry-After too long).
	OutcomeStop Outcome = "stop"
)

// Attempt describes one attempt, for Options.OnAttempt.
type Attempt struct {
	// Key is the operation key ("" when the request has none), Number the
	// attempt's number (1 for the first), RequestID its X-Request-Id.
	Key       string
	Number    int
	RequestID string
	Method    string
	URL       string
	// Status is the answer's status, 0 when there was none (then Err is
	// set). Replayed marks a replay; ProblemType is the problem's type URI.
	Status      int
	Err         error
	Replayed    bool
	ProblemType string
	Outcome     Outcome
	// Reason says why the attempt was retried or why the chain stopped.
	Reason string
	// Wait is how long the transport waits before the next attempt.
	Wait time.Duration
	// Duration runs from the attempt's start to its response headers.
	Duration time.Duration
}

// attempt is the transport's state of one attempt in flight.
type attempt struct {
	t         *Transport
	n         int
	key       string
	requestID string
	start     time.Time
	span      trace.Span
	err       error
	method    string
	url       string

	gotConn, wroteHeaders atomic.Bool

	// headers is the race between the response headers and AttemptTimeout
	// (headersAwaited, headersIn, headersTimedOut); stopTimer stops the
	// attempt's timer, nil without AttemptTimeout.
	headers   atomic.Int32
	stopTimer func() bool
}

// clientTrace records whether the attempt obtained a connection and wrote
// its headers (see refusedBeforeWrite).
func (a *attempt) clientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { a.gotConn.Store(true) },
		WroteHeaders: func() { a.wroteHeaders.Store(true) },
	}
}

// startSpan opens the attempt's client span under the caller's.
func (t *Transport) startSpan(ctx context.Context, req *http.Request, a *attempt) (context.Context, trace.Span) {
	a.method, a.url = methodOf(req), req.URL.Redacted()
	attrs := []attribute.KeyValue{
		attribute.String("http.request.method", a.method),
		attribute.String("url.full", a.url),
		attribute.Int("idem.attempt", a.n),
		// The server's span records the request id under this name too.
		attribute.String("http.request.header.x-request-id", a.requestID),
	}
	if a.key != "" {
		attrs = append(attrs, attribute.String("idem.key", a.key))
	}
	return t.tracer.Start(ctx, "idemclient "+a.method,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// inject writes the attempt span's context into its headers with the
// global propagator (a no-op unless the program sets one).
func (t *Transport) inject(ctx context.Context, h http.Header) {
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
}

// finish reports the attempt: span, log line and OnAttempt hook.
func (a *attempt) finish(v verdict, out Outcome, wait time.Duration) {
	reason := v.why
	if v.gaveUp != "" {
		reason += "; not retried: " + v.gaveUp
	}
	info := Attempt{
		Key: a.key, Number: a.n, RequestID: a.requestID, Method: a.method, URL: a.url,
		Status: v.status, Err: a.err, Replayed: v.replayed, ProblemType: v.probType,
		Outcome: out, Reason: reason, Wait: wait, Duration: a.t.now().Sub(a.start),
	}

	a.span.SetAttributes(attribute.String("idem.outcome", string(out)), attribute.Bool("idem.replayed", v.replayed))
	if v.status != 0 {
		a.span.SetAttributes(attribute.Int("http.response.status_code", v.status))
	}
	if v.probType != "" {
		a.span.SetAttributes(attribute.String("idem.problem_type", v.probType))
	}
	if out == OutcomeRetry {
		a.span.SetAttributes(attribute.Int64("idem.retry_wait_ms", wait.Milliseconds()))
	}
	switch {
	case a.err != nil:
		a.span.RecordError(a.err)
		a.span.SetStatus(codes.Error, reason)
	case v.problem != nil:
		a.span.SetStatus(codes.Error, reason)
	}
	a.span.End()

	level := slog.LevelDebug
	switch {
	case out == OutcomeRetry:
		level = slog.LevelInfo
	case out == OutcomeStop:
		level = slog.LevelWarn
	}
	log := a.t.log
	if log.Enabled(context.Background(), level) {
		attrs := []slog.Attr{
			slog.String("idempotency_key", a.key), slog.Int("attempt", a.n),
			slog.String("request_id", a.requestID), slog.String("method", a.method), slog.String("url", a.url),
			slog.String("outcome", string(out)), slog.String("reason", reason),
			slog.Duration("duration", info.Duration),
		}
		if v.status != 0 {
			attrs = append(attrs, slog.Int("status", v.status))
		}
		if v.replayed {
			attrs = append(attrs, slog.Bool("replayed", true))
		}
		if v.probType != "" {
			attrs = append(attrs, slog.String("problem_type", v.probType))
		}
		if a.err != nil {
			attrs = append(attrs, slog.String("error", a.err.Error()))
		}
		if out == OutcomeRetry {
			attrs = append(attrs, slog.Duration("wait", wait))
		}
		log.LogAttrs(context.Background(), level, "idemclient attempt", attrs...)
	}
	if a.t.onAttempt != nil {
		a.t.onAttempt(info)
	}
}

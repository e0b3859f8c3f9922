package idemclient

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// AttemptHeader carries the attempt number, 1 for the first. idem-extproc
// does not read it (it counts the attempts that reach its store itself and
// logs that number as "attempt"); it is there so that the proxy's access log
// and the upstream can tell attempts of one operation apart. The two numbers
// differ when an attempt never reached the server (a refused connection).
const AttemptHeader = "Idempotency-Attempt"

// RequestIDHeader is sent with a fresh value on every attempt.
const RequestIDHeader = "X-Request-Id"

// ReplayedHeader marks an answer the server replayed from its record.
const ReplayedHeader = idem.ReplayedHeader

// BodyOmittedHeader marks a replay whose original body was too large to be
// stored: the operation completed, its body cannot be repeated.
const BodyOmittedHeader = idem.BodyOmittedHeader

// Defaults of Options.
const (
	DefaultMaxAttempts   = 4
	DefaultBaseDelay     = 100 * time.Millisecond
	DefaultMaxDelay      = 5 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second
)

// Options configures a Transport. The zero value gives the defaults above,
// http.DefaultTransport, no logs and the global OpenTelemetry provider.
type Options struct {
	// Base sends each attempt; http.DefaultTransport when nil.
	Base http.RoundTripper
	// MaxAttempts caps the attempts of one request, the first included.
	MaxAttempts int
	// BaseDelay and MaxDelay shape the backoff: before attempt n+1 the
	// transport waits a uniformly random time in [0, min(MaxDelay,
	// BaseDelay·2^(n-1))] ("full jitter"), or the answer's Retry-After if
	// that is longer.
	BaseDelay, MaxDelay time.Duration
	// MaxRetryAfter is the longest Retry-After the transport waits for; an
	// answer asking for longer is returned to the caller as it is.
	MaxRetryAfter time.Duration
	// AttemptTimeout, when positive, bounds each attempt up to its response
	// headers. The body is not bounded by it: the body of the response
	// returned, and the problem document the transport reads to judge an
	// answer, are bounded by the request's context alone, whose deadline
	// bounds the whole chain. (An answer the transport drops is drained for
	// connection reuse for at most AttemptTimeout more.)
	AttemptTimeout time.Duration
	// KeyHeader names the header the server's policy reads the key from
	// (a policy's key.header); Idempotency-Key when empty. SetKey and
	// NewRequest write Idempotency-Key: the transport moves the key to
	// KeyHeader on every attempt.
	KeyHeader string
	// KeyMethods lists methods for which a request without a key gets a
	// fresh one (NewKey) for this one call: the call is the operation. Leave
	// it empty unless every route these requests reach is protected by
	// idem-extproc: a key the server ignores makes a retry unsafe.
	KeyMethods []string
	// Logger receives one line per attempt (debug when it is final, info
	// when it is retried, warn when the chain stops on an error); none when
	// nil.
	Logger *slog.Logger
	// TracerProvider makes one client span per attempt; the global
	// provider (otel.GetTracerProvider) when nil. The global propagator
	// injects the span's context into the attempt's headers.
	TracerProvider trace.TracerProvider
	// OnAttempt, when set, is called once per attempt as soon as its fate is
	// known, for metrics.
	OnAttempt func(Attempt)
}

// Transport is an http.RoundTripper that applies the contract's retry rules
// (see the package documentation). It is safe for concurrent use. Make one
// with New; the zero value works too, with the defaults of Options.
//
// Unlike a plain RoundTripper it returns an error for some answers: a
// *ProblemError when the answer is a problem the chain must stop on. An
// http.Client wraps it in a *url.Error; errors.As and errors.Is see
// through that.
type Transport struct {
	base          http.RoundTripper
	maxAttempts   int
	baseDelay     time.Duration
	maxDelay      time.Duration
	maxRetryAfter time.Duration
	attemptTO     time.Duration
	keyMethods    []string
	keyHeader     string
	log           *slog.Logger
	tracer        trace.Tracer
	onAttempt     func(Attempt)

	// now, sleep and jitter are the clock and randomness, afterFunc the
	// attempt timer (time.AfterFunc; it returns the timer's Stop), replaced
	// in tests.
	now       func() time.Time
	sleep     func(ctx context.Context, d time.Duration) error
	jitter    func(max time.Duration) time.Duration
	afterFunc func(d time.Duration, f func()) (stop func() bool)

	once sync.Once
}

// New returns a Transport configured by o.
func New(o Options) *Transport {
	t := &Transport{
		base: o.Base, maxAttempts: o.MaxAttempts, baseDelay: o.BaseDelay, maxDelay: o.MaxDelay,
		maxRetryAfter: o.MaxRetryAfter, attemptTO: o.AttemptTimeout, log: o.Logger, onAttempt: o.OnAttempt,
		keyHeader: http.CanonicalHeaderKey(o.KeyHeader),
	}
	for _, m := range o.KeyMethods {
		t.keyMethods = append(t.keyMethods, strings.ToUpper(m))
	}
	tp := o.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	t.tracer = tp.Tracer(tracerName)
	t.once.Do(t.setDefaults)
	return t
}

const tracerName = "github.com/idem-extproc/idem-extproc/idemclient"

// setDefaults fills what Options left unset, for New and for a zero
// Transport at its first RoundTrip.
func (t *Transport) setDefaults() {
	if t.base == nil {
		t.base = http.DefaultTransport
	}
	if t.keyHeader == "" {
		t.keyHeader = http.CanonicalHeaderKey(KeyHeader)
	}
	if t.maxAttempts <= 0 {
		t.maxAttempts = DefaultMaxAttempts
	}
	if t.baseDelay <= 0 {
		t.baseDelay = DefaultBaseDelay
	}
	if t.maxDelay <= 0 {
		t.maxDelay = DefaultMaxDelay
	}
	if t.maxRetryAfter <= 0 {
		t.maxRetryAfter = DefaultMaxRetryAfter
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.tracer == nil {
		t.tracer = otel.GetTracerProvider().Tracer(tracerName)
	}
	t.now, t.sleep, t.jitter, t.afterFunc = time.Now, sleepCtx, fullJitter, afterFunc
}

func afterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// NewClient returns an http.Client whose transport is New(o).
func NewClient(o Options) *http.Client { return &http.Client{Transport: New(o)} }

// Replayed reports whether resp is an answer the server replayed from the
// operation's record (Idempotent-Replayed: true) rather than a fresh one:
// the operation had already been executed by an earlier attempt or call.
func Replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(resp.Header.Get(ReplayedHeader), "true")
}

// BodyOmitted reports whether resp is a replay without the original body,
// which was too large to store (Idempotent-Body-Omitted: true).
func BodyOmitted(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(resp.Header.Get(BodyOmittedHeader), "true")
}

// Attempts returns the number of the attempt that got resp (1 when the
// first did), read from resp.Request, the attempt the transport sent; 0
// when resp did not come through a Transport.
func Attempts(resp *http.Response) int {
	if resp == nil || resp.Request == nil {
		return 0
	}
	n, _ := strconv.Atoi(resp.Request.Header.Get(AttemptHeader))
	return n
}

// RoundTrip sends req as one operation, retrying as the contract allows.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.once.Do(t.setDefaults)
	ctx := req.Context()
	key, err := t.requestKey(req.Header)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if key == "" && slices.Contains(t.keyMethods, methodOf(req)) {
		key = NewKey()
	}
	// A retry needs the body again: none, or GetBody to make a fresh copy.
	resendable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	baseID := req.Header.Get(RequestIDHeader)

	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			// Never an attempt after the deadline, not even a first one.
			if n == 1 {
				closeBody(req)
			}
			return nil, &Error{Key: key, Attempts: n - 1, Reason: "request context ended before the attempt", Err: err}
		}
		a := &attempt{t: t, n: n, key: key, start: t.now()}
		a.requestID = requestID(baseID, n)
		areq, cancel, err := t.prepare(ctx, req, a)
		if err != nil {
			return nil, &Error{Key: key, Attempts: n - 1, RequestID: a.requestID, Reason: "body could not be sent again", Err: err}
		}
		resp, err := a.headersArrived(t.base.RoundTrip(areq))
		v := t.judge(ctx, a, resp, err, resendable)
		if v.retry && n < t.maxAttempts {
			wait := t.wait(n, v.retryAfter)
			if why := t.cannotWait(ctx, wait, v.retryAfter); why != "" {
				v.retry, v.gaveUp = false, why
			} else {
				a.finish(v, OutcomeRetry, wait)
				t.drop(resp, cancel)
				if err := t.sleep(ctx, wait); err != nil {
					return nil, &Error{Key: key, Attempts: n, RequestID: a.requestID, Reason: "request context ended while waiting to retry", Err: err}
				}
				continue
			}
		} else if v.retry {
			v.retry, v.gaveUp = false, "attempts exhausted"
		}
		return t.end(a, v, resp, err, cancel)
	}
}

// end finishes the chain with the last attempt's verdict: its response
// (whose body releases the attempt's context once read to its end or
// closed), a *ProblemError, or an *Error.
func (t *Transport) end(a *attempt, v verdict, resp *http.Response, err error, cancel context.CancelFunc) (*http.Response, error) {
	switch {
	case v.problem != nil:
		a.finish(v, OutcomeStop, 0)
		t.drop(resp, cancel)
		return nil, v.problem
	case err != nil:
		a.finish(v, OutcomeStop, 0)
		cancel()
		reason := v.gaveUp
		if reason == "" {
			reason = v.why
		}
		return nil, &Error{Key: a.key, Attempts: a.n, RequestID: a.requestID, Reason: reason, Err: err}
	}
	if v.gaveUp != "" {
		a.finish(v, OutcomeStop, 0)
	} else {
		a.finish(v, OutcomeDone, 0)
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		// Nothing left to read: net/http has done with the connection
		// (it cancels its own request then too, transport.go readLoop).
		cancel()
		return resp, nil
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// prepare builds attempt a's request: a clone of req with its own context
// (cut by AttemptTimeout until the response headers arrive, traced to see
// whether anything was written), a fresh body for a retry, and the key,
// request id and attempt headers. The cancel it returns also stops the
// attempt's timer.
func (t *Transport) prepare(ctx context.Context, req *http.Request, a *attempt) (*http.Request, context.CancelFunc, error) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if t.attemptTO > 0 {
		// Not context.WithTimeout: a deadline cannot be lifted, and it would
		// cut the body too (net/http reads the body under the request's
		// context). A timer that cancels the context only while the headers
		// are awaited bounds exactly the wait for them.
		var cancelCause context.CancelCauseFunc
		actx, cancelCause = context.WithCancelCause(ctx)
		d := t.attemptTO
		a.stopTimer = t.afterFunc(d, func() {
			if a.headers.CompareAndSwap(headersAwaited, headersTimedOut) {
				cancelCause(&attemptTimeoutError{after: d})
			}
		})
		cancel = func() {
			a.stopTimer()
			cancelCause(nil)
		}
	}
	actx = httptrace.WithClientTrace(actx, a.clientTrace())
	actx, a.span = t.startSpan(actx, req, a)
	areq := req.Clone(actx)
	if a.n > 1 && req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			cancel()
			a.span.End()
			return nil, nil, err
		}
		areq.Body = body
	}
	if a.key != "" {
		areq.Header.Del(KeyHeader)
		areq.Header.Set(t.keyHeader, quoteKey(a.key))
	}
	areq.Header.Set(RequestIDHeader, a.requestID)
	areq.Header.Set(AttemptHeader, strconv.Itoa(a.n))
	t.inject(actx, areq.Header)
	return areq, cancel, nil
}

// requestKey reads the caller's key from KeyHeader or, when that is
// another header and carries none, from Idempotency-Key (where SetKey and
// NewRequest put it).
func (t *Transport) requestKey(h http.Header) (string, error) {
	k, err := parseKey(h, t.keyHeader)
	if err == nil && k == "" && t.keyHeader != http.CanonicalHeaderKey(KeyHeader) {
		k, err = parseKey(h, KeyHeader)
	}
	return k, err
}

// wait returns how long to wait after attempt n failed: full jitter over
// the exponential backoff, or retryAfter when that is longer.
func (t *Transport) wait(n int, retryAfter time.Duration) time.Duration {
	ceil := t.maxDelay
	if shift := n - 1; shift < 62 {
		if d := t.baseDelay << shift; d > 0 && d < ceil && d>>shift == t.baseDelay {
			ceil = d
		}
	}
	return max(t.jitter(ceil), retryAfter)
}

// cannotWait says why the chain must not wait d for another attempt: a
// Retry-After beyond MaxRetryAfter, or a wait that would end at or after
// the request's deadline (so no attempt can start in time). "" when it may.
func (t *Transport) cannotWait(ctx context.Context, d, retryAfter time.Duration) string {
	if retryAfter > t.maxRetryAfter {
		return "Retry-After " + retryAfter.String() + " is longer than MaxRetryAfter"
	}
	if err := ctx.Err(); err != nil {
		return "request context ended"
	}
	if dl, ok := ctx.Deadline(); ok && !t.now().Add(d).Before(dl) {
		return "the next attempt could not start before the request's deadline"
	}
	return ""
}

// requestID returns attempt n's X-Request-Id: a fresh UUIDv4, or the
// caller's own id (for the first attempt) and that id with "-n" after it.
func requestID(base string, n int) string {
	switch {
	case base == "":
		return uuid.NewString()
	case n == 1:
		return base
	default:
		return base + "-" + strconv.Itoa(n)
	}
}

func methodOf(r *http.Request) string {
	if r.Method == "" {
		return http.MethodGet
	}
	return strings.ToUpper(r.Method)
}

// fullJitter returns a uniformly random duration in [0, ceil].
func fullJitter(ceil time.Duration) time.Duration {
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// sleepCtx waits d or until ctx ends, whichever comes first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

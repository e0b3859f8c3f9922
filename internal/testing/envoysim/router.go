package envoysim

import (
	"context"
	"errors"
	"strconv"
	"strings"
)

// FlagUpstreamRetryLimitExceeded is CoreResponseFlag UpstreamRetryLimitExceeded
// (bit 15 of legacyResponseFlags, envoy/stream_info/stream_info.h).
const FlagUpstreamRetryLimitExceeded uint64 = 0x8000

// RetryPolicy is a route's retry policy as Envoy's router applies it
// (source/common/router/router.cc, retry_state_impl.cc). Each attempt calls
// the Upstream again, with Request.Attempt counting from 1. The router
// decides after each attempt (RetryStateImpl::shouldRetry, in this order):
// an ending retry_on does not cover is RetryStatus::No and ends the request
// with no flag added; a covered ending with no retries left is
// NoRetryLimitExceeded (flag UpstreamRetryLimitExceeded); a retry the
// cluster's retry circuit breaker refuses is NoOverflow (flag
// UpstreamOverflow, router.cc maybeRetryReset and onUpstreamHeaders);
// otherwise the router retries (doRetry), incrementing the attempt count
// before it looks for a connection pool, and answers 503
// no_healthy_upstream when it finds none (sendNoHealthyUpstreamResponse).
// A request that ends after a retry carries the last attempt's details:
// nothing in them says an earlier attempt reached the upstream.
type RetryPolicy struct {
	// NumRetries is num_retries: how many retries may follow the first
	// attempt.
	NumRetries int
	// RetryOn reports whether the policy's retry_on covers an attempt's
	// ending: a router failure (f set) or an upstream response (resp set).
	// nil is retry_on "5xx": every upstream reset but an overflow
	// (RetryStateImpl::wouldRetryFromReset: "we never retry if the reset
	// reason is overflow"; test Policy5xxResetOverflow) and every 5xx
	// response (wouldRetryFromHeaders). The route's global timeout ends the
	// request without asking the retry state (onResponseTimeout; test
	// RouterTest.UpstreamTimeout), and no healthy upstream is no reset.
	RetryOn func(f *UpstreamFailure, resp *Response) bool
	// OverflowAfter is the attempt after which the retry circuit breaker
	// refuses the retry (RetryStatus::NoOverflow); 0 never.
	OverflowAfter int
	// NoHostAt is the attempt (2 or more) whose doRetry finds no connection
	// pool; 0 never.
	NoHostAt int
}

func (p *RetryPolicy) covers(f *UpstreamFailure, resp *Response) bool {
	if p.RetryOn != nil {
		return p.RetryOn(f, resp)
	}
	if f != nil {
		return isReset(f)
	}
	return resp.Status >= 500
}

// isReset reports whether a router failure is an upstream reset that
// retry_on "5xx", "gateway-error" and "reset" cover: every reset but an
// overflow (wouldRetryFromReset). The global timeout and a missing host
// are no resets.
func isReset(f *UpstreamFailure) bool {
	switch f.Details {
	case UpstreamTimeout.Details, UpstreamOverflow.Details, NoHealthyUpstream.Details:
		return false
	}
	return true
}

// retryHeaders are the request headers from which Envoy's router arms
// retries: RetryStateImpl::create makes a retry state when
// x-envoy-retry-on or x-envoy-retry-grpc-on is present, even on a route
// with no retry policy; x-envoy-max-retries then sets the number of
// retries; all three are consumed, never sent upstream
// (source/common/router/retry_state_impl.cc). The connection manager
// removes them from a client it does not count as internal
// (source/common/http/conn_manager_utility.cc, mutateRequestHeaders →
// cleanInternalHeaders). Other x-envoy-* headers that shape retries
// (x-envoy-retriable-status-codes, x-envoy-hedge-on-per-try-timeout,
// x-envoy-upstream-rq-per-try-timeout-ms) act only through a retry state
// and are not modelled.
var retryHeaders = [...]string{"x-envoy-retry-on", "x-envoy-retry-grpc-on", "x-envoy-max-retries"}

// routerRetryPolicy is the retry state the router makes in decodeHeaders,
// and the headers it sends upstream. It applies the route's
// request_headers_to_remove first (finalizeRequestHeaders) and reads the
// retry headers only then (createRetryState, a few lines later in
// source/common/router/router.cc Filter::decodeHeaders), so a route that
// removes them is never retried by them. A header on a route without a
// policy arms the default RetryPolicyImpl, one retry ("We set the number
// of retries to 1 by default ... when retries get enabled through the
// x-envoy-retry-on header", source/common/router/config_impl.h
// num_retries_); x-envoy-max-retries overrides the count when some
// retry_on is set (RetryStateImpl's constructor).
func routerRetryPolicy(route *RetryPolicy, removeNames []string, hs []Header) (*RetryPolicy, []Header) {
	for _, name := range removeNames {
		hs = remove(hs, strings.ToLower(name))
	}
	on, onSet := Get(hs, "x-envoy-retry-on")
	grpcOn, grpcSet := Get(hs, "x-envoy-retry-grpc-on")
	maxRetries, maxSet := Get(hs, "x-envoy-max-retries")
	for _, name := range retryHeaders {
		hs = remove(hs, name)
	}
	if !onSet && !grpcSet {
		return route, hs
	}
	headerOn, known := parseRetryOn(on, grpcOn)
	p := &RetryPolicy{NumRetries: 1, RetryOn: func(*UpstreamFailure, *Response) bool { return false }}
	if route != nil {
		*p = *route
		p.RetryOn = route.covers
	}
	routeOn := p.RetryOn
	p.RetryOn = func(f *UpstreamFailure, resp *Response) bool { return routeOn(f, resp) || headerOn(f, resp) }
	if n, err := strconv.ParseUint(maxRetries, 10, 32); maxSet && err == nil && (known || route != nil) {
		p.NumRetries = int(n)
	}
	return p, hs
}

// parseRetryOn reads x-envoy-retry-on and x-envoy-retry-grpc-on as
// RetryStateImpl::parseRetryOn and parseRetryGrpcOn do (comma-separated,
// unknown values ignored), for the conditions envoysim's endings can meet:
// 5xx, gateway-error, reset, connect-failure (a refused connection: the
// stored copy's single ConnectionFailure reason) and the gRPC statuses
// read from the response headers (wouldRetryFromHeaders). It reports
// whether any value was known.
func parseRetryOn(on, grpcOn string) (func(*UpstreamFailure, *Response) bool, bool) {
	var conds []func(*UpstreamFailure, *Response) bool
	for v := range strings.SplitSeq(on, ",") {
		switch strings.TrimSpace(v) {
		case "5xx":
			conds = append(conds, func(f *UpstreamFailure, r *Response) bool {
				return f != nil && isReset(f) || r != nil && r.Status >= 500
			})
		case "gateway-error":
			conds = append(conds, func(f *UpstreamFailure, r *Response) bool {
				return f != nil && isReset(f) || r != nil && r.Status >= 502 && r.Status <= 504
			})
		case "reset":
			conds = append(conds, func(f *UpstreamFailure, _ *Response) bool { return f != nil && isReset(f) })
		case "connect-failure":
			conds = append(conds, func(f *UpstreamFailure, _ *Response) bool { return f == ConnectFailure })
		}
	}
	grpcStatus := map[string]string{"cancelled": "1", "deadline-exceeded": "4", "resource-exhausted": "8", "internal": "13", "unavailable": "14"}
	for v := range strings.SplitSeq(grpcOn, ",") {
		if code, ok := grpcStatus[strings.TrimSpace(v)]; ok {
			conds = append(conds, func(_ *UpstreamFailure, r *Response) bool {
				return r != nil && get(r.Headers, "grpc-status") == code
			})
		}
	}
	return func(f *UpstreamFailure, r *Response) bool {
		for _, c := range conds {
			if c(f, r) {
				return true
			}
		}
		return false
	}, len(conds) > 0
}

// attemptResult is one attempt's ending: the upstream's response or the
// router failure Envoy makes a local reply for.
type attemptResult struct {
	resp    *Response
	failure *UpstreamFailure
	// filter is set when a decoder filter after ext_proc answered: the
	// router never ran.
	filter bool
}

// runAttempts runs the router's attempts for one request: the first, then a
// retry for as long as the route's RetryPolicy asks for one. It returns
// the ending that goes downstream, and sets x.attempts as
// StreamInfo::attemptCount() would read: 0 when the router made no
// attempt (a filter answered, or decodeHeaders found no host before it
// set the count), else the number of attempts begun.
func (x *exchange) runAttempts(ctx context.Context, up Upstream, upReq *Request) (attemptResult, error) {
	policy, headers := routerRetryPolicy(x.req.Retry, x.req.RemoveHeaders, upReq.Headers)
	upReq.Headers = headers
	for attempt := 1; ; attempt++ {
		req := *upReq
		req.Attempt = attempt
		resp, err := up(ctx, &req)
		if ctx.Err() != nil {
			return attemptResult{}, ctx.Err()
		}
		var end attemptResult
		switch uf := (*UpstreamFailure)(nil); {
		case err == nil:
			end.resp = resp
		case errors.As(err, &uf) && uf.Filter != "":
			return attemptResult{failure: uf, filter: true}, nil
		case errors.As(err, &uf):
			end.failure = uf
		default:
			end.failure = ConnectionTermination
		}
		if attempt == 1 && end.failure != nil && end.failure.Details == NoHealthyUpstream.Details {
			// decodeHeaders: no connection pool, before setAttemptCount and
			// before the retry state exists.
			return end, nil
		}
		x.attempts = attempt
		if policy == nil || !policy.covers(end.failure, end.resp) {
			return end, nil // RetryStatus::No, or no retry state
		}
		if attempt > policy.NumRetries {
			return x.endWithFlag(end, FlagUpstreamRetryLimitExceeded), nil
		}
		if policy.OverflowAfter == attempt {
			return x.endWithFlag(end, FlagUpstreamOverflow), nil
		}
		if policy.NoHostAt == attempt+1 {
			// doRetry: attempt_count_++ and setAttemptCount, then no pool.
			x.attempts = attempt + 1
			return attemptResult{failure: NoHealthyUpstream}, nil
		}
	}
}

// endWithFlag is an ending with one more response flag, as the router sets
// it on the stream before the last attempt's answer goes downstream.
func (x *exchange) endWithFlag(end attemptResult, flag uint64) attemptResult {
	if end.resp != nil {
		r := *end.resp
		r.Flags |= flag
		end.resp = &r
		return end
	}
	f := *end.failure
	f.Flags |= flag
	end.failure = &f
	return end
}

// retriedBody is a reset's local-reply body after a retry: onUpstreamReset
// writes "retried and the latest " before "reset reason" once is_retry_ is
// set (doRetry).
func retriedBody(f *UpstreamFailure) *UpstreamFailure {
	const plain = "before headers. reset reason:"
	if !strings.Contains(f.Body, plain) {
		return f
	}
	g := *f
	g.Body = strings.Replace(f.Body, plain, "before headers. retried and the latest reset reason:", 1)
	return &g
}

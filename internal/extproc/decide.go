package extproc

import (
	"context"
	"log/slog"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// decide fingerprints the complete request and answers from the
// attempt's decision (attempt.Decide): CONTINUE for the first attempt, or
// an immediate response for any other.
func (p *processor) decide(ctx context.Context, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if p.body != nil && !p.body.resolved {
		if resp := p.resolveAtBody(ctx, req); resp != nil {
			return resp
		}
	}
	fp := fingerprint.Compute(fingerprint.Request{
		Method:      p.method,
		Path:        p.path,
		Headers:     p.reqHeaders,
		Body:        p.reqBody,
		JSON:        p.att.Policy.FingerprintJSON,
		JSONOptions: p.att.Policy.FingerprintOptions(),
	}, p.att.Policy.FingerprintHeaders)
	p.reqBody, p.reqHeaders = nil, nil
	p.releaseHeld() // the request body is no longer kept
	if p.att.Policy.Enforcement == policy.EnforcementShadow {
		return p.decideShadow(ctx, req, fp)
	}
	res, err := p.att.Decide(ctx, fp)
	if err != nil {
		if attempt.Unreachable(err) && p.att.Policy.FailureMode == policy.FailOpen {
			p.Decided(idem.DecisionFailOpen)
			p.LogAt(ctx, slog.LevelWarn, "store unavailable; request passes unprotected (fail_open)", slog.String("error", err.Error()))
			return p.passThrough(req)
		}
		return p.storeProblem(ctx, err)
	}
	// The decision's name is the metric's (decisions_total): "replayed",
	// "conflict", not the record's state.
	if p.body != nil {
		// Decided at the body: say where the key came from (the record id
		// stands for it; a derived key is a hash, never body text).
		p.LogAt(ctx, slog.LevelInfo, "decision", slog.String("decision", string(idem.DecisionFor(res.Outcome))),
			slog.String("key_source", p.att.KeySource().String()))
	} else {
		p.LogAt(ctx, slog.LevelInfo, "decision", slog.String("decision", string(idem.DecisionFor(res.Outcome))))
	}
	return p.answerFor(req, res)
}

// BeforeWait tells Envoy about a duplicate's wait for the attempt in
// flight (attempt.Conversation). Envoy times each message out
// (message_timeout, 200 ms by default): ask for d, the wait plus two store
// calls. Envoy honours it only up to the filter's max_message_timeout.
// There is no timer in the echo modes, and grpc-go takes any first reply
// but the headers' as an error.
func (p *processor) BeforeWait(d time.Duration) error {
	if p.rpc.proxyless || echoes(p.requestBodyMode) {
		return nil
	}
	return p.send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(d)})
}

// storeProblem answers 503 when the store cannot be used: unreachable, or
// holding a response that fails its integrity check.
func (p *processor) storeProblem(ctx context.Context, err error) *extprocv3.ProcessingResponse {
	p.Decided(idem.DecisionStoreUnavailable)
	p.LogAt(ctx, slog.LevelError, "store unavailable; request refused (fail_closed)", slog.String("error", err.Error()))
	prob := problem.New(problem.StoreUnavailable, "the idempotency store cannot be used; retry later")
	prob.RetryAfter = p.att.Policy.RetryAfter
	return p.answer(p.problemReply(prob))
}

// answerFor turns a reservation's outcome into the reply.
func (p *processor) answerFor(req *extprocv3.ProcessingRequest, res idem.ReserveResult) *extprocv3.ProcessingResponse {
	p.Decided(idem.DecisionFor(res.Outcome))
	switch res.Outcome {
	case idem.Reserved:
		return p.proceed(req)
	case idem.Completed:
		if !res.CreatedAt.IsZero() {
			p.srv.obs.Replayed(p.att.Policy.Name, time.Since(res.CreatedAt))
		}
		return p.answer(p.replayReply(res.Response))
	case idem.InFlight:
		prob := problem.New(problem.InProgress, "an earlier request with this Idempotency-Key is still being processed; retry later")
		prob.RetryAfter = p.att.Policy.RetryAfter
		return p.answer(p.problemReply(prob))
	case idem.Unknown:
		return p.answer(p.problemReply(problem.New(problem.OutcomeUnknown,
			"an earlier request with this Idempotency-Key ended without a known outcome; "+
				"check the resource's state before retrying with a new key")))
	default: // idem.Mismatch
		return p.answer(p.problemReply(problem.New(problem.KeyReused,
			"this Idempotency-Key was already used for a request with a different method, path, headers or body")))
	}
}

// proceed lets the attempt that holds the reservation go to the upstream,
// renewing its lease while it runs.
func (p *processor) proceed(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	p.stage = stageUpstream
	p.att.Hold(p.spanCtxOr(context.Background()))
	return p.cont(req)
}

// reject answers a request the server refuses before any store call.
func (p *processor) reject(ctx context.Context, prob *problem.Problem) *extprocv3.ProcessingResponse {
	p.Decided(idem.DecisionRejected)
	p.LogAt(ctx, slog.LevelInfo, "rejected", slog.String("problem", prob.Slug))
	return p.answer(p.problemReply(prob))
}

// answer ends the request with the server's own response. Envoy sends no
// further message for it.
func (p *processor) answer(resp *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	p.stage = stagePassThrough
	p.rpc.held = nil // the request never goes on
	return resp
}

// passThrough lets an unprotected request go on and asks Envoy to skip
// every later phase of it, but the response headers when a header is to
// be added there (respAdd).
func (p *processor) passThrough(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	p.stage = stagePassThrough
	if _, ok := req.GetRequest().(*extprocv3.ProcessingRequest_RequestHeaders); ok && len(p.rpc.held) == 0 {
		if len(p.respAdd) > 0 {
			return continueWith(req, onlyResponseHeaders)
		}
		return continueWith(req, skipEverything)
	}
	return p.cont(req)
}

package extproc

import (
	"context"
	"errors"
	"log/slog"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// decide fingerprints the complete request, reserves its key and answers:
// CONTINUE for the first attempt, or an immediate response for any other.
func (p *processor) decide(ctx context.Context, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	fp := fingerprint.Compute(fingerprint.Request{
		Method:  p.method,
		Path:    p.path,
		Headers: p.reqHeaders,
		Body:    p.reqBody,
		JSON:    p.att.Policy.FingerprintJSON,
	}, p.att.Policy.FingerprintHeaders)
	p.reqBody, p.reqHeaders = nil, nil
	p.releaseHeld() // the request body is no longer kept
	p.att.Token = idem.NewToken()
	if p.att.Policy.Enforcement == policy.EnforcementShadow {
		return p.decideShadow(ctx, req, fp)
	}

	if p.att.Policy.Encrypt && p.srv.cfg.Sealer == nil {
		// The response could not be stored as the policy demands: refuse
		// before anything runs. (The daemon refuses such a configuration;
		// this guards other embeddings.)
		return p.storeProblem(ctx, errors.New("policy asks for encryption and the server has no key ring"))
	}
	res, err := p.reserve(ctx, fp)
	if err != nil {
		if p.att.Policy.FailureMode == policy.FailOpen {
			p.Decided(idem.DecisionFailOpen)
			p.LogAt(ctx, slog.LevelWarn, "store unavailable; request passes unprotected (fail_open)", slog.String("error", err.Error()))
			return p.passThrough(req)
		}
		return p.storeProblem(ctx, err)
	}
	p.att.Number = res.Attempt
	if res.Outcome == idem.InFlight && p.att.Policy.WaitForInFlight > 0 {
		if w, ok := p.srv.cfg.Store.(idem.Watcher); ok {
			res = p.awaitFirst(ctx, w, fp, res)
		}
	}
	if res.Outcome == idem.Completed && res.Response.Sealed {
		opened, err := p.open(*res.Response)
		if err != nil {
			// A stored response that does not open (tampered, or its key
			// left the ring) is never replayed, and the key is not free.
			return p.storeProblem(ctx, err)
		}
		res.Response = &opened
	}
	// The decision's name is the metric's (decisions_total): "replayed",
	// "conflict", not the record's state.
	p.LogAt(ctx, slog.LevelInfo, "decision", slog.String("decision", string(idem.DecisionFor(res.Outcome))))
	return p.answerFor(req, res)
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

func (p *processor) open(r idem.Response) (idem.Response, error) {
	if p.srv.cfg.Sealer == nil {
		return idem.Response{}, errors.New("a stored response is sealed and the server has no key ring")
	}
	return p.srv.cfg.Sealer.Open(p.att.ID, r)
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

func (p *processor) reserve(ctx context.Context, fp idem.Fingerprint) (idem.ReserveResult, error) {
	sctx, cancel := p.storeCtx(ctx)
	defer cancel()
	waitReplicas, waitTimeout := p.att.Policy.WaitReplicas()
	return p.srv.cfg.Store.Reserve(sctx, idem.Reservation{
		ID:           p.att.ID,
		Fingerprint:  fp,
		Token:        p.att.Token,
		Lease:        p.att.Policy.Lease,
		Retention:    p.att.Policy.Retention,
		LeaseExpiry:  p.att.Policy.LeaseExpiry,
		WaitReplicas: waitReplicas,
		WaitTimeout:  waitTimeout,
	})
}

// awaitFirst lets a duplicate wait, up to the policy's wait_for_in_flight,
// for the attempt that holds the record to settle, woken by the store
// rather than polling it. It returns what the duplicate should be told:
// the replay once the first attempt completed, a fresh reservation if it
// was released, or the outcome found when the wait ends.
func (p *processor) awaitFirst(ctx context.Context, w idem.Watcher, fp idem.Fingerprint, first idem.ReserveResult) idem.ReserveResult {
	deadline := time.Now().Add(p.att.Policy.WaitForInFlight)
	// Envoy times each message out (message_timeout, 200 ms by default):
	// ask for the wait plus two store calls. Envoy honours it only up to
	// the filter's max_message_timeout. There is no timer in the echo
	// modes, and grpc-go takes any first reply but the headers' as an
	// error.
	if !p.rpc.proxyless && !echoes(p.requestBodyMode) {
		if err := p.send(&extprocv3.ProcessingResponse{
			OverrideMessageTimeout: durationpb.New(p.att.Policy.WaitForInFlight + 2*p.srv.cfg.StoreTimeout),
		}); err != nil {
			return first
		}
	}
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		changed, stop, err := w.Watch(wctx, p.att.ID)
		if err != nil {
			return first
		}
		select {
		case <-changed:
		case <-wctx.Done():
		}
		stop()
		sctx, scancel := p.storeCtx(ctx)
		rec, err := p.srv.cfg.Store.Get(sctx, p.att.ID)
		scancel()
		switch {
		case errors.Is(err, idem.ErrNotFound):
			// Released (the upstream asked for a retry): this attempt may
			// run the operation now.
			res, err := p.reserve(ctx, fp)
			if err != nil {
				return first
			}
			return res
		case err != nil:
			return first
		case rec.Fingerprint != fp:
			return idem.ReserveResult{Outcome: idem.Mismatch}
		case rec.State == idem.StateCompleted:
			return idem.ReserveResult{Outcome: idem.Completed, Attempt: first.Attempt, Response: rec.Response, CreatedAt: rec.CreatedAt}
		case rec.State == idem.StateUnknown:
			return idem.ReserveResult{Outcome: idem.Unknown, Attempt: first.Attempt, CreatedAt: rec.CreatedAt}
		}
		if wctx.Err() != nil {
			return first // still in flight when the wait ran out: 409
		}
	}
}

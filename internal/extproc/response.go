package extproc

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

func (p *processor) onResponseHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	if ct, _ := findHeader(hh.GetHeaders(), "content-type"); p.rpc.proxyless || (p.rpc.call && isGRPCContentType(ct)) {
		return p.onRPCResponseHeaders(ctx, req, hh, headerList(hh.GetHeaders()))
	}
	// Only the status is read here; the headers are copied further down,
	// and only those the record will keep, once the response is to be
	// stored at all.
	statusText, _ := findHeader(hh.GetHeaders(), ":status")
	status, err := strconv.Atoi(statusText)
	if err != nil {
		status = 0 // no rule covers 0: the outcome is unknown
	}
	attrs := attributes(req)
	origin := p.responseOrigin(ctx, attrs)
	action := idem.DecideResponse(p.pol.ResponseRules, origin, status)
	p.logAt(ctx, slog.LevelDebug, "response",
		slog.Int("status", status), slog.String("origin", origin.String()), slog.String("action", action.String()))

	switch action {
	case idem.ActionRelease:
		p.settle(ctx, idem.ActionRelease)
		return continueWith(req, skipResponseBody)
	case idem.ActionUnknown:
		p.settle(ctx, idem.ActionUnknown)
		return continueWith(req, skipResponseBody)
	}
	p.respStatus = status
	p.respHeaders = keptHeaders(hh.GetHeaders(), p.pol.StoresHeader, p.respHeaders)
	if hh.GetEndOfStream() {
		p.complete(ctx)
		return continueFor(req)
	}
	p.stage = stageResponseBody
	if p.responseBodyMode == procmodev3.ProcessingMode_NONE {
		return continueWith(req, bufferResponseBody)
	}
	return continueFor(req)
}

func (p *processor) onResponseBody(ctx context.Context, req *extprocv3.ProcessingRequest, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if echoes(p.responseBodyMode) {
		return p.onStreamedResponseBody(ctx, req, body)
	}
	if p.rpc.response {
		// A gRPC response's status comes in the trailers.
		p.rpc.messages++
		p.storeResponseBytes(body)
		if body.GetEndOfStream() {
			p.finishRPC(ctx, nil)
		}
		return continueFor(req)
	}
	if !p.respTooLarge {
		if len(p.respBody)+len(body.GetBody()) > p.pol.MaxStoredBody || !p.hold(len(body.GetBody())) {
			// Over the policy's limit, or no room in the server's budget:
			// the response is recorded without its body.
			p.respTooLarge, p.respBody = true, nil
			p.releaseHeld()
		} else {
			p.respBody = append(p.respBody, body.GetBody()...)
		}
	}
	// In BUFFERED mode the body is whole even when trailers follow.
	if body.GetEndOfStream() || p.responseBodyMode == procmodev3.ProcessingMode_BUFFERED {
		p.complete(ctx)
	}
	return continueFor(req)
}

// complete stores the response. It runs before the reply that lets the
// response go on, so a client that sees the response and retries at once
// finds it stored.
func (p *processor) complete(ctx context.Context) {
	if !p.reserved {
		return
	}
	resp := idem.Response{Status: p.respStatus, Headers: p.respHeaders, Body: p.respBody, BodyOmitted: p.respTooLarge}
	if p.pol.Encrypt {
		sealed, err := p.srv.cfg.Sealer.Seal(p.id, resp)
		if err != nil {
			// Never store in the clear what the policy says to seal.
			p.logAt(ctx, slog.LevelError, "response not sealed; marking the outcome unknown", slog.String("error", err.Error()))
			p.settle(ctx, idem.ActionUnknown)
			return
		}
		resp = sealed
	}
	p.finalize(ctx, idem.DecisionStored, func(ctx context.Context) error {
		return p.srv.cfg.Store.Complete(ctx, p.id, p.tok, resp, p.pol.Retention)
	}, slog.Int("status", p.respStatus), slog.Bool("body_omitted", p.respTooLarge))
}

// settle releases the record or marks it unknown.
func (p *processor) settle(ctx context.Context, action idem.Action) {
	if !p.reserved {
		return
	}
	d, op := idem.DecisionMarkedUnknown, func(ctx context.Context) error {
		return p.srv.cfg.Store.MarkUnknown(ctx, p.id, p.tok, p.pol.Retention)
	}
	if action == idem.ActionRelease {
		d, op = idem.DecisionReleased, func(ctx context.Context) error { return p.srv.cfg.Store.Release(ctx, p.id, p.tok) }
	}
	p.finalize(ctx, d, op)
}

// finalize applies the attempt's last transition. It does not end with the
// stream's context: Envoy resetting the stream must not cancel the write
// that records what happened. If the store fails, the stream's end keeps
// trying (finish, within FinishTimeout); if that fails too, the unrenewed
// lease still turns the record unknown: never a silent second execution.
func (p *processor) finalize(ctx context.Context, d idem.Decision, apply func(context.Context) error, attrs ...slog.Attr) {
	p.stopRenewing()
	p.reserved = false
	p.stage = stagePassThrough
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.srv.cfg.StoreTimeout)
	err := apply(sctx)
	cancel()
	var buf [4]slog.Attr
	extra := append(append(buf[:0], attrs...), slog.String("outcome", string(d)), errAttr(err))
	if err != nil && !errors.Is(err, idem.ErrNotHolder) && !errors.Is(err, idem.ErrNotFound) {
		p.retry, p.retryDecision = apply, d
		p.logAt(ctx, slog.LevelWarn, "record not settled; will retry when the stream ends", extra...)
		return
	}
	if err == nil {
		p.decided(d)
	}
	p.logAt(ctx, slog.LevelInfo, "settled", extra...)
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}

// retryUntil applies op until it succeeds, the store gives a definite
// answer (the record moved on), or ctx ends; each call keeps the store's
// own per-call budget, so this outlasts a short outage of the store.
func retryUntil(ctx context.Context, op func(context.Context) error) error {
	backoff := 25 * time.Millisecond
	for {
		err := op(ctx)
		if err == nil || errors.Is(err, idem.ErrNotHolder) || errors.Is(err, idem.ErrNotFound) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// finish runs when the stream ends, however it ends. A record still held
// means the response never arrived whole: with response headers in hand the
// upstream did answer, so the record completes without its body; with none
// the outcome is unknown (or released, by policy).
func (p *processor) finish() {
	if p.retry == nil && !p.reserved {
		return // settled already, or nothing was reserved: the usual end
	}
	base := context.Background()
	if p.spanCtx != nil {
		base = p.spanCtx // for the spans, not the deadline
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(base), p.srv.cfg.FinishTimeout)
	defer cancel()
	if p.retry != nil {
		err := retryUntil(ctx, p.retry)
		level, msg := slog.LevelInfo, "settled on retry"
		switch {
		case err == nil:
			p.decided(p.retryDecision)
		case !errors.Is(err, idem.ErrNotHolder) && !errors.Is(err, idem.ErrNotFound):
			level, msg = slog.LevelError, "record not settled; it turns unknown when its lease ends"
			p.srv.obs.SettleFailed(p.pol.Name, string(p.retryDecision))
		}
		p.logAt(ctx, level, msg, slog.String("outcome", string(p.retryDecision)), errAttr(err))
		return
	}
	if !p.reserved {
		return
	}
	if p.stage == stageResponseBody {
		p.respTooLarge, p.respBody = true, nil
		p.complete(ctx)
		return
	}
	p.settle(ctx, p.pol.OnStreamReset)
}

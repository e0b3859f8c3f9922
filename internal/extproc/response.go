package extproc

import (
	"context"
	"log/slog"
	"strconv"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

func (p *processor) onResponseHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	if ct, _ := headerBytes(hh.GetHeaders(), "content-type"); p.rpc.proxyless || (p.rpc.call && isGRPCContentType(string(ct))) {
		return p.onRPCResponseHeaders(ctx, req, hh, headerList(hh.GetHeaders()))
	}
	// Only the status is read here; the headers are copied further down,
	// and only those the record will keep, once the response is to be
	// stored at all.
	statusText, _ := headerBytes(hh.GetHeaders(), ":status")
	status, err := strconv.Atoi(string(statusText))
	if err != nil {
		status = 0 // no rule covers 0: the outcome is unknown
	}
	attrs := attributes(req)
	origin, retried := p.responseOrigin(ctx, attrs)
	action := p.att.ActionFor(origin, status, retried)
	p.LogAt(ctx, slog.LevelDebug, "response",
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
	p.respHeaders = keptHeaders(hh.GetHeaders(), p.att.Policy.StoresHeader, p.respHeaders)
	if hh.GetEndOfStream() {
		p.settleStored(ctx)
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
			p.settleRPC(ctx, nil)
		}
		return continueFor(req)
	}
	p.storeResponseBytes(body)
	// In BUFFERED mode the body is whole even when trailers follow.
	if body.GetEndOfStream() || p.responseBodyMode == procmodev3.ProcessingMode_BUFFERED {
		p.settleStored(ctx)
	}
	return continueFor(req)
}

// settleStored completes the record with the response read so far
// (attempt.SettleStored); a JSON-RPC call's response is judged once more
// whole (attempt.SettleCall: the transport's refusal of the call is
// released).
func (p *processor) settleStored(ctx context.Context) {
	if !p.att.Held() {
		return
	}
	p.stage = stagePassThrough
	if p.answersJSONRPC() {
		p.att.SettleCall(ctx, p.response(), p.body.id, slog.Int("status", p.respStatus), slog.Bool("body_omitted", p.respTooLarge))
		return
	}
	p.att.SettleStored(ctx, p.response(), slog.Int("status", p.respStatus), slog.Bool("body_omitted", p.respTooLarge))
}

// response is the response read so far, as the record keeps it.
func (p *processor) response() idem.Response {
	return idem.Response{Status: p.respStatus, Headers: p.respHeaders, Body: p.respBody, BodyOmitted: p.respTooLarge}
}

// settle releases the record or marks it unknown (attempt.Settle).
func (p *processor) settle(ctx context.Context, action idem.Action) {
	if !p.att.Held() {
		return
	}
	p.stage = stagePassThrough
	p.att.Settle(ctx, action)
}

// settleAtEnd runs when the stream ends, however it ends: the attempt settles
// what it still holds (attempt.SettleAtEnd). With response headers in hand the
// upstream did answer, so the record completes without its body.
func (p *processor) settleAtEnd() {
	if !p.att.Pending() {
		return // settled already, or nothing was reserved: the usual end
	}
	var partial *idem.Response
	if p.att.Held() && p.stage == stageResponseBody {
		p.respTooLarge, p.respBody = true, nil
		r := p.response()
		partial = &r
	}
	p.att.SettleAtEnd(p.spanCtxOr(context.Background()), partial)
}

package extproc

import (
	"context"
	"log/slog"
	"strconv"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// onRPCResponseHeaders starts the response of a gRPC call. A gRPC call's
// outcome is its grpc-status, which comes in the trailers (or, for a
// trailers-only response, in these headers), so nothing is decided here
// unless the response ends with them.
func (p *processor) onRPCResponseHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders, hs []idem.Header) *extprocv3.ProcessingResponse {
	p.rpc.response = true
	attrs := attributes(req)
	p.rpc.origin, p.rpc.retried = p.responseOrigin(ctx, attrs)
	ct, _ := firstHeader(hs, "content-type")
	if p.rpc.proxyless && !isGRPCContentType(ct) {
		// grpc-go forwards the upstream's header metadata; with no
		// content-type the upstream never answered as gRPC: its transport
		// failed after the call was sent. The effect may have happened.
		p.rpc.origin = idem.OriginMaybeSent
	}
	p.respStatus = 200 // gRPC responses are HTTP 200; grpc-go sends no :status
	if s, ok := firstHeader(hs, ":status"); ok {
		p.respStatus, _ = strconv.Atoi(s)
	}
	p.respHeaders = keptHeaders(hh.GetHeaders(), p.att.Policy.StoresHeader, p.respHeaders[:0])
	if hh.GetEndOfStream() {
		// Trailers-only: the status is in these headers.
		p.settleRPC(ctx, hs)
		return p.cont(req)
	}
	p.stage = stageResponseBody
	if p.modesKnown && !p.rpc.proxyless && !echoes(p.responseBodyMode) {
		// Envoy sends trailers only when asked: ask for them, restating the
		// body mode (body modes are always copied from an override).
		return continueWith(req, &procmodev3.ProcessingMode{
			ResponseBodyMode:    p.wantedResponseBodyMode(),
			ResponseTrailerMode: procmodev3.ProcessingMode_SEND,
		})
	}
	return continueFor(req)
}

// onStreamedResponseBody reads one response body message in an echo mode.
// Its echo is withheld until the outcome is stored, so that a client never
// holds an answer the record does not have yet; the held bytes are acknowledged
// to grpc-go's flow control at once. A response larger than the policy's
// max_stored_body is not held: it passes on as it comes and is recorded
// without its body.
func (p *processor) onStreamedResponseBody(ctx context.Context, req *extprocv3.ProcessingRequest, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	p.rpc.messages++
	p.storeResponseBytes(body)
	if p.respTooLarge {
		return p.cont(req)
	}
	if body.GetEndOfStream() {
		// No trailers follow (Envoy, a response without trailers).
		p.settleResponse(ctx, nil)
		return p.cont(req)
	}
	p.rpc.held = append(p.rpc.held, p.echo(req))
	if !p.rpc.flow || len(body.GetBody()) == 0 {
		return nil
	}
	return &extprocv3.ProcessingResponse{ServerWindowUpdate: &extprocv3.ProcessingResponse_ServerWindowUpdate{
		WindowIncrementUpstreamToSidestream: int64(len(body.GetBody())),
	}}
}

// onResponseTrailers ends the response: a gRPC call's status is here.
func (p *processor) onResponseTrailers(ctx context.Context, req *extprocv3.ProcessingRequest, tr *extprocv3.HttpTrailers) *extprocv3.ProcessingResponse {
	if p.stage == stageResponseBody {
		p.settleResponse(ctx, headerList(tr.GetTrailers()))
	}
	return p.cont(req)
}

// settleResponse records a response whose end has arrived: a gRPC
// response by its status, any other by the decision made at its headers.
func (p *processor) settleResponse(ctx context.Context, trailers []idem.Header) {
	if p.rpc.response {
		p.settleRPC(ctx, trailers)
		return
	}
	p.settleStored(ctx)
}

// settleRPC decides a gRPC call's outcome from its status, carried by
// trailers (or the headers of a trailers-only response). The status code
// maps to its HTTP equivalent (google.rpc.Code's mapping: RESOURCE_EXHAUSTED
// is 429, UNAVAILABLE 503, ...) and the policy's response rules decide on
// that, so gRPC and HTTP answers follow one configuration.
//
// grpc-go's filter forwards no grpc-status (only trailer metadata), so for
// it the status is read from grpc-status-details-bin when the upstream set
// one, and otherwise inferred: a call that returned a message succeeded
// (a unary handler answers a message or an error, never both); one that
// returned none failed with a status the client did not report, stored as
// UNKNOWN.
func (p *processor) settleRPC(ctx context.Context, carrier []idem.Header) {
	code, msg, known := grpcStatusOf(carrier)
	if !known && p.rpc.proxyless && p.rpc.origin == idem.OriginUpstream {
		code, known = codes.OK, true
		if p.rpc.messages == 0 {
			code, msg = codes.Unknown, "the upstream failed the call; grpc-go's ext_proc client does not report its status"
		}
	}
	status := p.respStatus
	if known {
		status = httpStatusFor(code)
		p.respHeaders = withStatus(p.respHeaders, code, msg)
	}
	action := p.att.ActionFor(p.rpc.origin, status, p.rpc.retried)
	p.LogAt(ctx, slog.LevelDebug, "grpc response", slog.String("grpc_status", codeName(code)),
		slog.Bool("status_known", known), slog.String("origin", p.rpc.origin.String()), slog.String("action", action.String()))
	if action == idem.ActionStore {
		p.settleStored(ctx)
		return
	}
	p.settle(ctx, action)
}

// withStatus sets grpc-status and grpc-message in the stored headers.
func withStatus(hs []idem.Header, code codes.Code, msg string) []idem.Header {
	out := hs[:0:0]
	for _, h := range hs {
		if h.Name != "grpc-status" && h.Name != "grpc-message" {
			out = append(out, h)
		}
	}
	out = append(out, idem.Header{Name: "grpc-status", Value: strconv.Itoa(int(code))})
	if msg != "" {
		out = append(out, idem.Header{Name: "grpc-message", Value: encodeGRPCMessage(msg)})
	}
	return out
}

// grpcStatusOf reads a gRPC status from headers: grpc-status and
// grpc-message, or grpc-status-details-bin (a google.rpc.Status; grpc-go
// forwards it base64-encoded like every binary header).
func grpcStatusOf(hs []idem.Header) (codes.Code, string, bool) {
	if s, ok := firstHeader(hs, "grpc-status"); ok {
		n, err := strconv.ParseUint(s, 10, 32)
		if err == nil {
			msg, _ := firstHeader(hs, "grpc-message")
			return codes.Code(n), decodeGRPCMessage(msg), true
		}
	}
	if b, ok := firstHeader(hs, "grpc-status-details-bin"); ok {
		if st, ok := decodeStatusDetails(b); ok {
			return codes.Code(st.GetCode()), st.GetMessage(), true
		}
	}
	return codes.Unknown, "", false
}

// httpStatusFor is google.rpc.Code's HTTP mapping (google/rpc/code.proto).
func httpStatusFor(c codes.Code) int {
	switch c {
	case codes.OK:
		return 200
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return 400
	case codes.DeadlineExceeded:
		return 504
	case codes.NotFound:
		return 404
	case codes.AlreadyExists, codes.Aborted:
		return 409
	case codes.PermissionDenied:
		return 403
	case codes.Unauthenticated:
		return 401
	case codes.ResourceExhausted:
		return 429
	case codes.Unimplemented:
		return 501
	case codes.Unavailable:
		return 503
	}
	return 500 // UNKNOWN, INTERNAL, DATA_LOSS and codes beyond 16
}

package extproc

import (
	"context"
	"log/slog"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/grpcstatus"
	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// The response side, one path for HTTP responses and gRPC ones: what a
// response's messages say (its origin, status, retries, a gRPC call's
// status at its end) goes to the attempt (attempt.AtResponse), whose
// verdict (pass, store, skip the body, settled) is rendered as the
// message's reply (render.go).

// onResponse answers a message of the response's direction: the
// attempt's verdict on it, rendered once, or, for a body message that does
// not end a response to be stored, the reply that takes the next.
func (p *processor) onResponse(ctx context.Context, m *message) *extprocv3.ProcessingResponse {
	var v attempt.Verdict
	switch {
	case m.phase == phaseResponseHeaders:
		v = p.atResponseHeaders(ctx, m.headers, &m.facts)
	case p.stage != stageResponseBody:
		if l := p.body.learning(); m.phase == phaseResponseBody && l != nil && l.reading {
			return p.learnBody(m.body)
		}
		return p.cont()
	case m.phase == phaseResponseBody:
		resp, end := p.onResponseBody(m.body)
		if !end {
			return resp
		}
		v = p.responseEnd(ctx, nil)
	default: // phaseResponseTrailers: a gRPC call's status is here.
		v = p.responseEnd(ctx, headerList(m.trailers.GetTrailers()))
	}
	resp := p.render(ctx, v)
	if m.phase != phaseResponseHeaders {
		return resp
	}
	// The headers verdicts added (respAdd) go on the reply, if it lets the
	// response go on: only continueWith makes one, without a mutation yet.
	if hr := resp.GetResponseHeaders(); hr != nil && len(p.respAdd) > 0 {
		set := make([]*corev3.HeaderValueOption, len(p.respAdd))
		for i, h := range p.respAdd {
			set[i] = setHeader(h.Name, h.Value, h.Append)
		}
		hr.Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}}
	}
	p.respAdd = nil
	return resp
}

// atResponseHeaders reads a response's headers for the attempt's verdict:
// an HTTP response is judged by its status here, a gRPC call's at its end.
func (p *processor) atResponseHeaders(ctx context.Context, hh *extprocv3.HttpHeaders, f *envoyFacts) attempt.Verdict {
	if p.stage != stageUpstream {
		// Nothing is held: the upstream answered before the request body
		// was complete (possible only in STREAMED mode), Envoy skipped the
		// request path (mode SKIP), or the request was passed or answered
		// already.
		v := p.att.AtResponse(ctx, attempt.Response{})
		if l := p.body.learning(); l != nil && !startLearning(l, hh, p.responseBodyMode) {
			p.body.tools = nil
		}
		return v
	}
	hs := hh.GetHeaders()
	ct, _ := headerBytes(hs, "content-type")
	p.rpc.response = p.rpc.proxyless || (p.rpc.call && isGRPCContentType(string(ct)))
	origin, retried := p.srv.responseOrigin(&p.att, f.attrs, p.rpc.proxyless)
	// Only the status is read here; the headers are copied further down,
	// and only those the record will keep, once the response is to be
	// stored at all.
	statusText, hasStatus := headerBytes(hs, ":status")
	status, err := strconv.Atoi(string(statusText))
	if p.rpc.response {
		p.rpc.origin, p.rpc.retried = origin, retried
		if p.rpc.proxyless && !isGRPCContentType(string(ct)) {
			// grpc-go forwards the upstream's header metadata; with no
			// content-type the upstream never answered as gRPC: its
			// transport failed after the call was sent. The effect may have
			// happened.
			p.rpc.origin = idem.OriginMaybeSent
		}
		if !hasStatus {
			status, err = 200, nil // gRPC responses are HTTP 200; grpc-go sends no :status
		}
	}
	if err != nil {
		status = 0 // no rule covers 0: the outcome is unknown
	}
	p.respStatus = status
	v := p.att.AtResponse(ctx, attempt.Response{Origin: origin, Retried: retried, Status: status, Later: p.rpc.response},
		slog.Int("status", status))
	if v.Kind != attempt.Store {
		return v
	}
	p.respHeaders = keptHeaders(hs, p.att.Policy.StoresHeader, p.respHeaders[:0])
	if v, ok := headerBytes(hs, "content-length"); ok {
		p.respLength = declaredLength(string(v))
	}
	if hh.GetEndOfStream() {
		var carrier []idem.Header
		if p.rpc.response {
			carrier = headerList(hs) // trailers-only: the status is in these headers
		}
		return p.responseEnd(ctx, carrier)
	}
	return v
}

// onResponseBody reads one body message of a response to be stored. In an
// echo mode its echo is withheld until the outcome is stored, so that a
// client never holds an answer the record does not have yet; the held
// bytes are acknowledged to grpc-go's flow control at once. A response
// larger than the policy's max_stored_body is not held: it passes on as it
// comes and is recorded without its body. end reports the message that
// ends the response: its reply is the attempt's verdict (onResponse).
func (p *processor) onResponseBody(body *extprocv3.HttpBody) (resp *extprocv3.ProcessingResponse, end bool) {
	p.storeResponseBytes(body)
	echo := echoes(p.responseBodyMode)
	// In BUFFERED mode an HTTP response's body is whole even when trailers
	// follow; a gRPC response's status comes in the trailers. In an echo
	// mode the end comes without trailers (Envoy, a response without
	// them): the record settles before the last echo lets the client have
	// the answer, also when it is recorded without its body.
	if body.GetEndOfStream() || (!echo && !p.rpc.response && p.responseBodyMode == procmodev3.ProcessingMode_BUFFERED) {
		return nil, true
	}
	switch {
	case !echo:
		return continueWith(p.phase, nil), false
	case p.respTooLarge:
		return p.cont(), false
	}
	p.rpc.echo = heldEcho{body: p.respBody, phase: p.phase, framed: p.responseBodyMode == procmodev3.ProcessingMode_GRPC}
	if p.rpc.reqWindow == 0 || len(body.GetBody()) == 0 {
		return nil, false
	}
	return &extprocv3.ProcessingResponse{ServerWindowUpdate: &extprocv3.ProcessingResponse_ServerWindowUpdate{
		WindowIncrementUpstreamToSidestream: int64(len(body.GetBody())),
	}}, false
}

// responseEnd is the attempt's verdict on a response whose end has
// arrived: an HTTP response was judged at its headers, a gRPC one is
// judged by its status, carried by trailers (or the headers of a
// trailers-only response). The status code maps to its HTTP equivalent
// (google.rpc.Code's mapping: RESOURCE_EXHAUSTED is 429, UNAVAILABLE 503,
// ...) and the policy's response rules decide on that, so gRPC and HTTP
// answers follow one configuration.
//
// grpc-go's filter forwards no grpc-status (only trailer metadata), so for
// it the status is read from grpc-status-details-bin when the upstream set
// one, and otherwise inferred: a call that returned a message succeeded
// (a unary handler answers a message or an error, never both); one that
// returned none failed with a status the client did not report, stored as
// UNKNOWN.
func (p *processor) responseEnd(ctx context.Context, carrier []idem.Header) attempt.Verdict {
	r := attempt.Response{End: true, Origin: p.rpc.origin, Retried: p.rpc.retried, Status: p.respStatus}
	if !p.rpc.response {
		r.Read = p.readResponse()
		return p.att.AtResponse(ctx, r)
	}
	code, msg, known := grpcstatus.Of(carrier)
	if !known && p.rpc.proxyless && p.rpc.origin == idem.OriginUpstream {
		code, known = codes.OK, true
		if p.rpc.messages == 0 {
			code, msg = codes.Unknown, "the upstream failed the call; grpc-go's ext_proc client does not report its status"
		}
	}
	if known {
		r.Status = grpcstatus.HTTPStatus(code)
		p.respHeaders = grpcstatus.With(p.respHeaders, code, msg)
	}
	r.Read = p.readResponse()
	return p.att.AtResponse(ctx, r, slog.String("grpc_status", grpcstatus.Name(code)), slog.Bool("status_known", known))
}

// readResponse is the response read so far, for the record.
func (p *processor) readResponse() idem.Response {
	return idem.Response{Status: p.respStatus, Headers: p.respHeaders, Body: p.respBody, BodyOmitted: p.respTooLarge}
}

// storeResponseBytes keeps a response body chunk for the record, up to the
// policy's max_stored_body and within the server's body budget; past
// either the response is recorded without its body. grpc-go sends bare
// messages; in GRPC mode they are stored framed, as gRPC sends them on the
// wire and Envoy passes them. It counts the response's messages (a gRPC
// call's outcome may be inferred from them: responseEnd).
func (p *processor) storeResponseBytes(body *extprocv3.HttpBody) {
	p.rpc.messages++
	if p.respTooLarge {
		return
	}
	framed := p.responseBodyMode == procmodev3.ProcessingMode_GRPC
	n := len(body.GetBody())
	if framed {
		n += frameHeaderLen
	}
	capacity := chunkCapacity(p.respBody, n, framed, p.respLength, p.att.Policy.MaxStoredBody)
	if len(p.respBody)+n > p.att.Policy.MaxStoredBody || !p.srv.budget.hold(&p.held, capacity-cap(p.respBody)) {
		p.respTooLarge, p.respBody = true, nil
		p.srv.budget.release(&p.held)
		return
	}
	p.respBody = keepChunk(p.respBody, body.GetBody(), framed, body.GetGrpcMessageCompressed(), capacity)
}

// responseOrigin classifies a response from its attributes. Without
// response.code_details a response of Envoy's own (a 504 route timeout, a
// 503 reset) looks like the upstream's and would be stored and replayed;
// without upstream.request_attempt_count a router failure after a retry
// looks like a first attempt that never left, and is kept as maybe-sent
// instead of released. Both absences are reported for a request that holds
// a record. retried says whether an earlier upstream attempt may have been
// sent (Signals.MayHaveRetried). grpc-go's filter (gRFC A93, proxyless)
// makes no local replies of Envoy's kind and no router retries: there is
// nothing for the attributes to tell apart, and its client makes one
// attempt per call.
func (s *Server) responseOrigin(a *attempt.Attempt, attrs *structpb.Struct, proxyless bool) (origin idem.Origin, retried bool) {
	fields := attrs.GetFields()
	dv, hasDetails := fields[envoyorigin.AttrCodeDetails]
	// Envoy sends a CEL uint as a number (matching_utils.cc
	// evaluateAttributes); any other kind is not a count.
	_, hasAttempts := fields[envoyorigin.AttrAttemptCount].GetKind().(*structpb.Value_NumberValue)
	if !proxyless { // called only while a record is held
		if !hasDetails {
			s.missingAttribute(a, a.Policy.Name, envoyorigin.AttrCodeDetails,
				"Envoy's own error replies cannot be told from the upstream's and are stored as its answer")
		}
		if !hasAttempts {
			s.missingAttribute(a, a.Policy.Name, envoyorigin.AttrAttemptCount,
				"a response after a router retry cannot be told from a first attempt's; what would be released (a connection failure, an overflow, the upstream's 408/425/429) is kept as outcome unknown instead")
		}
	}
	sig := envoyorigin.Signals{
		Details: valueString(dv), HasDetails: hasDetails,
		Flags:    attrUint(attrs, envoyorigin.AttrFlags),
		Attempts: attrUint(attrs, envoyorigin.AttrAttemptCount), HasAttempts: hasAttempts,
	}
	return envoyorigin.Classify(sig), sig.MayHaveRetried() && !proxyless
}

// maySettle reports whether answering m may settle the record: the
// response's headers, or the end of its body or its trailers, on a stream
// whose messages Envoy times (no timer runs in the echo modes, and
// grpc-go takes any first reply but the headers' as an error).
func maySettle(m *message, st stage, mode procmodev3.ProcessingMode_BodySendMode, proxyless bool) bool {
	if proxyless || echoes(mode) {
		return false
	}
	switch m.phase {
	case phaseResponseHeaders:
		return st == stageUpstream
	case phaseResponseBody:
		return st == stageResponseBody && (m.body.GetEndOfStream() || mode == procmodev3.ProcessingMode_BUFFERED)
	}
	return st == stageResponseBody
}

package envoysim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/status"
)

// mutate applies a CommonResponse's header mutation; a rejected mutation is
// a processing error and fails closed like Envoy's handleErrorResponse.
func (x *exchange) mutate(headers []Header, cr *extprocv3.CommonResponse) ([]Header, *Response) {
	if cr.GetHeaderMutation() == nil {
		return headers, nil
	}
	out, err := x.applyMutation(headers, cr.GetHeaderMutation())
	if err != nil {
		return headers, x.failedReply(err)
	}
	return out, nil
}

// failedReply ends the exchange on a reply Envoy could not apply
// (onReceiveMessage → Filter::handleErrorResponse): status_on_error, the
// status message as details (spaces as "_", sendImmediateResponse).
func (x *exchange) failedReply(err error) *Response {
	x.res.ProcessingError = err
	x.side.close()
	x.complete = true
	return x.errorReply(x.statusOnError(), spaceless(err.Error()))
}

// call sends one message and waits for its reply. It returns the reply
// (nil when processing ended and the request continues unprocessed), or
// the local reply that replaces the response.
func (x *exchange) call(ctx context.Context, pr *extprocv3.ProcessingRequest, phase Phase) (*extprocv3.ProcessingResponse, *Response, error) {
	if err := x.sendOnly(ctx, pr, phase); err != nil {
		local, ferr := x.failure(ctx, err)
		return nil, local, ferr
	}
	return x.await(ctx, phase)
}

func (x *exchange) sendOnly(ctx context.Context, pr *extprocv3.ProcessingRequest, phase Phase) error {
	if !x.side.opened {
		x.res.StreamOpened = true
		if err := x.side.open(ctx); err != nil {
			return err
		}
	}
	if !x.configSent {
		x.configSent = true
		pr.ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:                         x.mode.GetRequestBodyMode(),
			ResponseBodyMode:                        x.mode.GetResponseBodyMode(),
			SendBodyWithoutWaitingForHeaderResponse: x.f.cfg.GetSendBodyWithoutWaitingForHeaderResponse(),
		}
	}
	pr.MetadataContext = x.metadataContext()
	x.addAttributes(pr, phase)
	m := Message{Phase: phase}
	switch r := pr.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		m.EndOfStream = r.RequestHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		m.EndOfStream = r.ResponseHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_RequestBody:
		m.EndOfStream, m.BodyLen = r.RequestBody.GetEndOfStream(), len(r.RequestBody.GetBody())
	case *extprocv3.ProcessingRequest_ResponseBody:
		m.EndOfStream, m.BodyLen = r.ResponseBody.GetEndOfStream(), len(r.ResponseBody.GetBody())
	case *extprocv3.ProcessingRequest_RequestTrailers, *extprocv3.ProcessingRequest_ResponseTrailers:
		m.EndOfStream = true
	}
	x.res.Messages = append(x.res.Messages, m)
	if x.f.opts.OnReply != nil {
		x.sentAt = append(x.sentAt, time.Now())
	}
	return x.side.send(pr)
}

// await reads the reply to the oldest outstanding message of phase.
func (x *exchange) await(ctx context.Context, phase Phase) (*extprocv3.ProcessingResponse, *Response, error) {
	idx := -1
	for i := range x.res.Messages {
		if x.res.Messages[i].Phase == phase && x.res.Messages[i].Reply == "" {
			idx = i
			break
		}
	}
	if idx < 0 {
		return nil, nil, fmt.Errorf("envoysim: no outstanding %s message", phase)
	}
	deadline := time.Now().Add(x.messageTimeout())
	extended := false
	reply, err := x.side.recv(ctx, deadline)
	for err == nil && reply.GetResponse() == nil && reply.GetOverrideMessageTimeout() != nil {
		// A new timeout for the outstanding message, not its reply
		// (onReceiveMessage checks it first; onNewTimeout honours it once,
		// within 1 ms..max_message_timeout, which defaults to 0: never).
		d := reply.GetOverrideMessageTimeout().AsDuration()
		if max := x.f.cfg.GetMaxMessageTimeout().AsDuration(); !extended && d >= time.Millisecond && d <= max {
			deadline, extended = time.Now().Add(d), true
		}
		reply, err = x.side.recv(ctx, deadline)
	}
	if ctx.Err() != nil {
		return nil, nil, errClientGone
	}
	if err != nil {
		x.res.Messages[idx].Reply = "error: " + err.Error()
		local, ferr := x.failure(ctx, err)
		return nil, local, ferr
	}
	if x.f.opts.OnReply != nil && idx < len(x.sentAt) {
		x.f.opts.OnReply(phase, time.Since(x.sentAt[idx]))
	}
	if ir := reply.GetImmediateResponse(); ir != nil {
		x.res.Messages[idx].Reply = "immediate_response"
		x.side.close()
		x.complete = true
		return nil, x.immediate(ir), nil
	}
	if !replyMatches(reply, phase) {
		err := fmt.Errorf("%w: %s reply to a %s message", ErrSpurious, replyKind(reply), phase)
		x.res.Messages[idx].Reply = "spurious"
		local, ferr := x.failure(ctx, err)
		return nil, local, ferr
	}
	x.res.Messages[idx].Reply = "continue"
	if mo := reply.GetModeOverride(); mo != nil && (phase == PhaseRequestHeaders || phase == PhaseResponseHeaders) {
		if x.overrideAllowed() && x.applyOverride(mo) {
			x.res.Messages[idx].Reply = "mode_override"
		} else {
			x.res.Messages[idx].Reply = "mode_override_ignored"
		}
	}
	if x.f.opts.CloseStreamEarly && x.lastReply(phase, x.res.Messages[idx]) {
		x.side.close()
		x.complete = true
		x.res.ClosedEarlyAfter = phase
	}
	return reply, nil, nil
}

// lastReply reports whether, after this reply, no later phase needs the
// server, as Filter::closeGrpcStreamIfLastRespReceived decides (ext_proc.cc,
// 1.37+): after the request headers when the request has no body (or its
// body mode is NONE and no trailers are sent) and the response direction
// sends nothing; after the last request body or the request trailers when
// the response direction sends nothing; after the response headers when the
// response has no body (or body NONE and no trailers); after the last
// response body; after the response trailers. isLastBodyResponse is false
// in BUFFERED and BUFFERED_PARTIAL ("skip stream closing optimization for
// BUFFERED and BUFFERED_PARTIAL for now") and true for the STREAMED chunk
// that ends the stream. The response direction "sends nothing" as
// EncodingProcessorState::noExternalProcess (processor_state.h) says:
// !send_headers_ && !send_trailers_ && body_mode_ == NONE.
func (x *exchange) lastReply(phase Phase, m Message) bool {
	md := x.mode
	encodingIdle := !sendHeaders(md.GetResponseHeaderMode()) && md.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_NONE &&
		!sendTrailers(md.GetResponseTrailerMode())
	lastBody := func(mode extprocfilterv3.ProcessingMode_BodySendMode) bool {
		return mode == extprocfilterv3.ProcessingMode_STREAMED && m.EndOfStream
	}
	switch phase {
	case PhaseRequestHeaders:
		return (m.EndOfStream || md.GetRequestBodyMode() == extprocfilterv3.ProcessingMode_NONE && !sendTrailers(md.GetRequestTrailerMode())) &&
			encodingIdle
	case PhaseRequestBody:
		return lastBody(md.GetRequestBodyMode()) && encodingIdle
	case PhaseRequestTrailers:
		return encodingIdle
	case PhaseResponseHeaders:
		return m.EndOfStream || md.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_NONE && !sendTrailers(md.GetResponseTrailerMode())
	case PhaseResponseBody:
		return lastBody(md.GetResponseBodyMode())
	case PhaseResponseTrailers:
		return true
	}
	return false
}

func (x *exchange) messageTimeout() time.Duration {
	if d := x.f.cfg.GetMessageTimeout(); d != nil {
		return d.AsDuration()
	}
	return DefaultMessageTimeout
}

func (x *exchange) statusOnError() int {
	if c := int(x.f.cfg.GetStatusOnError().GetCode()); c >= 400 && c <= 599 {
		return c
	}
	return 500
}

// failure handles a failed side stream: a server that closed with OK, or
// failure_mode_allow, lets the request continue unprocessed; otherwise the
// request fails closed (504 for a message timeout, status_on_error else).
func (x *exchange) failure(ctx context.Context, err error) (*Response, error) {
	if ctx.Err() != nil {
		return nil, errClientGone
	}
	x.side.close()
	x.complete = true
	if errors.Is(err, errServerClosed) {
		return nil, nil
	}
	x.res.ProcessingError = err
	if x.f.cfg.GetFailureModeAllow() {
		return nil, nil
	}
	if errors.Is(err, errMessageTimeout) {
		return x.errorReply(504, "ext_proc_error_per-message_timeout_exceeded"), nil
	}
	if st, ok := status.FromError(err); ok && st.Code() != 0 && !errors.Is(err, ErrSpurious) {
		// Filter::onGrpcError: "%s_gRPC_error_%i{%s}" with ErrorPrefix
		// "ext_proc_error" and the status message, spaces then replaced by
		// "_" in sendImmediateResponse.
		return x.errorReply(x.statusOnError(),
			spaceless("ext_proc_error_gRPC_error_"+strconv.Itoa(int(st.Code()))+"{"+st.Message()+"}")), nil
	}
	return x.errorReply(x.statusOnError(), err.Error()), nil
}

func (x *exchange) errorReply(code int, details string) *Response {
	if x.isGRPC() {
		return grpcLocalReply(code, nil, nil, nil, details)
	}
	return &Response{Status: code, Details: details}
}

// immediate builds the local reply for an immediate_response
// (Filter::sendImmediateResponse).
func (x *exchange) immediate(ir *extprocv3.ImmediateResponse) *Response {
	code := int(ir.GetStatus().GetCode())
	if code < 200 {
		code = 200
	}
	if x.isGRPC() {
		headers := []Header{{":status", strconv.Itoa(code)}}
		if m := ir.GetHeaders(); m != nil {
			var err error
			if headers, err = x.applyMutation(headers, m); err != nil {
				x.res.ProcessingError = err
			}
		}
		var gs *uint32
		if g := ir.GetGrpcStatus(); g != nil {
			v := g.GetStatus()
			gs = &v
		}
		return grpcLocalReply(code, withoutPseudo(headers), ir.GetBody(), gs, ir.GetDetails())
	}
	// Utility::prepareLocalReply (http/utility.cc): the map starts with
	// :status, the filter's modify_headers (the immediate response's
	// mutation) runs on it, and only then are content-length and
	// content-type settled: set from the body when there is one (a
	// content-type the mutation set is kept), removed when it is empty,
	// whatever the mutation put there.
	headers := []Header{{":status", strconv.Itoa(code)}}
	if m := ir.GetHeaders(); m != nil {
		var err error
		// Filter::sendImmediateResponse only logs a failed mutation
		// ("Immediate response mutations failed with"); what it applied
		// before failing stays.
		if headers, err = x.applyMutation(headers, m); err != nil {
			x.res.ProcessingError = err
		}
	}
	headers = prepareLocalReply(headers, ir.GetBody())
	// sendImmediateResponse: StringUtil::replaceAllEmptySpace(details).
	return &Response{Status: code, Headers: withoutPseudo(headers), Body: ir.GetBody(), Details: spaceless(ir.GetDetails())}
}

// prepareLocalReply settles a non-gRPC local reply's content headers as
// Utility::prepareLocalReply does after modify_headers: with a body,
// content-length is the body's and content-type text/plain unless one is
// set; without, both are removed.
func prepareLocalReply(headers []Header, body []byte) []Header {
	if len(body) == 0 {
		return remove(remove(headers, "content-length"), "content-type")
	}
	headers = append(remove(headers, "content-length"), Header{"content-length", strconv.Itoa(len(body))})
	if _, ok := Get(headers, "content-type"); !ok {
		headers = append(headers, Header{"content-type", "text/plain"})
	}
	return headers
}

func replyMatches(r *extprocv3.ProcessingResponse, phase Phase) bool {
	switch phase {
	case PhaseRequestHeaders:
		return r.GetRequestHeaders() != nil
	case PhaseRequestBody:
		return r.GetRequestBody() != nil
	case PhaseRequestTrailers:
		return r.GetRequestTrailers() != nil
	case PhaseResponseHeaders:
		return r.GetResponseHeaders() != nil
	case PhaseResponseBody:
		return r.GetResponseBody() != nil
	case PhaseResponseTrailers:
		return r.GetResponseTrailers() != nil
	}
	return false
}

func replyKind(r *extprocv3.ProcessingResponse) string {
	switch r.GetResponse().(type) {
	case nil:
		return "empty"
	case *extprocv3.ProcessingResponse_RequestHeaders:
		return "request_headers"
	case *extprocv3.ProcessingResponse_RequestBody:
		return "request_body"
	case *extprocv3.ProcessingResponse_RequestTrailers:
		return "request_trailers"
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		return "response_headers"
	case *extprocv3.ProcessingResponse_ResponseBody:
		return "response_body"
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		return "response_trailers"
	}
	return fmt.Sprintf("%T", r.GetResponse())
}

package envoysim

import (
	"context"
	"fmt"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// duplexWait bounds the wait for a reply in FULL_DUPLEX_STREAMED mode.
// Envoy has no per-message timer there (processor_state.cc
// onStartProcessorCall skips it); this only keeps a broken test from
// hanging.
const duplexWait = 30 * time.Second

func fullDuplex(m extprocfilterv3.ProcessingMode_BodySendMode) bool {
	return m == extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// duplex runs one direction (request or response) whose body mode is
// FULL_DUPLEX_STREAMED, as Envoy does:
//
//   - The headers, every body chunk and the trailers are sent as they
//     arrive, without waiting for any reply: data arriving while the headers
//     reply is pending is sent on anyway, and the state stays
//     HeadersCallback (ext_proc.cc onData, handleDataStreamedModeBase);
//     trailers are sent at once, even with replies outstanding (onTrailers).
//   - Envoy drains the original body: what goes on is only what the server
//     sends back as body_mutation.streamed_response, in any number of body
//     replies; one with end_of_stream ends the body (processor_state.cc
//     handleDuplexStreamedBodyResponse). A plain body mutation is spurious
//     here (handleStreamedBodyCallback), as is a body reply before the
//     headers reply (handleBodyResponse, isValidBodyCallbackState).
//   - A trailers reply is valid at any time (isValidTrailersCallbackState)
//     and, when trailers were sent, is what ends the direction.
//   - No per-message timeout; mode_override is never honoured with this
//     mode configured (onReceiveMessage).
func (x *exchange) duplex(ctx context.Context, request bool, headers []Header, body []byte, trailers []Header) ([]Header, []byte, []Header, *Response, error) {
	d := duplexDirection{request: request, hp: PhaseRequestHeaders, bp: PhaseRequestBody, tp: PhaseRequestTrailers}
	headerMode, trailerMode := x.mode.GetRequestHeaderMode(), x.mode.GetRequestTrailerMode()
	if !request {
		d.hp, d.bp, d.tp = PhaseResponseHeaders, PhaseResponseBody, PhaseResponseTrailers
		headerMode, trailerMode = x.mode.GetResponseHeaderMode(), x.mode.GetResponseTrailerMode()
	}
	d.hasBody = len(body) > 0
	d.sentHeaders = sendHeaders(headerMode)
	d.sentTrailers = len(trailers) > 0 && sendTrailers(trailerMode)
	if err := x.duplexSend(ctx, d, headers, body, trailers); err != nil {
		local, ferr := x.failure(ctx, err)
		return headers, nil, trailers, local, ferr
	}
	return x.duplexReceive(ctx, d, headers, trailers)
}

// duplexDirection is one direction of a FULL_DUPLEX_STREAMED exchange: its
// phases and what was sent.
type duplexDirection struct {
	request                            bool
	hp, bp, tp                         Phase
	hasBody, sentHeaders, sentTrailers bool
}

// duplexSend sends the headers, every body chunk and the trailers at once.
func (x *exchange) duplexSend(ctx context.Context, d duplexDirection, headers []Header, body []byte, trailers []Header) error {
	if d.sentHeaders {
		hh := &extprocv3.HttpHeaders{Headers: toHeaderMap(headers), EndOfStream: !d.hasBody && len(trailers) == 0}
		pr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: hh}}
		if !d.request {
			pr.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}
		}
		if err := x.sendOnly(ctx, pr, d.hp); err != nil {
			return err
		}
	}
	if d.hasBody {
		chunks := x.chunks(body)
		for i, c := range chunks {
			if err := x.sendOnly(ctx, bodyRequest(d.bp, c, i == len(chunks)-1 && len(trailers) == 0), d.bp); err != nil {
				return err
			}
		}
	}
	if d.sentTrailers {
		ht := &extprocv3.HttpTrailers{Trailers: toHeaderMap(trailers)}
		pr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: ht}}
		if !d.request {
			pr.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: ht}
		}
		if err := x.sendOnly(ctx, pr, d.tp); err != nil {
			return err
		}
	}
	return nil
}

// duplexReceive reads the replies until every part sent is answered.
func (x *exchange) duplexReceive(ctx context.Context, d duplexDirection, headers, trailers []Header) ([]Header, []byte, []Header, *Response, error) {
	fail := func(err error) ([]Header, []byte, []Header, *Response, error) {
		local, ferr := x.failure(ctx, err)
		return headers, nil, trailers, local, ferr
	}
	var out []byte
	gotHeaders, bodyDone, trailersDone := !d.sentHeaders, !d.hasBody, !d.sentTrailers
	for !gotHeaders || !bodyDone || !trailersDone {
		reply, err := x.side.recv(ctx, time.Now().Add(duplexWait))
		if ctx.Err() != nil {
			return headers, nil, trailers, nil, errClientGone
		}
		if err != nil {
			x.markAll("error: " + err.Error())
			return fail(err)
		}
		if reply.GetResponse() == nil && reply.GetOverrideMessageTimeout() != nil {
			continue // no timer to override in this mode
		}
		if ir := reply.GetImmediateResponse(); ir != nil {
			x.markAll("immediate_response")
			x.side.close()
			x.complete = true
			return headers, nil, trailers, x.immediate(ir), nil
		}
		switch {
		case !gotHeaders:
			if !replyMatches(reply, d.hp) {
				x.markAll("spurious")
				return fail(fmt.Errorf("%w: %s reply while the %s reply is pending", ErrSpurious, replyKind(reply), d.hp))
			}
			x.mark(d.hp, "continue")
			cr := reply.GetRequestHeaders().GetResponse()
			if !d.request {
				cr = reply.GetResponseHeaders().GetResponse()
			}
			var local *Response
			if headers, local = x.mutate(headers, cr); local != nil {
				return headers, nil, trailers, local, nil
			}
			gotHeaders = true
		case replyMatches(reply, d.bp):
			sr := bodyReply(d.bp, reply).GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				x.markAll("spurious")
				return fail(fmt.Errorf("%w: a body reply without streamed_response in FULL_DUPLEX_STREAMED", ErrSpurious))
			}
			out = append(out, sr.GetBody()...)
			if sr.GetEndOfStream() {
				x.mark(d.bp, "streamed")
				bodyDone = true
			}
		case d.sentTrailers && replyMatches(reply, d.tp):
			x.mark(d.bp, "streamed")
			x.mark(d.tp, "continue")
			if m := reply.GetRequestTrailers().GetHeaderMutation(); d.request && m != nil {
				trailers, err = x.applyMutation(trailers, m)
			} else if m := reply.GetResponseTrailers().GetHeaderMutation(); !d.request && m != nil {
				trailers, err = x.applyMutation(trailers, m)
			}
			if err != nil {
				x.res.ProcessingError = err
				x.side.close()
				x.complete = true
				return headers, nil, trailers, x.errorReply(x.statusOnError(), err.Error()), nil
			}
			bodyDone, trailersDone = true, true
		default:
			x.markAll("spurious")
			return fail(fmt.Errorf("%w: %s reply in FULL_DUPLEX_STREAMED %s", ErrSpurious, replyKind(reply), d.hp))
		}
	}
	return headers, out, trailers, nil, nil
}

// chunks splits a body as it would arrive from the network (Options.ChunkSize).
func (x *exchange) chunks(body []byte) [][]byte {
	n := x.f.opts.ChunkSize
	if n <= 0 {
		return [][]byte{body}
	}
	var out [][]byte
	for len(body) > n {
		out = append(out, body[:n])
		body = body[n:]
	}
	return append(out, body)
}

// mark records reply as the answer to every outstanding message of phase.
func (x *exchange) mark(phase Phase, reply string) {
	for i := range x.res.Messages {
		if m := &x.res.Messages[i]; m.Phase == phase && m.Reply == "" {
			m.Reply = reply
		}
	}
}

// markAll records reply for every outstanding message.
func (x *exchange) markAll(reply string) {
	for i := range x.res.Messages {
		if m := &x.res.Messages[i]; m.Reply == "" {
			m.Reply = reply
		}
	}
}

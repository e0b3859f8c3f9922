package extproc

import (
	"errors"
)

// sequence is what a stream has seen of each direction, so that a message
// that cannot follow the ones before it ends the stream (SECURITY.md: out
// of order ext_proc messages end with INVALID_ARGUMENT), whatever stage the
// processor is in. It checks the order of each direction's messages, and
// one rule across them: the request's body and trailers come before any
// response phase unless the request body streams. In STREAMED and
// FULL_DUPLEX_STREAMED Envoy forwards the request as it arrives, so the
// upstream may answer before it ends (processor_state.cc
// handleHeaderContinue, handleDuplexStreamedBodyResponse), and grpc-go
// streams client messages while the response flows; in BUFFERED and
// BUFFERED_PARTIAL the request goes upstream only after its body's reply,
// and a local reply (413 over the buffer, another filter's) ends decoding,
// so no request body follows a response.
//
// What the clients send, and so what must stay allowed:
//   - Envoy: one headers message per direction; end_of_stream on headers
//     means no body and no trailers follow (processor_state.cc
//     handleHeaderContinue; envoysim run). A body message has
//     end_of_stream false when trailers follow, also in BUFFERED mode,
//     where the body goes at the trailers (ext_proc.cc Filter::onTrailers
//     setupBodyChunk(..., false)); the chunk with end_of_stream true is
//     the last message of its direction. Trailers come once
//     (Filter::sendTrailers, trailersSentToServer), and may follow the
//     headers directly when the body is empty.
//   - Envoy sends every configured phase when it does not honour a
//     mode_override; those are in order too, and answered CONTINUE.
//   - grpc-go (internal/xds/httpfilter/extproc ext_proc.go): request
//     headers with end_of_stream false, one body message per client
//     message (end_of_stream false), then the half-close as a body with
//     end_of_stream and end_of_stream_without_message (halfClose);
//     response headers with end_of_stream true only for a trailers-only
//     response, after which it sends no trailers message
//     (initiateResponseTrailerProcessing); response messages carry no
//     end_of_stream and trailers end the response.
//
// Response phases without request headers stay allowed: a route may skip
// the request side (mode SKIP); the processor then passes the request
// through. A response body or trailers before response headers, or a
// request body or trailers before request headers, is refused: the
// documented configuration sends both headers phases (docs/envoy.md,
// "The filter"), and without them there is no status to record.
type sequence struct {
	reqHeaders, reqEnded   bool
	respHeaders, respEnded bool
}

// next records a message of phase ph (eos: it ends its direction), or says
// why it cannot follow what came before. interleaved says the request body
// streams (see sequence).
func (s *sequence) next(ph phase, eos, interleaved bool) error {
	if !interleaved && s.respHeaders {
		switch ph {
		case phaseRequestBody:
			return errors.New("request_body after response_headers, and the request body does not stream")
		case phaseRequestTrailers:
			return errors.New("request_trailers after response_headers, and the request body does not stream")
		}
	}
	switch ph {
	case phaseRequestHeaders:
		switch {
		case s.reqHeaders:
			return errors.New("request_headers received twice")
		case s.respHeaders:
			return errors.New("request_headers after response_headers")
		}
		s.reqHeaders, s.reqEnded = true, eos
	case phaseRequestBody:
		switch {
		case !s.reqHeaders:
			return errors.New("request_body before request_headers")
		case s.reqEnded:
			return errors.New("request_body after the request's end_of_stream")
		}
		s.reqEnded = eos
	case phaseRequestTrailers:
		switch {
		case !s.reqHeaders:
			return errors.New("request_trailers before request_headers")
		case s.reqEnded:
			return errors.New("request_trailers after the request's end_of_stream")
		}
		s.reqEnded = true
	case phaseResponseHeaders:
		if s.respHeaders {
			return errors.New("response_headers received twice")
		}
		s.respHeaders, s.respEnded = true, eos
	case phaseResponseBody:
		switch {
		case !s.respHeaders:
			return errors.New("response_body before response_headers")
		case s.respEnded:
			return errors.New("response_body after the response's end_of_stream")
		}
		s.respEnded = eos
	case phaseResponseTrailers:
		switch {
		case !s.respHeaders:
			return errors.New("response_trailers before response_headers")
		case s.respEnded:
			return errors.New("response_trailers after the response's end_of_stream")
		}
		s.respEnded = true
	}
	return nil
}

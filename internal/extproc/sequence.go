package extproc

import (
	"errors"
	"fmt"
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
	// headers and ended, per direction: [0] the request's, [1] the
	// response's.
	headers, ended [2]bool
}

// next records a message of phase ph (eos: it ends its direction), or says
// why it cannot follow what came before. interleaved says the request body
// streams (see sequence).
func (s *sequence) next(ph phase, eos, interleaved bool) error {
	dir := ph / phaseResponseHeaders
	atHeaders := ph == phaseRequestHeaders || ph == phaseResponseHeaders
	switch {
	case atHeaders && s.headers[dir]:
		return fmt.Errorf("%v received twice", ph)
	case ph == phaseRequestHeaders && s.headers[1]:
		return errors.New("request_headers after response_headers")
	case dir == 0 && !atHeaders && s.headers[1] && !interleaved:
		return fmt.Errorf("%v after response_headers, and the request body does not stream", ph)
	case !atHeaders && !s.headers[dir]:
		return fmt.Errorf("%v before %v", ph, dir*phaseResponseHeaders)
	case !atHeaders && s.ended[dir]:
		return fmt.Errorf("%v after the %s's end_of_stream", ph, [...]string{"request", "response"}[dir])
	}
	s.headers[dir] = true
	s.ended[dir] = eos || ph == phaseRequestTrailers || ph == phaseResponseTrailers
	return nil
}

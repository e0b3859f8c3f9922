package extproc

import (
	"context"
	"errors"
	"fmt"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// stage is where a stream is in the request's life.
type stage uint8

const (
	// stageRequestHeaders: nothing received yet.
	stageRequestHeaders stage = iota
	// stageRequestBody: a protected request's body is being read.
	stageRequestBody
	// stageUpstream: reserved; the upstream has the request.
	stageUpstream
	// stageResponseBody: the response will be stored; its body is read.
	stageResponseBody
	// stagePassThrough: nothing more to do for this request; every later
	// message is answered CONTINUE (Envoy sends them anyway when it does
	// not honour mode_override).
	stagePassThrough
)

// phase is the kind of message being answered: its reply must be of the
// matching kind (Envoy rejects any other as spurious).
type phase uint8

const (
	phaseRequestHeaders phase = iota
	phaseRequestBody
	phaseRequestTrailers
	phaseResponseHeaders
	phaseResponseBody
	phaseResponseTrailers
)

// protocolError is a message that cannot follow the ones before it: the
// stream ends with INVALID_ARGUMENT, which Envoy turns into its
// status_on_error (fail closed).
type protocolError struct{ error }

// processor holds everything about one HTTP request.
type processor struct {
	srv      *Server
	policies *policy.Set

	// Body modes in force on Envoy's side, from protocol_config. Without
	// one (Envoy before 1.30 did not send it) the recommended BUFFERED
	// configuration is assumed and no override is asked for.
	requestBodyMode, responseBodyMode procmodev3.ProcessingMode_BodySendMode
	modesKnown                        bool
	// stage, phase, waiting and respTooLarge sit next to modesKnown, in what would be
	// padding: a processor is allocated per request, and this keeps it in
	// the 480 byte size class.
	stage stage
	// phase is the message being answered; msgBody its body, for a body
	// message (echoed back in the echo modes).
	phase phase
	// waiting: the reply just queued extends Envoy's timer for a wait
	// (attempt.Wait); the loop sends it, then calls resume.
	waiting bool
	// respTooLarge: the response is recorded without its body.
	respTooLarge bool
	msgBody      *extprocv3.HttpBody

	// att is the attempt: policy, record, token, what it holds.
	att        attempt.Attempt
	method     string
	path       string
	reqHeaders []idem.Header
	reqBody    []byte
	// held is what this stream's buffered bodies take of the server's
	// budget (budget.go).
	held int64

	trace streamTrace

	respStatus  int
	respHeaders []idem.Header
	respBody    []byte

	rpc rpcState
	seq sequence
	// body is set for a request whose policy is decided at its body
	// (request.go, deferToBody); nil on every other request.
	body *bodyDecision

	// respAdd are headers the response headers reply adds to the response
	// the client gets (attempt.Verdict.Add). HTTP only.
	respAdd []attempt.ResponseHeader
}

func newProcessor(s *Server, set *policy.Set) *processor {
	p := &processor{srv: s, policies: set}
	p.att = attempt.New(&s.att, p)
	return p
}

// Decided reports a decision to the observer and on the stream's span
// (attempt.Conversation).
func (p *processor) Decided(d idem.Decision) {
	p.srv.obs.Decided(p.att.PolicyName(), d)
	p.trace.decided(d)
}

// Background is the context of work that outlives the message at hand:
// it carries the stream's span (attempt.Conversation).
func (p *processor) Background() context.Context { return p.trace.background() }

// message is what the server reads of one ext_proc message: its phase
// and payload, and Envoy's facts sent with it. It is read once, by the
// stream loop (messageOf); nothing past it sees the whole message.
type message struct {
	phase    phase
	known    bool // a request or response phase (else: window update, or unknown)
	eos      bool
	headers  *extprocv3.HttpHeaders
	body     *extprocv3.HttpBody
	trailers *extprocv3.HttpTrailers
	facts    envoyFacts
	// windowUpdate: a message with no phase that only acknowledges what
	// the server sent (grpc-go's flow control).
	windowUpdate bool
	// other is the member of an unknown kind, for the error.
	other any
}

// messageOf reads one message.
func messageOf(req *extprocv3.ProcessingRequest) message {
	m := message{known: true, facts: envoyFactsOf(req)}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		m.phase, m.headers, m.eos = phaseRequestHeaders, r.RequestHeaders, r.RequestHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_RequestBody:
		m.phase, m.body, m.eos = phaseRequestBody, r.RequestBody, r.RequestBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_RequestTrailers:
		m.phase, m.trailers, m.eos = phaseRequestTrailers, r.RequestTrailers, true
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		m.phase, m.headers, m.eos = phaseResponseHeaders, r.ResponseHeaders, r.ResponseHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseBody:
		m.phase, m.body, m.eos = phaseResponseBody, r.ResponseBody, r.ResponseBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		m.phase, m.trailers, m.eos = phaseResponseTrailers, r.ResponseTrailers, true
	default:
		m.known, m.other = false, req.GetRequest()
		m.windowUpdate = req.GetRequest() == nil && req.GetClientWindowUpdate() != nil
	}
	return m
}

// handle answers one message. An error is a protocol violation
// (protocolError). A nil reply means none is due yet (see rpcState).
func (p *processor) handle(ctx context.Context, m *message) (*extprocv3.ProcessingResponse, error) {
	if m.windowUpdate {
		return nil, nil // grpc-go's flow control acknowledging what it was sent back
	}
	if !m.known {
		return nil, protocolError{fmt.Errorf("unsupported ext_proc message %T", m.other)}
	}
	if err := p.seq.next(m.phase, m.eos, p.requestBodyStreams()); err != nil {
		return nil, protocolError{err}
	}
	if pc := m.facts.protocol; pc != nil {
		p.requestBodyMode, p.responseBodyMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		p.modesKnown = true
	}
	p.phase, p.msgBody = m.phase, m.body
	switch m.phase {
	case phaseRequestHeaders:
		if p.stage != stageRequestHeaders {
			return nil, protocolError{errors.New("request_headers received twice")}
		}
		return p.onRequestHeaders(ctx, m.headers, &m.facts), nil
	case phaseRequestBody:
		switch p.stage {
		case stageRequestHeaders:
			return nil, protocolError{errors.New("request_body before request_headers")}
		case stageRequestBody:
			return p.onRequestBody(ctx, m.body), nil
		}
		return p.cont(), nil
	case phaseRequestTrailers:
		switch p.stage {
		case stageRequestHeaders:
			return nil, protocolError{errors.New("request_trailers before request_headers")}
		case stageRequestBody:
			// The body is complete when trailers arrive.
			return p.decide(ctx), nil
		}
		return continueFor(p.phase), nil
	case phaseResponseHeaders:
		switch p.stage {
		case stageUpstream:
			return p.withAddedHeaders(p.onResponseHeaders(ctx, m.headers, &m.facts)), nil
		case stageRequestBody, stageRequestHeaders:
			// The upstream answered before the request body was complete
			// (possible only in STREAMED mode), or Envoy skipped the
			// request path (mode SKIP): nothing was reserved, so there is
			// nothing to record.
			p.stage = stagePassThrough
		}
		return p.withAddedHeaders(p.passedResponseHeaders()), nil
	case phaseResponseBody:
		if p.stage == stageResponseBody {
			return p.onResponseBody(ctx, m.body), nil
		}
		return p.cont(), nil
	}
	// phaseResponseTrailers: a gRPC call's status is here.
	if p.stage == stageResponseBody {
		p.settleResponse(ctx, headerList(m.trailers.GetTrailers()))
	}
	return p.cont(), nil
}

// requestBodyStreams reports a request body mode in which the response may
// come before the request ends: STREAMED, FULL_DUPLEX_STREAMED, GRPC; or no
// mode known at all (an Envoy before 1.30 sends no protocol_config) for a
// request the server did not assume BUFFERED for.
func (p *processor) requestBodyStreams() bool {
	switch p.requestBodyMode {
	case procmodev3.ProcessingMode_STREAMED, procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED, procmodev3.ProcessingMode_GRPC:
		return true
	case procmodev3.ProcessingMode_NONE:
		return !p.modesKnown
	}
	return false
}

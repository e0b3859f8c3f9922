package extproc

import (
	"context"
	"errors"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// The request side: what Envoy's request messages say, handed to the
// attempt at its two decision points (the headers: attempt.AtHeaders; the
// whole request: attempt.Request), each verdict rendered as the message's
// reply (render.go).

// onRequest answers a message of the request's direction. An error is a
// protocol violation (protocolError).
func (p *processor) onRequest(ctx context.Context, m *message) (*extprocv3.ProcessingResponse, error) {
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
	}
	// phaseRequestTrailers
	switch p.stage {
	case stageRequestHeaders:
		return nil, protocolError{errors.New("request_trailers before request_headers")}
	case stageRequestBody:
		// The body is complete when trailers arrive.
		return p.decide(ctx), nil
	}
	return continueFor(p.phase), nil
}

func (p *processor) onRequestHeaders(ctx context.Context, hh *extprocv3.HttpHeaders, f *envoyFacts) *extprocv3.ProcessingResponse {
	hs := hh.GetHeaders()
	t := requestTarget(hs, f.attrs, p.requestBodyMode)
	p.att.RequestID, p.reqLength = t.requestID, t.length
	p.att.Routing = routingOf(t, p.requestBodyMode)
	p.rpc.proxyless, p.rpc.call = t.proxyless, t.call
	if fc := f.flow; fc != nil && fc.GetInitialWindowDownstreamToSidestream() > 0 {
		p.rpc.flow, p.rpc.reqWindow = true, fc.GetInitialWindowDownstreamToSidestream()
	}
	f.p, f.headers, f.target = p, hs, t
	v := p.att.AtHeaders(ctx, p.policies, f, p.srv.cfg.Now())
	if !hasAttr(f.attrs, envoyorigin.AttrRouteName) {
		p.srv.routeNameMissing(ctx, &p.att, p.policies)
	}
	if v.AtBody {
		p.body = &bodyDecision{jsonrpc: v.JSONRPC}
	}
	if hh.GetEndOfStream() && v.Kind == attempt.ReadBody {
		return p.decide(ctx) // no body: a JSON criterion cannot hold
	}
	return p.render(ctx, v)
}

// wantedResponseBodyMode is the response body mode to restate in an
// override: the one in force, or BUFFERED for none.
func wantedResponseBodyMode(m procmodev3.ProcessingMode_BodySendMode) procmodev3.ProcessingMode_BodySendMode {
	if m == procmodev3.ProcessingMode_NONE {
		return procmodev3.ProcessingMode_BUFFERED
	}
	return m
}

// onRequestBody reads one body message of a protected request; the last
// one decides. In an echo mode the last one is the one with end_of_stream,
// or the half-close that grpc-go sends as end_of_stream_without_message;
// the others are withheld (holdRequestEcho).
func (p *processor) onRequestBody(ctx context.Context, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if prob := p.takeRequestBody(body); prob != nil {
		return p.refuseUnread(ctx, prob, body.GetBody())
	}
	switch {
	case body.GetEndOfStream():
	case echoes(p.requestBodyMode):
		return p.holdRequestEcho(body)
	case p.requestBodyMode == procmodev3.ProcessingMode_BUFFERED:
		// end_of_stream is false in BUFFERED mode only because trailers
		// follow: the body itself is whole.
	case p.requestBodyMode == procmodev3.ProcessingMode_BUFFERED_PARTIAL:
		return p.refuseUnread(ctx, problem.New(problem.BodyIncomplete,
			"the request body exceeds the proxy's buffer and cannot be fingerprinted"), nil)
	default:
		// STREAMED: more chunks follow.
		return continueFor(p.phase)
	}
	return p.decide(ctx)
}

// decide renders the attempt's verdict on the complete request
// (attempt.Request): CONTINUE for the first attempt, or an immediate
// response for any other. For a request deferred to its body, the verdict
// also says whether its answers are JSON-RPC, to which id, and what its
// answer teaches of the tools.
func (p *processor) decide(ctx context.Context) *extprocv3.ProcessingResponse {
	body := p.reqBody
	p.reqBody = nil
	v := p.att.Request(ctx, attempt.Body{Bytes: body}, p.srv.cfg.Now())
	if d := p.body; d != nil {
		d.jsonrpc, d.id, d.tools = v.JSONRPC, v.ID, learnsFrom(v)
	}
	resp := p.render(ctx, v)
	p.releaseRequestBody()
	return resp
}

// releaseRequestBody gives the request body's bytes back to the budget
// once nothing keeps them. Echoes withheld through a wait still do: they
// are the body, kept until the wait's verdict sends or drops them.
func (p *processor) releaseRequestBody() {
	if p.then == nil || !p.rpc.withholds() {
		p.srv.budget.release(&p.held)
	}
}

// bodyDecision is what the protocol side keeps of a request deferred to
// its body (attempt.Verdict.AtBody): whether its answers are JSON-RPC, to which
// id, and what its answer teaches of the tools.
type bodyDecision struct {
	// jsonrpc: answers in the upstream's place are JSON-RPC responses to
	// id: the one the matching policy read, or for a body refused before
	// that, the one its bytes at hand carry (jsonrpc.ScanID). nil, answered
	// as null (JSON-RPC 2.0 §5), when none could be read
	// (jsonrpcProblem).
	jsonrpc bool
	id      []byte
	// tools is set for a tools/list passed where a policy learns the
	// tools' annotations from its answer (tools.go); nil otherwise.
	tools *toolsLearning
}

// learning is the tools' annotations the request's answer is read for;
// nil for none, or for a request not deferred to its body (d nil).
func (d *bodyDecision) learning() *toolsLearning {
	if d == nil {
		return nil
	}
	return d.tools
}

// answersJSONRPC reports whether the request's answers are JSON-RPC; d is
// nil for a request not deferred to its body.
func (d *bodyDecision) answersJSONRPC() bool { return d != nil && d.jsonrpc }

// takeRequestBody keeps a request body chunk for the fingerprint, or
// returns the problem to refuse the request with: 413 past the policy's
// max_request_body, or what the server's body budget says
// (bodyBudget.holdRequestBody).
// In GRPC mode each message is framed as gRPC does on the wire, so that
// message boundaries are part of the fingerprint; the half-close grpc-go
// sends as end_of_stream_without_message adds nothing. The budget is
// charged what keeping it costs (bodybuf.go).
func (p *processor) takeRequestBody(body *extprocv3.HttpBody) *problem.Problem {
	msg := body.GetBody()
	if len(p.reqBody)+len(msg) > p.att.Policy.MaxRequestBody {
		return attempt.BodyTooLarge(p.att.Policy.MaxRequestBody)
	}
	framed := p.requestBodyMode == procmodev3.ProcessingMode_GRPC
	if framed && body.GetEndOfStream() && body.GetEndOfStreamWithoutMessage() {
		return nil
	}
	n := len(msg)
	if framed {
		n += frameHeaderLen
	}
	capacity := chunkCapacity(p.reqBody, n, framed, p.reqLength, p.att.Policy.MaxRequestBody)
	if prob := p.srv.budget.holdRequestBody(&p.held, len(p.reqBody)+n, capacity-cap(p.reqBody), p.att.Policy.RetryAfter); prob != nil {
		return prob
	}
	p.reqBody = keepChunk(p.reqBody, msg, framed, body.GetGrpcMessageCompressed(), capacity)
	return nil
}

// routeNameMissing reports, for each policy of set that matches on route
// names, a request that came without xds.route_name: such a policy can
// never match.
func (s *Server) routeNameMissing(ctx context.Context, a *attempt.Attempt, set *policy.Set) {
	for _, pol := range set.Policies {
		if len(pol.Match.RouteNames) > 0 {
			s.missingAttribute(ctx, a, pol.Name, envoyorigin.AttrRouteName, "the policy matches on route names and protects nothing")
		}
	}
}

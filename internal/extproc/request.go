package extproc

import (
	"context"
	"errors"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// The request side: what Envoy's request messages say, handed to the
// attempt at each of its decision points (match, key, scope, body,
// reservation), each verdict rendered as the message's reply (render.go).

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
	p.method, p.path, p.att.RequestID, p.reqLength = t.method, t.path, t.requestID, t.length
	p.att.Routing = routingOf(t, p.requestBodyMode)
	p.rpc.proxyless, p.rpc.call = t.proxyless, t.call
	if fc := f.flow; fc != nil && fc.GetInitialWindowDownstreamToSidestream() > 0 {
		p.rpc.flow, p.rpc.reqWindow = true, fc.GetInitialWindowDownstreamToSidestream()
	}
	preq := policy.Request{
		Method:    t.method,
		Authority: t.authority,
		Path:      t.path,
		RouteName: attrString(f.attrs, envoyorigin.AttrRouteName),
	}
	v := p.att.Match(p.policies, preq)
	if !hasAttr(f.attrs, envoyorigin.AttrRouteName) {
		p.srv.routeNameMissing(ctx, &p.att, p.policies)
	}
	if v.Kind != attempt.Continue {
		return p.render(ctx, v)
	}
	if p.att.Policy.NeedsBody() {
		return p.deferToBody(ctx, v, hh, preq, f)
	}
	rawKey, present := findHeader(hs, p.att.Policy.KeyHeader)
	lines := 0
	if present {
		lines = countHeader(hs, p.att.Policy.KeyHeader)
	}
	key, v := p.att.Key(ctx, rawKey, lines, p.srv.cfg.Now())
	if v.Kind != attempt.Continue {
		return p.render(ctx, v)
	}
	scope := p.srv.scopeOf(ctx, &p.att, p.att.Policy, t.authority, hs, f)
	if v = p.att.Named(ctx, scope, key); v.Kind != attempt.Continue {
		return p.render(ctx, v)
	}
	p.reqHeaders = selectHeaders(hs, p.att.Policy.FingerprintHeaders)
	if hh.GetEndOfStream() {
		return p.decide(ctx)
	}
	return p.render(ctx, v) // Continue, undecided: the body is awaited
}

// wantedResponseBodyMode is the response body mode to restate in an
// override: the one in force, or BUFFERED for none.
func wantedResponseBodyMode(m procmodev3.ProcessingMode_BodySendMode) procmodev3.ProcessingMode_BodySendMode {
	if m == procmodev3.ProcessingMode_NONE {
		return procmodev3.ProcessingMode_BUFFERED
	}
	return m
}

func (p *processor) onRequestBody(ctx context.Context, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if echoes(p.requestBodyMode) {
		return p.onStreamedRequestBody(ctx, body)
	}
	if prob := p.takeRequestBody(body); prob != nil {
		return p.refuseUnread(ctx, prob, body.GetBody())
	}
	switch {
	case body.GetEndOfStream():
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

// refuseUnread refuses a request whose body is refused before it was read
// whole: over a limit or the server's budget (chunk is the message that
// did not fit), or cut at Envoy's buffer. A JSON-RPC answer made before
// the body decided the policy still goes to the request's id when the
// bytes at hand carry it (jsonrpc.ScanID).
func (p *processor) refuseUnread(ctx context.Context, prob *problem.Problem, chunk []byte) *extprocv3.ProcessingResponse {
	if d := p.body; d != nil && d.jsonrpc && d.id == nil {
		d.id = jsonrpc.ScanID(p.reqBody, chunk)
	}
	return p.render(ctx, p.att.Refuse(ctx, prob))
}

// decide fingerprints the complete request and renders the attempt's
// verdict on it (attempt.Request): CONTINUE for the first attempt, or an
// immediate response for any other. A request deferred to its body first
// gets its policy (attempt.AtBody).
func (p *processor) decide(ctx context.Context) *extprocv3.ProcessingResponse {
	if d := p.body; d != nil && !d.resolved {
		d.resolved = true
		bv := p.att.AtBody(ctx, d.cands, p.reqBody, p.srv.cfg.Now())
		d.jsonrpc, d.id = bv.JSONRPC, bv.ID
		if bv.Kind == attempt.Pass {
			d.tools = learnsFrom(d, p.reqBody)
		}
		if bv.Kind != attempt.Continue {
			if bv.Unreadable && d.jsonrpc && d.id == nil {
				d.id = jsonrpc.ScanID(p.reqBody, nil) // as refuseUnread
			}
			p.reqBody, p.reqHeaders = nil, nil
			p.srv.budget.release(&p.held)
			return p.render(ctx, bv.Verdict)
		}
		p.reqHeaders = bv.Chosen.FPHeaders
	}
	fp := fingerprint.Compute(fingerprint.Request{
		Method:      p.method,
		Path:        p.path,
		Headers:     p.reqHeaders,
		Body:        p.reqBody,
		JSON:        p.att.Policy.FingerprintJSON,
		JSONOptions: p.att.Policy.FingerprintOptions(),
	}, p.att.Policy.FingerprintHeaders)
	p.reqBody, p.reqHeaders = nil, nil
	resp := p.render(ctx, p.att.Request(ctx, fp))
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

// bodyDecision is what a request deferred to its body carries from its
// headers (the policy that matched at the headers has body criteria, or
// reads its key from the body): each policy it may end with, with what
// that policy reads of the headers (attempt.Candidate), and, once decided,
// whether its answers are JSON-RPC and to which id.
type bodyDecision struct {
	cands    []attempt.Candidate
	resolved bool
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

// answersJSONRPC reports whether the request's answers are JSON-RPC; d is
// nil for a request not deferred to its body.
func (d *bodyDecision) answersJSONRPC() bool { return d != nil && d.jsonrpc }

// deferToBody reads, for every policy the request may end with, the key
// header, the scope and the fingerprint headers, and renders matched, the
// match's Continue: the body is awaited.
// Until the body says otherwise, the first policy's limits (its
// max_request_body) and answers hold.
func (p *processor) deferToBody(ctx context.Context, matched attempt.Verdict, hh *extprocv3.HttpHeaders, r policy.Request, f *envoyFacts) *extprocv3.ProcessingResponse {
	hs := hh.GetHeaders()
	first := p.att.Policy
	pols := p.policies.BodyCandidates(r, first)
	var mcp policy.MCPHeaders
	if first.Answers == policy.AnswersJSONRPC {
		mcp = mcpHeaders(hs)
		if v, ok := p.att.RuledOutByHeaders(ctx, pols, mcp); ok {
			return p.render(ctx, v)
		}
		mcp.Params = mcpParams(hs, pols)
	}
	d := &bodyDecision{cands: make([]attempt.Candidate, 0, len(pols)), jsonrpc: first.Answers == policy.AnswersJSONRPC}
	for _, pol := range pols {
		c := attempt.Candidate{Policy: pol, Scope: p.srv.scopeOf(ctx, &p.att, pol, r.Authority, hs, f),
			FPHeaders: selectHeaders(hs, pol.FingerprintHeaders), MCP: mcp}
		if pol.LearnsTools() {
			c.Upstream = policy.ToolsUpstream(r.Authority, r.Path)
		}
		if pol.KeyFrom(policy.KeyFromHeader) {
			if raw, ok := findHeader(hs, pol.KeyHeader); ok {
				c.RawKey, c.KeyLines = raw, countHeader(hs, pol.KeyHeader)
			}
		}
		d.cands = append(d.cands, c)
	}
	p.body = d
	if hh.GetEndOfStream() {
		return p.decide(ctx) // no body: a JSON criterion cannot hold
	}
	return p.render(ctx, matched)
}

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

// scopeOf reads the owner of the request's key space where pol says
// (attempt.admit judges it); "" when the request carries none.
func (s *Server) scopeOf(ctx context.Context, a *attempt.Attempt, pol *policy.Policy, authority string, hs *corev3.HeaderMap, f *envoyFacts) string {
	switch sc := pol.Scope; sc.Source {
	case policy.ScopeAuthority:
		return authority
	case policy.ScopeHeader:
		scope, _ := findHeader(hs, sc.Header)
		return scope
	case policy.ScopeMetadata:
		return metadataString(f.metadata, sc.Namespace, sc.Path)
	case policy.ScopePrincipal:
		name := PrincipalAttribute(sc.PeerIdentity)
		if !hasAttr(f.attrs, name) {
			s.missingAttribute(ctx, a, pol.Name, name, "every request of the policy is refused 401 principal-missing")
		}
		return attrString(f.attrs, name)
	}
	return "" // ScopeNone
}

package extproc

import (
	"context"
	"log/slog"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Requests whose policy is decided at the body: the policy that
// matched at the headers has body criteria (match.json, answers: jsonrpc)
// or reads its key from the body. The rules are the policy's and the
// attempt's (policy.MatchBody, attempt.AdmitKeyFrom); this file only keeps
// what the headers said until the body is read.

// bodyDecision is what a request deferred to its body carries from its
// headers: each policy it may end with (policy.Set.BodyCandidates) with
// what that policy reads of the headers, and, once decided, whether its
// answers are JSON-RPC and to which id.
type bodyDecision struct {
	cands    []bodyCandidate
	resolved bool
	// jsonrpc: answers in the upstream's place are JSON-RPC responses to
	// id: the one the matching policy read, or for a body refused before
	// that, the one its bytes at hand carry (jsonrpc.ScanID). nil, answered
	// as null (JSON-RPC 2.0 §5), when none could be read
	// (jsonrpcProblem).
	jsonrpc bool
	id      []byte
}

// bodyCandidate is one policy a deferred request may end with, and what
// it reads of the request's headers, taken while they are at hand.
type bodyCandidate struct {
	pol       *policy.Policy
	rawKey    string
	keyLines  int
	scope     string
	fpHeaders []idem.Header
}

// deferToBody reads, for every policy the request may end with, the key
// header, the scope and the fingerprint headers, and waits for the body.
func (p *processor) deferToBody(ctx context.Context, req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders,
	r policy.Request, attrs *structpb.Struct) *extprocv3.ProcessingResponse {
	hs := hh.GetHeaders()
	first := p.att.Policy
	pols := p.policies.BodyCandidates(r, first)
	d := &bodyDecision{cands: make([]bodyCandidate, 0, len(pols)), jsonrpc: first.Answers == policy.AnswersJSONRPC}
	for _, pol := range pols {
		p.att.Policy = pol // scopeOf reads the policy's scope
		c := bodyCandidate{pol: pol, scope: p.scopeOf(ctx, r.Authority, hs, req, attrs), fpHeaders: selectHeaders(hs, pol.FingerprintHeaders)}
		if pol.KeyFrom(policy.KeyFromHeader) {
			if raw, ok := findHeader(hs, pol.KeyHeader); ok {
				c.rawKey, c.keyLines = raw, countHeader(hs, pol.KeyHeader)
			}
		}
		d.cands = append(d.cands, c)
	}
	// Until the body says otherwise, the first policy's limits (its
	// max_request_body) and answers hold.
	p.att.Policy = first
	p.body = d
	if hh.GetEndOfStream() {
		return p.decide(ctx, req) // no body: a JSON criterion cannot hold
	}
	return p.awaitBody(ctx, req)
}

// resolveAtBody picks the policy of a deferred request once its body is
// whole: the first candidate whose body criteria hold, then admits its
// key. A nil reply means the request is admitted (keyed, scoped, its
// fingerprint headers in place) and decide goes on; otherwise it is the
// reply: a pass (no policy takes the body, or no key where none is
// required) or a refusal. A request no candidate takes costs no store
// call.
func (p *processor) resolveAtBody(ctx context.Context, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	d := p.body
	d.resolved = true
	first := p.att.Policy
	miss := policy.BodyMatched
	var shadow *bodyCandidate
	var shadowWhy error
	for i, c := range d.cands {
		p.att.Policy = c.pol
		id, m, why := c.pol.MatchBodyWhy(p.reqBody)
		if m == policy.BodyUnreadable {
			// Whether this policy applies cannot be told, and a reader
			// upstream may take the body for a call it protects: refused
			// unless the policy would pass it whatever it said. A shadow
			// policy protects nothing, so it does not end the search: a
			// later enforced one may still refuse; its would-reject is
			// counted below if none does.
			if c.pol.Enforcement == policy.EnforcementShadow {
				if shadow == nil {
					shadow, shadowWhy = &d.cands[i], why
				}
				miss = m
				continue
			}
			if resp := p.refuseUnreadable(ctx, req, c, why); resp != nil {
				return resp
			}
		}
		if m != policy.BodyMatched {
			miss = m
			continue
		}
		d.jsonrpc, d.id = c.pol.Answers == policy.AnswersJSONRPC, id
		adm, key, prob := p.att.AdmitKeyFrom(attempt.KeyInput{HeaderRaw: c.rawKey, HeaderLines: c.keyLines, Body: p.reqBody},
			p.srv.cfg.Now())
		switch adm {
		case attempt.Bypass:
			p.dropRequestBody()
			return p.passThrough(req)
		case attempt.Grace:
			p.dropRequestBody()
			return p.graceWithoutKey(ctx, req)
		case attempt.Refuse:
			p.dropRequestBody()
			return p.refuse(ctx, req, prob)
		}
		if prob := p.att.Admit(c.scope, key); prob != nil {
			p.dropRequestBody()
			return p.refuse(ctx, req, prob)
		}
		// The body was read under the limit of the policy that deferred
		// it; the policy that takes it holds it to its own, in the order
		// the headers path keeps: a request it would pass or refuse for
		// its key never gets this far there either.
		if limit := c.pol.MaxRequestBody; len(p.reqBody) > limit {
			p.dropRequestBody()
			return p.refuse(ctx, req, bodyTooLarge(limit))
		}
		p.reqHeaders = c.fpHeaders
		return nil
	}
	if shadow != nil {
		p.att.Policy = shadow.pol
		if resp := p.refuseUnreadable(ctx, req, *shadow, shadowWhy); resp != nil {
			return resp
		}
	}
	// Counted as bypassed under the policy that matched at the headers, so
	// that an MCP route's reads, notifications and batches show there.
	p.att.Policy = first
	p.Decided(idem.DecisionBypassed)
	p.LogAt(ctx, slog.LevelDebug, "no policy's body criteria hold; passes unprotected", slog.String("body", miss.String()))
	p.att.Policy, d.jsonrpc = nil, false
	p.dropRequestBody()
	return p.passThrough(req)
}

// refuseUnreadable answers a body candidate c cannot read
// (attempt.AdmitUnreadable): the refusal, in c's answers (a JSON-RPC one
// to the id the body's first bytes carry, jsonrpc.ScanID; counted and
// passed on a shadow policy), or nil when c would pass the request
// whatever its body said, and the next candidate is tried.
func (p *processor) refuseUnreadable(ctx context.Context, req *extprocv3.ProcessingRequest, c bodyCandidate, why error) *extprocv3.ProcessingResponse {
	adm, prob := p.att.AdmitUnreadable(why, c.keyLines, p.srv.cfg.Now())
	if adm != attempt.Refuse {
		return nil
	}
	p.body.jsonrpc = c.pol.Answers == policy.AnswersJSONRPC
	resp := p.refuseUnread(ctx, req, prob, nil)
	p.dropRequestBody()
	return resp
}

// dropRequestBody lets go of a request body that will not be
// fingerprinted.
func (p *processor) dropRequestBody() {
	p.reqBody, p.reqHeaders = nil, nil
	p.releaseHeld()
}

// passedResponseHeaders answers the response headers of a request that
// holds no record. A request passed at its body could not skip the
// response phases then (Envoy honours mode_override only in a reply to a
// headers message: ext_proc.cc, onReceiveMessage, inHeaderProcessState),
// so it skips the response body here: an unprotected MCP answer streamed
// as text/event-stream (a long tool call's progress) is not held whole in
// Envoy's buffer for a body phase that has nothing to do.
func (p *processor) passedResponseHeaders(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if p.body != nil && !p.att.Held() && !p.rpc.call {
		return continueWith(req, skipResponseBody)
	}
	return continueFor(req)
}

// answersJSONRPC reports whether this request's answers are JSON-RPC.
func (p *processor) answersJSONRPC() bool { return p.body != nil && p.body.jsonrpc }

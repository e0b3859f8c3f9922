package extproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
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

// processor holds everything about one HTTP request.
type processor struct {
	srv      *Server
	policies *policy.Set
	// send writes a message on the stream ahead of the reply being built
	// (an override_message_timeout before a long wait).
	send func(*extprocv3.ProcessingResponse) error

	// Body modes in force on Envoy's side, from protocol_config. Without
	// one (Envoy before 1.30 did not send it) the recommended BUFFERED
	// configuration is assumed and no override is asked for.
	requestBodyMode, responseBodyMode procmodev3.ProcessingMode_BodySendMode
	modesKnown                        bool
	// stage sits next to modesKnown, in what would be padding: a
	// processor is allocated per request, and this keeps it in the 480
	// byte size class with body below.
	stage stage

	// att is the attempt: policy, record, token, what it holds.
	att        attempt.Attempt
	method     string
	path       string
	reqHeaders []idem.Header
	reqBody    []byte
	// held is what this stream's buffered bodies take of the server's
	// budget (budget.go).
	held int64

	// span is the stream's span; spanCtx carries it for work done after
	// the stream's own context ended.
	span    trace.Span
	spanCtx context.Context

	respStatus   int
	respHeaders  []idem.Header
	respBody     []byte
	respTooLarge bool

	rpc rpcState
	seq sequence
	// body is set for a request whose policy is decided at its body
	// (bodypolicy.go); nil on every other request.
	body *bodyDecision

	// respAdd are headers the response headers reply adds to the response
	// the client gets: a shadow policy's decision, a key grace period's
	// warning. HTTP only.
	respAdd []*corev3.HeaderValueOption
}

func newProcessor(s *Server, set *policy.Set, send func(*extprocv3.ProcessingResponse) error) *processor {
	p := &processor{srv: s, policies: set, send: send}
	p.att = attempt.New(&s.att, p)
	return p
}

// LogAt writes one line about this request's attempt (attempt.LogAt).
func (p *processor) LogAt(ctx context.Context, level slog.Level, msg string, extra ...slog.Attr) {
	p.att.LogAt(ctx, level, msg, extra...)
}

// handle answers one message. An error is a protocol violation; the stream
// then ends with a gRPC error, which Envoy turns into its status_on_error
// (fail closed). A nil reply means none is due yet (see rpcState).
func (p *processor) handle(ctx context.Context, req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	if req.GetRequest() == nil && req.GetClientWindowUpdate() != nil {
		return nil, nil // grpc-go's flow control acknowledging what it was sent back
	}
	if err := p.seq.next(req, p.requestBodyStreams()); err != nil {
		return nil, err
	}
	if pc := req.GetProtocolConfig(); pc != nil {
		p.requestBodyMode, p.responseBodyMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		p.modesKnown = true
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if p.stage != stageRequestHeaders {
			return nil, errors.New("request_headers received twice")
		}
		return p.onRequestHeaders(ctx, req, r.RequestHeaders), nil
	case *extprocv3.ProcessingRequest_RequestBody:
		switch p.stage {
		case stageRequestHeaders:
			return nil, errors.New("request_body before request_headers")
		case stageRequestBody:
			return p.onRequestBody(ctx, req, r.RequestBody), nil
		}
		return p.cont(req), nil
	case *extprocv3.ProcessingRequest_RequestTrailers:
		switch p.stage {
		case stageRequestHeaders:
			return nil, errors.New("request_trailers before request_headers")
		case stageRequestBody:
			// The body is complete when trailers arrive.
			return p.decide(ctx, req), nil
		}
		return continueFor(req), nil
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		switch p.stage {
		case stageUpstream:
			return p.withAddedHeaders(p.onResponseHeaders(ctx, req, r.ResponseHeaders)), nil
		case stageRequestBody:
			// The upstream answered before the request body was complete
			// (possible only in STREAMED mode): nothing was reserved, so
			// there is nothing to record.
			p.stage = stagePassThrough
		case stageRequestHeaders:
			// Envoy skipped the request path (mode SKIP): nothing reserved.
			p.stage = stagePassThrough
		}
		return p.withAddedHeaders(p.passedResponseHeaders(req)), nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		if p.stage == stageResponseBody {
			return p.onResponseBody(ctx, req, r.ResponseBody), nil
		}
		return p.cont(req), nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return p.onResponseTrailers(ctx, req, r.ResponseTrailers), nil
	}
	return nil, fmt.Errorf("unsupported ext_proc message %T", req.GetRequest())
}

func (p *processor) onRequestHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	hs := hh.GetHeaders()
	attrs := attributes(req)
	method, authority := p.requestTarget(req, hs, attrs)
	p.method = method

	preq := policy.Request{
		Method:    method,
		Authority: authority,
		Path:      p.path,
		RouteName: attrString(attrs, envoyorigin.AttrRouteName),
	}
	matched := p.att.Match(p.policies, preq)
	if !hasAttr(attrs, envoyorigin.AttrRouteName) {
		p.routeNameMissing(ctx)
	}
	if !matched {
		p.Decided(idem.DecisionBypassed)
		return p.passThrough(req)
	}
	if p.att.Policy.NeedsBody() {
		return p.deferToBody(ctx, req, hh, preq, attrs) // bodypolicy.go
	}
	rawKey, present := findHeader(hs, p.att.Policy.KeyHeader)
	lines := 0
	if present {
		lines = countHeader(hs, p.att.Policy.KeyHeader)
	}
	adm, key, prob := p.att.AdmitKey(rawKey, lines, p.srv.cfg.Now())
	switch adm {
	case attempt.Bypass:
		return p.passThrough(req)
	case attempt.Grace:
		return p.graceWithoutKey(ctx, req)
	case attempt.Refuse:
		return p.refuse(ctx, req, prob)
	}
	if prob := p.att.Admit(p.scopeOf(ctx, authority, hs, req, attrs), key); prob != nil {
		return p.refuse(ctx, req, prob)
	}
	p.reqHeaders = selectHeaders(hs, p.att.Policy.FingerprintHeaders)
	if hh.GetEndOfStream() {
		return p.decide(ctx, req)
	}
	return p.awaitBody(ctx, req)
}

// awaitBody asks for a protected request's body, whole, before anything
// of the request goes upstream.
func (p *processor) awaitBody(ctx context.Context, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if p.budgetFull() && !p.answersJSONRPC() {
		// A JSON-RPC answer here could not carry the request's id, which
		// only its body holds: such a request is refused at its body,
		// where the budget refuses it still if it stays full.
		return p.refuse(ctx, req, p.capacityProblem())
	}
	p.stage = stageRequestBody
	if resp, ok := p.awaitRequestBody(ctx, req); ok {
		return resp
	}
	if !p.modesKnown {
		p.requestBodyMode, p.responseBodyMode = procmodev3.ProcessingMode_BUFFERED, procmodev3.ProcessingMode_BUFFERED
		return continueFor(req)
	}
	switch p.requestBodyMode {
	case procmodev3.ProcessingMode_NONE, procmodev3.ProcessingMode_STREAMED:
		// The fingerprint needs the whole body, and the upstream must see
		// no part of the request before the reservation: in STREAMED mode
		// Envoy would forward the headers and every answered chunk at once
		// (processor_state.cc handleHeaderContinue). Ask for BUFFERED,
		// which holds the headers until the body's reply. Body modes are
		// always copied from an override, so the response's is restated.
		// If Envoy does not honour overrides, the chunks are read as they
		// come (onRequestBody).
		return continueWith(req, &procmodev3.ProcessingMode{
			RequestBodyMode:  procmodev3.ProcessingMode_BUFFERED,
			ResponseBodyMode: p.wantedResponseBodyMode(),
		})
	}
	return continueFor(req)
}

func (p *processor) wantedResponseBodyMode() procmodev3.ProcessingMode_BodySendMode {
	if p.responseBodyMode == procmodev3.ProcessingMode_NONE {
		return procmodev3.ProcessingMode_BUFFERED
	}
	return p.responseBodyMode
}

// scopeOf reads the owner of the request's key space from where the policy
// says (attempt.Admit judges it); "" when the request carries none.
func (p *processor) scopeOf(ctx context.Context, authority string, hs *corev3.HeaderMap, req *extprocv3.ProcessingRequest, attrs *structpb.Struct) string {
	switch sc := p.att.Policy.Scope; sc.Source {
	case policy.ScopeAuthority:
		return authority
	case policy.ScopeHeader:
		scope, _ := findHeader(hs, sc.Header)
		return scope
	case policy.ScopeMetadata:
		return metadataString(req, sc.Namespace, sc.Path)
	case policy.ScopePrincipal:
		name := PrincipalAttribute(sc.PeerIdentity)
		if !hasAttr(attrs, name) {
			p.missingAttribute(ctx, p.att.Policy.Name, name, "every request of the policy is refused 401 principal-missing")
		}
		return attrString(attrs, name)
	}
	return "" // ScopeNone
}

// metadataString reads a string or number at path in one namespace of the
// forwarded dynamic metadata.
func metadataString(req *extprocv3.ProcessingRequest, ns string, path []string) string {
	s := req.GetMetadataContext().GetFilterMetadata()[ns]
	for i, name := range path {
		v := s.GetFields()[name]
		if i == len(path)-1 {
			return valueString(v)
		}
		s = v.GetStructValue()
	}
	return ""
}

func (p *processor) onRequestBody(ctx context.Context, req *extprocv3.ProcessingRequest, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if echoes(p.requestBodyMode) {
		return p.onStreamedRequestBody(ctx, req, body)
	}
	if prob := p.takeRequestBody(body); prob != nil {
		return p.refuseUnread(ctx, req, prob, body.GetBody())
	}
	switch {
	case body.GetEndOfStream():
	case p.requestBodyMode == procmodev3.ProcessingMode_BUFFERED:
		// end_of_stream is false in BUFFERED mode only because trailers
		// follow: the body itself is whole.
	case p.requestBodyMode == procmodev3.ProcessingMode_BUFFERED_PARTIAL:
		return p.refuseUnread(ctx, req, problem.New(problem.BodyIncomplete,
			"the request body exceeds the proxy's buffer and cannot be fingerprinted"), nil)
	default:
		// STREAMED: more chunks follow.
		return continueFor(req)
	}
	return p.decide(ctx, req)
}

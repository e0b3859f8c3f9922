package extproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
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
	stage    stage

	// Body modes in force on Envoy's side, from protocol_config. Without
	// one (Envoy before 1.30 did not send it) the recommended BUFFERED
	// configuration is assumed and no override is asked for.
	requestBodyMode, responseBodyMode procmodev3.ProcessingMode_BodySendMode
	modesKnown                        bool

	pol        *policy.Policy
	method     string
	path       string
	scope      string
	requestID  string
	reqHeaders []idem.Header
	reqBody    []byte

	id       idem.RecordID
	tok      idem.Token
	reserved bool // this attempt holds the record and has not settled it
	attempt  int
	renew    *renewer

	respStatus   int
	respHeaders  []idem.Header
	respBody     []byte
	respTooLarge bool

	// retry is a final transition the store refused; the stream's end
	// tries it once more.
	retry   func(context.Context) error
	retryOp string
}

func newProcessor(s *Server, set *policy.Set) *processor {
	return &processor{srv: s, policies: set}
}

func (p *processor) log() *slog.Logger { return p.srv.log }

// logAttrs are the fields that trace one attempt: the hashed key (record
// id, never the raw key), scope, policy, request id and attempt number.
func (p *processor) logAttrs(extra ...slog.Attr) []slog.Attr {
	attrs := make([]slog.Attr, 0, 6+len(extra))
	if p.pol != nil {
		attrs = append(attrs, slog.String("policy", p.pol.Name))
	}
	if p.id != "" {
		attrs = append(attrs, slog.String("key_hash", string(p.id)), slog.String("scope", p.scope))
	}
	if p.requestID != "" {
		attrs = append(attrs, slog.String("request_id", p.requestID))
	}
	if p.attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", p.attempt))
	}
	return append(attrs, extra...)
}

func (p *processor) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.srv.cfg.StoreTimeout)
}

// handle answers one message. An error is a protocol violation; the stream
// then ends with a gRPC error, which Envoy turns into its status_on_error
// (fail closed).
func (p *processor) handle(ctx context.Context, req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
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
		return continueFor(req), nil
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
			return p.onResponseHeaders(ctx, req, r.ResponseHeaders), nil
		case stageRequestBody:
			// The upstream answered before the request body was complete
			// (possible only in STREAMED mode): nothing was reserved, so
			// there is nothing to record.
			p.stage = stagePassThrough
		case stageRequestHeaders:
			// Envoy skipped the request path (mode SKIP): nothing reserved.
			p.stage = stagePassThrough
		}
		return continueFor(req), nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		if p.stage == stageResponseBody {
			return p.onResponseBody(ctx, req, r.ResponseBody), nil
		}
		return continueFor(req), nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		if p.stage == stageResponseBody {
			p.complete(ctx)
		}
		return continueFor(req), nil
	}
	return nil, fmt.Errorf("unsupported ext_proc message %T", req.GetRequest())
}

func (p *processor) onRequestHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	hs := headerList(hh.GetHeaders())
	method, _ := firstHeader(hs, ":method")
	p.path, _ = firstHeader(hs, ":path")
	authority, _ := firstHeader(hs, ":authority")
	p.requestID, _ = firstHeader(hs, "x-request-id")
	p.method = method
	attrs := attributes(req)

	p.pol = p.policies.Match(policy.Request{
		Method:    method,
		Authority: authority,
		Path:      p.path,
		RouteName: attrString(attrs, "xds.route_name"),
	})
	if p.pol == nil {
		return p.passThrough(req)
	}
	rawKey, present := firstHeader(hs, p.pol.KeyHeader)
	if !present {
		if p.pol.KeyRequired {
			return p.reject(ctx, problem.New(problem.KeyMissing, "this endpoint requires an Idempotency-Key header"))
		}
		return p.passThrough(req)
	}
	key, err := idem.ParseKey(rawKey, p.pol.MaxKeyLength)
	if err != nil {
		return p.reject(ctx, problem.New(problem.KeyInvalid, err.Error()))
	}
	scope, prob := p.scopeOf(authority, hs, req, attrs)
	if prob != nil {
		return p.reject(ctx, prob)
	}
	p.scope = scope
	p.id = idem.RecordIDFor(p.pol.Name, scope, key)
	p.reqHeaders = hs
	if hh.GetEndOfStream() {
		return p.decide(ctx, req)
	}
	p.stage = stageRequestBody
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

// scopeOf names the owner of the request's key space, per the policy.
func (p *processor) scopeOf(authority string, hs []idem.Header, req *extprocv3.ProcessingRequest, attrs *structpb.Struct) (string, *problem.Problem) {
	var scope string
	switch sc := p.pol.Scope; sc.Source {
	case policy.ScopeNone:
		return "", nil
	case policy.ScopeAuthority:
		return authority, nil
	case policy.ScopeHeader:
		scope, _ = firstHeader(hs, sc.Header)
	case policy.ScopeMetadata:
		scope = metadataString(req, sc.Namespace, sc.Path)
	case policy.ScopePrincipal:
		scope = attrString(attrs, "source.principal")
	}
	if scope == "" {
		return "", problem.New(problem.PrincipalMissing, "the request carries no principal to scope its Idempotency-Key")
	}
	return scope, nil
}

func metadataString(req *extprocv3.ProcessingRequest, ns string, path []string) string {
	s := req.GetMetadataContext().GetFilterMetadata()[ns]
	for i, name := range path {
		v := s.GetFields()[name]
		if i == len(path)-1 {
			return v.GetStringValue()
		}
		s = v.GetStructValue()
	}
	return ""
}

func (p *processor) onRequestBody(ctx context.Context, req *extprocv3.ProcessingRequest, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if len(p.reqBody)+len(body.GetBody()) > p.pol.MaxRequestBody {
		return p.reject(ctx, problem.New(problem.BodyTooLarge,
			"the request body exceeds "+strconv.Itoa(p.pol.MaxRequestBody)+" bytes"))
	}
	p.reqBody = append(p.reqBody, body.GetBody()...)
	switch {
	case body.GetEndOfStream():
	case p.requestBodyMode == procmodev3.ProcessingMode_BUFFERED:
		// end_of_stream is false in BUFFERED mode only because trailers
		// follow: the body itself is whole.
	case p.requestBodyMode == procmodev3.ProcessingMode_BUFFERED_PARTIAL:
		return p.reject(ctx, problem.New(problem.BodyIncomplete,
			"the request body exceeds the proxy's buffer and cannot be fingerprinted"))
	default:
		// STREAMED: more chunks follow.
		return continueFor(req)
	}
	return p.decide(ctx, req)
}

// decide fingerprints the complete request, reserves its key and answers:
// CONTINUE for the first attempt, or an immediate response for any other.
func (p *processor) decide(ctx context.Context, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	fp := fingerprint.Compute(fingerprint.Request{
		Method:  p.method,
		Path:    p.path,
		Headers: p.reqHeaders,
		Body:    p.reqBody,
	}, p.pol.FingerprintHeaders)
	p.reqBody, p.reqHeaders = nil, nil
	p.tok = idem.NewToken()

	waitReplicas, waitTimeout := p.pol.WaitReplicas()
	sctx, cancel := p.storeCtx(ctx)
	res, err := p.srv.cfg.Store.Reserve(sctx, idem.Reservation{
		ID:           p.id,
		Fingerprint:  fp,
		Token:        p.tok,
		Lease:        p.pol.Lease,
		Retention:    p.pol.Retention,
		LeaseExpiry:  p.pol.LeaseExpiry,
		WaitReplicas: waitReplicas,
		WaitTimeout:  waitTimeout,
	})
	cancel()
	if err != nil {
		if p.pol.FailureMode == policy.FailOpen {
			p.log().LogAttrs(ctx, slog.LevelWarn, "store unavailable; request passes unprotected (fail_open)",
				p.logAttrs(slog.String("error", err.Error()))...)
			return p.passThrough(req)
		}
		p.log().LogAttrs(ctx, slog.LevelError, "store unavailable; request refused (fail_closed)",
			p.logAttrs(slog.String("error", err.Error()))...)
		prob := problem.New(problem.StoreUnavailable, "the idempotency store cannot be reached; retry later")
		prob.RetryAfter = p.pol.RetryAfter
		return p.answer(problemResponse(prob))
	}
	p.attempt = res.Attempt
	p.log().LogAttrs(ctx, slog.LevelInfo, "decision", p.logAttrs(slog.String("decision", res.Outcome.String()))...)

	switch res.Outcome {
	case idem.Reserved:
		p.reserved = true
		p.stage = stageUpstream
		p.renew = startRenewer(p.srv, p.id, p.tok, p.pol.Lease)
		return continueFor(req)
	case idem.Completed:
		return p.answer(replayResponse(res.Response))
	case idem.InFlight:
		prob := problem.New(problem.InProgress, "an earlier request with this Idempotency-Key is still being processed; retry later")
		prob.RetryAfter = p.pol.RetryAfter
		return p.answer(problemResponse(prob))
	case idem.Unknown:
		return p.answer(problemResponse(problem.New(problem.OutcomeUnknown,
			"an earlier request with this Idempotency-Key ended without a known outcome; "+
				"check the resource's state before retrying with a new key")))
	default: // idem.Mismatch
		return p.answer(problemResponse(problem.New(problem.KeyReused,
			"this Idempotency-Key was already used for a request with a different method, path, headers or body")))
	}
}

// reject answers a request the server refuses before any store call.
func (p *processor) reject(ctx context.Context, prob *problem.Problem) *extprocv3.ProcessingResponse {
	p.log().LogAttrs(ctx, slog.LevelInfo, "rejected", p.logAttrs(slog.String("problem", prob.Slug))...)
	return p.answer(problemResponse(prob))
}

// answer ends the request with the server's own response. Envoy sends no
// further message for it.
func (p *processor) answer(resp *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	p.stage = stagePassThrough
	return resp
}

// passThrough lets an unprotected request go on and asks Envoy to skip
// every later phase of it.
func (p *processor) passThrough(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	p.stage = stagePassThrough
	if _, ok := req.GetRequest().(*extprocv3.ProcessingRequest_RequestHeaders); ok {
		return continueWith(req, skipEverything)
	}
	return continueFor(req)
}

func (p *processor) onResponseHeaders(ctx context.Context, req *extprocv3.ProcessingRequest, hh *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	hs := headerList(hh.GetHeaders())
	statusText, _ := firstHeader(hs, ":status")
	status, err := strconv.Atoi(statusText)
	if err != nil {
		status = 0 // no rule covers 0: the outcome is unknown
	}
	details := attrString(attributes(req), "response.code_details")
	origin := idem.ClassifyOrigin(details)
	action := idem.DecideResponse(p.pol.ResponseRules, origin, status)
	p.log().LogAttrs(ctx, slog.LevelDebug, "response", p.logAttrs(
		slog.Int("status", status), slog.String("origin", origin.String()), slog.String("action", action.String()))...)

	switch action {
	case idem.ActionRelease:
		p.settle(ctx, idem.ActionRelease)
		return continueWith(req, skipResponseBody)
	case idem.ActionUnknown:
		p.settle(ctx, idem.ActionUnknown)
		return continueWith(req, skipResponseBody)
	}
	p.respStatus = status
	for _, h := range hs {
		if p.pol.StoresHeader(h.Name) {
			p.respHeaders = append(p.respHeaders, h)
		}
	}
	if hh.GetEndOfStream() {
		p.complete(ctx)
		return continueFor(req)
	}
	p.stage = stageResponseBody
	if p.responseBodyMode == procmodev3.ProcessingMode_NONE {
		return continueWith(req, bufferResponseBody)
	}
	return continueFor(req)
}

func (p *processor) onResponseBody(ctx context.Context, req *extprocv3.ProcessingRequest, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if !p.respTooLarge {
		if len(p.respBody)+len(body.GetBody()) > p.pol.MaxStoredBody {
			p.respTooLarge, p.respBody = true, nil
		} else {
			p.respBody = append(p.respBody, body.GetBody()...)
		}
	}
	// In BUFFERED mode the body is whole even when trailers follow.
	if body.GetEndOfStream() || p.responseBodyMode == procmodev3.ProcessingMode_BUFFERED {
		p.complete(ctx)
	}
	return continueFor(req)
}

// complete stores the response. It runs before the reply that lets the
// response go on, so a client that sees the response and retries at once
// finds it stored.
func (p *processor) complete(ctx context.Context) {
	if !p.reserved {
		return
	}
	resp := idem.Response{Status: p.respStatus, Headers: p.respHeaders, Body: p.respBody, BodyOmitted: p.respTooLarge}
	p.finalize(ctx, "complete", func(ctx context.Context) error {
		return p.srv.cfg.Store.Complete(ctx, p.id, p.tok, resp, p.pol.Retention)
	}, slog.Int("status", p.respStatus), slog.Bool("body_omitted", p.respTooLarge))
}

// settle releases the record or marks it unknown.
func (p *processor) settle(ctx context.Context, action idem.Action) {
	if !p.reserved {
		return
	}
	op := func(ctx context.Context) error {
		return p.srv.cfg.Store.MarkUnknown(ctx, p.id, p.tok, p.pol.Retention)
	}
	if action == idem.ActionRelease {
		op = func(ctx context.Context) error { return p.srv.cfg.Store.Release(ctx, p.id, p.tok) }
	}
	p.finalize(ctx, action.String(), op)
}

// finalize applies the attempt's last transition. It does not end with the
// stream's context: Envoy resetting the stream must not cancel the write
// that records what happened. If the store fails, the stream's end tries
// once more with a longer budget; if that fails too, the unrenewed lease
// still turns the record unknown: never a silent second execution.
func (p *processor) finalize(ctx context.Context, op string, apply func(context.Context) error, attrs ...slog.Attr) {
	p.stopRenewing()
	p.reserved = false
	p.stage = stagePassThrough
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.srv.cfg.StoreTimeout)
	err := apply(sctx)
	cancel()
	attrs = append(attrs, slog.String("op", op))
	if err != nil && !errors.Is(err, idem.ErrNotHolder) && !errors.Is(err, idem.ErrNotFound) {
		p.retry = func(ctx context.Context) error { return apply(ctx) }
		p.retryOp = op
		p.log().LogAttrs(ctx, slog.LevelWarn, "record not settled; will retry when the stream ends",
			p.logAttrs(append(attrs, slog.String("error", err.Error()))...)...)
		return
	}
	p.log().LogAttrs(ctx, slog.LevelInfo, "settled", p.logAttrs(append(attrs, errAttr(err))...)...)
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}

// finish runs when the stream ends, however it ends. A record still held
// means the response never arrived whole: with response headers in hand the
// upstream did answer, so the record completes without its body; with none
// the outcome is unknown (or released, by policy).
func (p *processor) finish() {
	ctx, cancel := context.WithTimeout(context.Background(), p.srv.cfg.FinishTimeout)
	defer cancel()
	if p.retry != nil {
		err := p.retry(ctx)
		level, msg := slog.LevelInfo, "settled on retry"
		if err != nil && !errors.Is(err, idem.ErrNotHolder) && !errors.Is(err, idem.ErrNotFound) {
			level, msg = slog.LevelError, "record not settled; it turns unknown when its lease ends"
		}
		p.log().LogAttrs(ctx, level, msg, p.logAttrs(slog.String("op", p.retryOp), errAttr(err))...)
		return
	}
	if !p.reserved {
		return
	}
	if p.stage == stageResponseBody {
		p.respTooLarge, p.respBody = true, nil
		p.complete(ctx)
		return
	}
	p.settle(ctx, p.pol.OnStreamReset)
}

func (p *processor) stopRenewing() {
	if p.renew != nil {
		p.renew.stop()
		p.renew = nil
	}
}

// renewer keeps a reservation's lease alive while its stream is open. It
// renews at half the lease, so short requests never cost a renewal.
type renewer struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

func startRenewer(s *Server, id idem.RecordID, tok idem.Token, lease time.Duration) *renewer {
	r := &renewer{}
	every := lease / 2
	var tick func()
	tick = func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
		err := s.cfg.Store.Renew(ctx, id, tok, lease)
		cancel()
		next := every
		if err != nil {
			s.log.Warn("lease renewal failed", slog.String("key_hash", string(id)), slog.String("error", err.Error()))
			if errors.Is(err, idem.ErrNotHolder) || errors.Is(err, idem.ErrNotFound) {
				return
			}
			// Try again well before the lease runs out.
			next = every / 5
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.stopped {
			r.timer.Reset(next)
		}
	}
	r.mu.Lock()
	r.timer = time.AfterFunc(every, tick)
	r.mu.Unlock()
	return r
}

func (r *renewer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	r.timer.Stop()
}

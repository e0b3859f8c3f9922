package extproc

import (
	"context"
	"log/slog"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/grpcstatus"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// The request side, and the one renderer. What Envoy's request messages
// say is handed to the attempt at its two decision points (the headers:
// attempt.AtHeaders; the whole request: attempt.Request), and each
// verdict, of the request or of the response (response.go), is rendered
// here as the reply to the message at hand, for the caller the request
// came from: an HTTP client, a gRPC call through Envoy or from grpc-go's
// filter (rpcState), a JSON-RPC client (bodyDecision). A new caller kind is
// rendered here, and nowhere else.

// onRequest answers a message of the request's direction. Its order was
// checked already (sequence): the headers come first and once.
func (p *processor) onRequest(ctx context.Context, m *message) *extprocv3.ProcessingResponse {
	switch m.phase {
	case phaseRequestHeaders:
		return p.onRequestHeaders(ctx, m.headers, &m.facts)
	case phaseRequestBody:
		if p.stage == stageRequestBody {
			return p.onRequestBody(ctx, m.body)
		}
		return p.cont()
	}
	// phaseRequestTrailers
	if p.stage == stageRequestBody {
		return p.decide(ctx) // the body is complete when trailers arrive
	}
	return continueWith(p.phase, nil)
}

func (p *processor) onRequestHeaders(ctx context.Context, hh *extprocv3.HttpHeaders, f *envoyFacts) *extprocv3.ProcessingResponse {
	hs := hh.GetHeaders()
	t := requestTarget(hs, f.attrs, p.requestBodyMode)
	p.att.RequestID, p.reqLength = t.requestID, t.length
	// grpc-go's filter routes nothing, and in the echo modes the headers'
	// reply is held back until the body (rpcState), after the route would
	// be chosen: neither can send the request to another region.
	p.att.Routing = attempt.Routing{SentTo: t.sentTo, CanSend: !t.proxyless && !echoes(p.requestBodyMode)}
	p.rpc.proxyless, p.rpc.call = t.proxyless, t.call
	p.rpc.reqWindow = max(f.flow.GetInitialWindowDownstreamToSidestream(), 0)
	f.p, f.headers, f.target = p, hs, t
	v := p.att.AtHeaders(p.policies, f, p.srv.cfg.Now())
	if !hasAttr(f.attrs, envoyorigin.AttrRouteName) {
		// A policy that matches on route names can never match.
		for _, pol := range p.policies.Policies {
			if len(pol.Match.RouteNames) > 0 {
				p.srv.missingAttribute(&p.att, pol.Name, envoyorigin.AttrRouteName, "the policy matches on route names and protects nothing")
			}
		}
	}
	if v.AtBody {
		p.body = &bodyDecision{jsonrpc: v.JSONRPC}
	}
	if hh.GetEndOfStream() && v.Kind == attempt.ReadBody {
		return p.decide(ctx) // no body: a JSON criterion cannot hold
	}
	return p.render(ctx, v)
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
		return continueWith(p.phase, nil)
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
	return p.renderDecided(ctx, v)
}

// renderDecided renders the verdict on the whole request, then gives the
// request body's bytes back to the budget once nothing keeps them.
// Echoes withheld through a wait still do: they are the body, kept until
// the wait's verdict sends or drops them.
func (p *processor) renderDecided(ctx context.Context, v attempt.Verdict) *extprocv3.ProcessingResponse {
	resp := p.render(ctx, v)
	if p.then == nil || !p.rpc.withholds() {
		p.srv.budget.release(&p.held)
	}
	return resp
}

// takeRequestBody keeps a request body chunk for the fingerprint, or
// returns the problem to refuse the request with: 413 past the policy's
// max_request_body, or past the server's whole body budget (it could
// never be taken; a retry would not help), 503 with Retry-After when the
// budget is only full for now.
// In GRPC mode each message is framed as gRPC does on the wire, so that
// message boundaries are part of the fingerprint; the half-close grpc-go
// sends as end_of_stream_without_message adds nothing. The budget is
// charged what keeping it costs (bodybuf.go).
func (p *processor) takeRequestBody(body *extprocv3.HttpBody) *problem.Problem {
	msg := body.GetBody()
	if len(p.reqBody)+len(msg) > p.att.Policy.MaxRequestBody {
		return attempt.BodyTooLarge(p.att.Policy.MaxRequestBody)
	}
	n := len(msg)
	framed := p.requestBodyMode == procmodev3.ProcessingMode_GRPC
	if framed {
		if body.GetEndOfStream() && body.GetEndOfStreamWithoutMessage() {
			return nil
		}
		n += frameHeaderLen
	}
	capacity := chunkCapacity(p.reqBody, n, framed, p.reqLength, p.att.Policy.MaxRequestBody)
	if b := p.srv.budget; b != nil && int64(len(p.reqBody)+n) > b.limit {
		return attempt.BodyTooLarge(int(b.limit))
	}
	if !p.srv.budget.hold(&p.held, capacity-cap(p.reqBody)) {
		return p.srv.budget.capacityProblem(p.att.Policy.RetryAfter)
	}
	p.reqBody = keepChunk(p.reqBody, msg, framed, body.GetGrpcMessageCompressed(), capacity)
	return nil
}

// render turns a verdict into the reply to the current message, and is
// the one place the stream's stage changes.
//   - ReadBody: the body is awaited (stageRequestBody, awaitBody).
//   - Continue: the reserved request goes upstream (stageUpstream) and
//     every withheld reply is released (cont).
//   - Pass: the request goes on unprotected (passThrough).
//   - Answer: the server answers in the upstream's place, with the problem
//     or the replay in the caller's form; withheld replies are dropped,
//     the request never goes on.
//   - Wait: Envoy's timer for the message is extended for the wait, and
//     the stream loop resumes the decision once that reply is sent.
//   - SendHome: the request goes on to its home region's route (homeReply).
//   - At the response: Store reads its body (stageResponseBody,
//     readResponseBody); SkipBody and Settled end what the record needs.
//
// Headers a verdict adds to the response are kept for the response
// headers reply (onResponse); gRPC answers carry none.
func (p *processor) render(ctx context.Context, v attempt.Verdict) *extprocv3.ProcessingResponse {
	p.trace.shadowed(v.Shadow)
	if len(v.Add) > 0 && !p.rpc.call {
		p.respAdd = append(p.respAdd, v.Add...)
	}
	if v.Kind != attempt.Wait { // through a wait the stage stays
		// Nothing more is recorded here, but what the cases below read or
		// wait for; stageUnsettled when a settlement is still to be retried.
		p.stage = stagePassThrough
		if v.Unsettled {
			p.stage = stageUnsettled
		}
	}
	switch v.Kind {
	case attempt.ReadBody:
		p.stage = stageRequestBody
		return p.awaitBody(ctx)
	case attempt.Continue:
		p.stage, p.settleAsk = stageUpstream, v.Wait
		return p.cont()
	case attempt.Wait:
		// Envoy times each message out (message_timeout, 200 ms by
		// default): ask for the wait plus two store calls. Envoy honours
		// it only up to the filter's max_message_timeout. There is no
		// timer in the echo modes, and grpc-go takes any first reply but
		// the headers' as an error.
		p.then = p.resume
		if p.rpc.proxyless || echoes(p.requestBodyMode) {
			return nil
		}
		return &extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(v.Wait)}
	case attempt.Store:
		p.stage = stageResponseBody
		return p.readResponseBody()
	case attempt.Pass:
		return p.passThrough()
	case attempt.SkipBody:
		return continueWith(p.phase, skipResponseBody)
	case attempt.Settled:
		return p.cont()
	case attempt.SendHome:
		if resp := homeReply(p.phase, v.Home); resp != nil {
			return resp // home.go
		}
		return p.problemReply(problem.New(problem.HomeOutOfReach,
			"the request was decided at its trailers, whose reply cannot send it to its home region; nothing was done"))
	}
	p.rpc.drop() // the request never goes on
	if v.Replay != nil {
		return p.replayReply(v.Replay)
	}
	return p.problemReply(v.Problem)
}

// refuseUnread refuses a request whose body is refused before it was read
// whole: over a limit or the server's budget (chunk is the message that
// did not fit), or cut at Envoy's buffer. A JSON-RPC answer made before
// the body decided the policy still goes to the request's id when the
// bytes at hand carry it (jsonrpc.ScanID). As after decide, the bytes
// read so far go back to the budget unless a withheld echo keeps them.
func (p *processor) refuseUnread(ctx context.Context, prob *problem.Problem, chunk []byte) *extprocv3.ProcessingResponse {
	if d := p.body; d != nil && d.jsonrpc && d.id == nil {
		d.id = jsonrpc.ScanID(p.reqBody, chunk)
	}
	p.reqBody = nil
	return p.renderDecided(ctx, p.att.Request(ctx, attempt.Body{Unread: prob}, p.srv.cfg.Now()))
}

// awaitBody asks for a protected request's body, whole, before anything
// of the request goes upstream (render's ReadBody). In the echo modes the headers reply is
// withheld (rpcState); grpc-go without a request body mode sends no body
// at all, so the call is decided on its headers (its fingerprint then
// lacks the message).
func (p *processor) awaitBody(ctx context.Context) *extprocv3.ProcessingResponse {
	if p.srv.budget.full() && !p.body.answersJSONRPC() {
		// A JSON-RPC answer here could not carry the request's id, which
		// only its body holds: such a request is refused at its body,
		// where the budget refuses it still if it stays full.
		return p.refuseUnread(ctx, p.srv.budget.capacityProblem(p.att.Policy.RetryAfter), nil)
	}
	switch {
	case p.rpc.proxyless && p.requestBodyMode == procmodev3.ProcessingMode_NONE:
		return p.decide(ctx)
	case echoes(p.requestBodyMode):
		p.rpc.headersHeld = true
		return nil
	case !p.modesKnown:
		p.requestBodyMode, p.responseBodyMode = procmodev3.ProcessingMode_BUFFERED, procmodev3.ProcessingMode_BUFFERED
	case p.requestBodyMode == procmodev3.ProcessingMode_NONE, p.requestBodyMode == procmodev3.ProcessingMode_STREAMED:
		// The fingerprint needs the whole body, and the upstream must see
		// no part of the request before the reservation: in STREAMED mode
		// Envoy would forward the headers and every answered chunk at once
		// (processor_state.cc handleHeaderContinue). Ask for BUFFERED,
		// which holds the headers until the body's reply. If Envoy does
		// not honour overrides, the chunks are read as they come
		// (onRequestBody).
		return continueWith(p.phase, &procmodev3.ProcessingMode{
			RequestBodyMode:  procmodev3.ProcessingMode_BUFFERED,
			ResponseBodyMode: wantedResponseBodyMode(p.responseBodyMode),
		})
	}
	return continueWith(p.phase, nil)
}

// readResponseBody asks for the body of a response to be stored (render's
// Store).
func (p *processor) readResponseBody() *extprocv3.ProcessingResponse {
	switch {
	case !p.rpc.response && p.responseBodyMode == procmodev3.ProcessingMode_NONE:
		return continueWith(p.phase, bufferResponseBody)
	case p.rpc.response && p.modesKnown && !p.rpc.proxyless && !echoes(p.responseBodyMode):
		// Envoy sends trailers only when asked: ask for them.
		return continueWith(p.phase, &procmodev3.ProcessingMode{
			ResponseBodyMode:    wantedResponseBodyMode(p.responseBodyMode),
			ResponseTrailerMode: procmodev3.ProcessingMode_SEND,
		})
	}
	return continueWith(p.phase, nil)
}

// resume ends a wait (render's Wait) once Envoy was told of it: the
// attempt waits, and its verdict answers the message.
func (p *processor) resume(ctx context.Context) *extprocv3.ProcessingResponse {
	return p.renderDecided(ctx, p.att.Await(ctx))
}

// passThrough lets an unprotected request go on and asks Envoy to skip
// every later phase of it, but the response headers when a header is to
// be added there (respAdd). At the response headers it asks for the body
// of a tools/list answer being learned from (tools.go), and skips the
// body of a request passed at its body: Envoy honours mode_override only
// in a reply to a headers message (ext_proc.cc, onReceiveMessage,
// inHeaderProcessState), so such a request could not skip the response
// phases then, and an unprotected MCP answer streamed as
// text/event-stream (a long tool call's progress) is not held whole in
// Envoy's buffer for a body phase that has nothing to do.
func (p *processor) passThrough() *extprocv3.ProcessingResponse {
	switch {
	case p.phase == phaseRequestHeaders && !p.rpc.withholds():
		if len(p.respAdd) > 0 {
			return continueWith(p.phase, onlyResponseHeaders)
		}
		return continueWith(p.phase, skipEverything)
	case p.phase != phaseResponseHeaders:
		return p.cont()
	case p.body == nil:
	case p.body.tools != nil:
		return continueWith(p.phase, partialResponseBody)
	case !p.rpc.call:
		return continueWith(p.phase, skipResponseBody)
	}
	return continueWith(p.phase, nil)
}

// problemReply answers with a problem: RFC 9457 for HTTP, a gRPC status
// for a gRPC call, a JSON-RPC error for a JSON-RPC call.
func (p *processor) problemReply(prob *problem.Problem) *extprocv3.ProcessingResponse {
	if p.body.answersJSONRPC() {
		return jsonrpcProblem(prob, p.body.id) // jsonrpcanswer.go
	}
	if !p.rpc.call {
		return problemResponse(prob)
	}
	code, ok := grpcCodes[prob.Slug]
	if !ok {
		code = codes.Internal
	}
	var hs []*corev3.HeaderValueOption
	if prob.RetryAfter > 0 {
		// gRPC's retry pushback (gRFC A6), for calls through Envoy.
		hs = append(hs, setHeader("grpc-retry-pushback-ms", strconv.FormatInt(prob.RetryAfter.Milliseconds(), 10), false))
	}
	return grpcAnswer(code, prob.Slug+": "+prob.Detail, prob.Status, hs, "idempotency_"+prob.Slug, p.rpc.proxyless)
}

// replayReply answers a retry of a completed operation: the stored
// response for HTTP, rewritten to the retry's id for JSON-RPC
// (attempt.jsonrpcReplay), ALREADY_EXISTS naming the original status for
// gRPC (ReplayCode). A stored body that is no JSON-RPC response is never replayed to a
// wrong id: the answer is the outcome-unknown error, since the call did
// run and what it returned cannot be told.
func (p *processor) replayReply(r *idem.Response) *extprocv3.ProcessingResponse {
	if p.rpc.call {
		outcome := "HTTP status " + strconv.Itoa(r.Status)
		if code, msg, ok := grpcstatus.Of(r.Headers); ok {
			outcome = "status " + grpcstatus.Name(code)
			if code != codes.OK && msg != "" {
				outcome += ": " + msg
			}
		}
		hs := []*corev3.HeaderValueOption{setHeader(idem.ReplayedHeader, "true", false)}
		return grpcAnswer(ReplayCode, "idempotent-replay: operation already completed with "+outcome, 200, hs,
			"idempotency_replay", p.rpc.proxyless)
	}
	resp, dropped := replayResponse(r, p.att.Policy.StoresHeader)
	if dropped > 0 {
		// Envoy would have refused the whole mutation, the replay marker
		// with it: the answer goes out without these headers.
		p.srv.cfg.EnvoyObserver.ReplayHeadersDropped(p.att.Policy.Name, dropped)
		p.att.LogAt(slog.LevelWarn, "stored headers left out of a replay: Envoy would refuse them",
			slog.Int("dropped", dropped))
	}
	return resp
}

// cont lets the message go on: every withheld reply goes first, then the
// message's own CONTINUE; a body message in an echo mode is answered with
// its body sent back unchanged as a streamed_response (a reply without one
// fails the call in grpc-go and is spurious to Envoy).
func (p *processor) cont() *extprocv3.ProcessingResponse {
	p.rpc.release = releaseAll
	if body := p.msgBody; p.phase == phaseRequestBody && echoes(p.requestBodyMode) || p.phase == phaseResponseBody && echoes(p.responseBodyMode) {
		return streamedReply(p.phase, &extprocv3.StreamedBodyResponse{
			Body:                      body.GetBody(),
			EndOfStream:               body.GetEndOfStream(),
			EndOfStreamWithoutMessage: body.GetEndOfStreamWithoutMessage(),
			GrpcMessageCompressed:     body.GetGrpcMessageCompressed(),
		})
	}
	return continueWith(p.phase, nil)
}

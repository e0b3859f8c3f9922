package extproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// stage is where a stream is in the request's life.
type stage uint8

const (
	// The zero stage: the request headers are not answered yet.
	_ stage = iota
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
	// stageUnsettled: as stagePassThrough, but the record's settlement
	// is retried when the stream ends (attempt.Verdict.Unsettled), which
	// is not ended early for it (finished).
	stageUnsettled
)

// phase is the kind of message being answered: its reply must be of the
// matching kind (Envoy rejects any other as spurious). The request's three
// come first, then the response's: sequence.next tells the direction by
// dividing by phaseResponseHeaders.
type phase uint8

const (
	phaseRequestHeaders phase = iota
	phaseRequestBody
	phaseRequestTrailers
	phaseResponseHeaders
	phaseResponseBody
	phaseResponseTrailers
	// phaseUnknown: a message of no phase, a window update or one of a
	// kind the server does not know.
	phaseUnknown
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
	// stage, phase, respTooLarge and seq sit next to modesKnown, in what
	// would be padding: a processor is allocated per request, and this
	// keeps it, with the 8 bytes of the allocator's header for an object
	// over 512 bytes with pointers, in the 640 byte size class.
	stage stage
	// phase is the message being answered; msgBody its body, for a body
	// message (echoed back in the echo modes).
	phase phase
	// respTooLarge: the response is recorded without its body.
	respTooLarge bool
	seq          sequence
	msgBody      *extprocv3.HttpBody
	// then: the reply just queued extends Envoy's timer (a wait,
	// attempt.Wait, or a far home's settlement); the loop sends it, then
	// answers the message with what then returns.
	then func(context.Context) *extprocv3.ProcessingResponse

	// att is the attempt: policy, record, token, what it holds.
	att attempt.Attempt
	// settleAsk is the time to ask Envoy for before a response message
	// that may settle the record (the Continue verdict's Wait).
	settleAsk time.Duration
	reqBody   []byte
	// reqLength and respLength are the bodies' declared lengths
	// (content-length), 0 when unknown: the size of their buffers
	// (bodybuf.go).
	reqLength, respLength int
	// held is what this stream's buffered bodies take of the server's
	// budget (budget.go).
	held holding

	trace streamTrace

	respStatus  int
	respHeaders []idem.Header
	respBody    []byte

	rpc rpcState
	// body is set for a request whose policy is decided at its body
	// (attempt.Verdict.AtBody); nil on every other request.
	body *bodyDecision

	// respAdd are headers the response headers reply adds to the response
	// the client gets (attempt.Verdict.Add). HTTP only.
	respAdd []attempt.ResponseHeader
}

func newProcessor(s *Server, set *policy.Set) *processor {
	p := &processor{srv: s, policies: set, trace: streamTrace{obs: s.cfg.Observer}}
	p.att = attempt.New(&s.att, &p.trace)
	return p
}

// message is what the server reads of one ext_proc message: its phase
// and payload, and Envoy's facts sent with it. It is read once, by the
// stream loop (messageOf); nothing past it sees the whole message.
type message struct {
	phase    phase
	headers  *extprocv3.HttpHeaders
	body     *extprocv3.HttpBody
	trailers *extprocv3.HttpTrailers
	facts    envoyFacts
	// err refuses a message of phaseUnknown: nil for one that only
	// acknowledges what the server sent (grpc-go's flow control).
	err error
}

// messageOf reads one message.
func messageOf(req *extprocv3.ProcessingRequest) message {
	m := message{facts: envoyFacts{
		metadata: req.GetMetadataContext(), protocol: req.GetProtocolConfig(), flow: req.GetFlowControlInit(),
	}}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		m.phase, m.headers = phaseRequestHeaders, r.RequestHeaders
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		m.phase, m.headers = phaseResponseHeaders, r.ResponseHeaders
	case *extprocv3.ProcessingRequest_RequestBody:
		m.phase, m.body = phaseRequestBody, r.RequestBody
	case *extprocv3.ProcessingRequest_ResponseBody:
		m.phase, m.body = phaseResponseBody, r.ResponseBody
	case *extprocv3.ProcessingRequest_RequestTrailers:
		m.phase, m.trailers = phaseRequestTrailers, r.RequestTrailers
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		m.phase, m.trailers = phaseResponseTrailers, r.ResponseTrailers
	default:
		m.phase = phaseUnknown
		if req.GetRequest() != nil || req.GetClientWindowUpdate() == nil {
			m.err = protocolError{fmt.Errorf("unsupported ext_proc message %T", req.GetRequest())}
		}
	}
	// The attributes are in ProcessingRequest.attributes (current), or in
	// the deprecated HttpHeaders.attributes of the headers (older versions).
	if m.facts.attrs = req.GetAttributes()[attributesKey]; m.facts.attrs == nil {
		//lint:ignore SA1019 older Envoys sent attributes here; still read for them.
		m.facts.attrs = m.headers.GetAttributes()[attributesKey]
	}
	return m
}

// handle answers one message. An error is a protocol violation
// (protocolError). A nil reply means none is due yet (see rpcState).
func (p *processor) handle(ctx context.Context, m *message) (*extprocv3.ProcessingResponse, error) {
	if m.phase == phaseUnknown {
		return nil, m.err // nil for grpc-go's flow control acknowledging what it was sent back
	}
	// The response may come before the request ends when the request body
	// streams (STREAMED, FULL_DUPLEX_STREAMED, GRPC), or when no mode is
	// known at all (an Envoy before 1.30 sends no protocol_config) for a
	// request the server did not assume BUFFERED for.
	streams := !keepsBody(p.requestBodyMode) || !p.modesKnown && p.requestBodyMode == procmodev3.ProcessingMode_NONE
	if err := p.seq.next(m.phase, m.headers.GetEndOfStream() || m.body.GetEndOfStream(), streams); err != nil {
		return nil, protocolError{err}
	}
	if pc := m.facts.protocol; pc != nil {
		p.requestBodyMode, p.responseBodyMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		p.modesKnown = true
	}
	p.phase, p.msgBody = m.phase, m.body
	if m.phase <= phaseRequestTrailers {
		return p.onRequest(ctx, m), nil
	}
	// A message that may settle a record held in a far home's store first
	// asks Envoy for the settlement's time (settleAsk), as a wait does at
	// the request: message_timeout is shorter than one call there.
	if d := p.settleAsk; d > 0 && maySettle(m, p.stage, p.responseBodyMode, p.rpc.proxyless) {
		p.then = func(ctx context.Context) *extprocv3.ProcessingResponse { return p.onResponse(ctx, m) }
		return &extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(d)}, nil
	}
	return p.onResponse(ctx, m), nil
}

// Process serves one ext_proc stream, that is one HTTP request.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	s.cfg.Observer.StreamStarted()
	defer s.cfg.Observer.StreamEnded()
	p := newProcessor(s, s.cfg.Policies())
	err := s.serve(stream.Context(), stream, p)
	// However the stream ended, the attempt settles what it still holds
	// (attempt.SettleAtEnd). With response headers in hand the upstream
	// did answer, so the record completes without its body.
	var partial *idem.Response
	if p.stage == stageResponseBody {
		partial = &idem.Response{Status: p.respStatus, Headers: p.respHeaders, BodyOmitted: true}
	}
	p.att.SettleAtEnd(p.trace.Background(), partial)
	s.budget.release(&p.held)
	p.trace.end(&p.att, err)
	return err
}

// serve is the stream loop: it reads each message, has the processor
// answer it, and sends what the answer queued, in protocol order: replies
// withheld until now (rpcState), then the reply to the message itself.
// A duplicate that waits for the attempt in flight, or a settlement in a
// far home's store, first gets Envoy's timer extended (processor.then).
func (s *Server) serve(ctx context.Context, stream extprocv3.ExternalProcessor_ProcessServer, p *processor) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			// Envoy ends every stream with a half-close and a reset, so EOF
			// and Canceled are the normal end, not failures.
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		m := messageOf(req)
		pctx, span := p.trace.startPhase(ctx, s.tracer, &m)
		resp, err := p.handle(pctx, &m)
		for err == nil {
			for r := p.rpc.next(); r != nil; r = p.rpc.next() {
				if err = stream.Send(r); err != nil {
					break
				}
			}
			if err == nil && resp != nil {
				err = stream.Send(resp)
			}
			if err != nil || p.then == nil {
				break
			}
			next := p.then
			p.then = nil
			resp = next(pctx)
		}
		span.End()
		if _, bad := err.(protocolError); bad {
			p.att.LogAt(slog.LevelWarn, "ext_proc protocol error", slog.String("error", err.Error()))
			return status.Error(codes.InvalidArgument, err.Error())
		}
		if err != nil {
			return err
		}
		if p.finished() {
			return nil
		}
	}
}

// finished reports whether the server needs nothing more of this stream,
// so that it ends it (returns OK) right after the reply it just sent. The
// protocol allows it: every message is answered "or [by] clos[ing] the
// stream", which a server may do "to indicate that no more messages are
// needed" (external_processor.proto, ProcessingRequest.observability_mode
// and the request_headers ... response_trailers members). A stream the
// server closes with OK is one Envoy "can ignore ... for the
// rest of our request and response processing": it sends no further
// message, and a message it had already sent is let through unchanged
// (ext_proc.cc Filter::onGrpcClose: processing_complete_, closeStream,
// clearAsyncState; test GetAndCloseStream in filter_test.cc). grpc-go's
// filter does the same: an io.EOF from the processor bypasses it
// (internal/xds/httpfilter/extproc ext_proc.go, failProcStream,
// triggerBypass). Ending the stream here saves the wait for Envoy's own
// close, and lets grpc-go write the reply and the stream's trailers in one
// write (docs/performance.md, "History of changes").
//
// It holds only when nothing could still be wanted: the request is past
// every decision and the attempt holds and retries nothing
// (stagePassThrough: answered by the server, passed, or its record
// settled), no header waits to be added to the response (respAdd), no
// reply is withheld, the request is not a gRPC call (whose outcome comes
// later, from its trailers: grpc.go), no tools/list answer is to be read
// for its tools' annotations (tools.go), and both body modes are known and
// ones in which Envoy keeps the body itself (NONE, BUFFERED,
// BUFFERED_PARTIAL). In STREAMED, GRPC and FULL_DUPLEX_STREAMED modes
// chunks may be queued on Envoy's side or forwarded only as the server
// sends them back (echoes), and what Envoy does with them on a close was
// not read closely enough to rely on: those streams end as before, when
// Envoy closes them.
func (p *processor) finished() bool {
	return p.stage == stagePassThrough && len(p.respAdd) == 0 && !p.rpc.withholds() && !p.rpc.call &&
		p.body.learning() == nil && p.modesKnown && keepsBody(p.requestBodyMode) && keepsBody(p.responseBodyMode)
}

// keepsBody reports a body mode in which Envoy holds the body itself, and
// forwards it unchanged when processing ends.
func keepsBody(m procmodev3.ProcessingMode_BodySendMode) bool {
	switch m {
	case procmodev3.ProcessingMode_NONE, procmodev3.ProcessingMode_BUFFERED, procmodev3.ProcessingMode_BUFFERED_PARTIAL:
		return true
	}
	return false
}

// headerCarrier reads W3C trace context from Envoy's request headers.
type headerCarrier struct{ m *corev3.HeaderMap }

// Get stops at the first line of key, as the propagator reads one value.
func (c headerCarrier) Get(key string) string {
	v, _ := headerBytes(c.m, key)
	return string(v)
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c.m.GetHeaders()))
	for _, h := range c.m.GetHeaders() {
		keys = append(keys, h.GetKey())
	}
	return keys
}

var traceContext = propagation.TraceContext{}

// phaseSpanNames name the span of each phase's message; past their
// prefix, the phases' names in external_processor.proto (phase.String).
var phaseSpanNames = [...]string{
	phaseRequestHeaders:   "ext_proc request_headers",
	phaseRequestBody:      "ext_proc request_body",
	phaseRequestTrailers:  "ext_proc request_trailers",
	phaseResponseHeaders:  "ext_proc response_headers",
	phaseResponseBody:     "ext_proc response_body",
	phaseResponseTrailers: "ext_proc response_trailers",
	phaseUnknown:          "ext_proc unknown",
}

func (ph phase) String() string { return phaseSpanNames[ph][len("ext_proc "):] }

// streamTrace is the stream's side of its attempt's conversation
// (attempt.Conversation): the stream's span, carried by ctx for work done
// after the stream's own context ended (nil when tracing is off), and the
// observer told of each decision. The span is read back from ctx, which
// Tracer.Start returns "containing the newly-created span"
// (go.opentelemetry.io/otel/trace, tracer.go), rather than kept beside it:
// the processor stays in its allocation size class (processor).
type streamTrace struct {
	ctx context.Context
	obs idem.Observer
}

// startPhase opens the span of one message, as a child of the stream's
// span; the stream's span starts with the first message, under the
// traceparent of the request's headers when there is one.
func (t *streamTrace) startPhase(ctx context.Context, tracer trace.Tracer, m *message) (context.Context, trace.Span) {
	if tracer == nil {
		return ctx, trace.SpanFromContext(context.Background()) // a no-op span, shared
	}
	if t.ctx == nil {
		parent := ctx
		if m.phase == phaseRequestHeaders {
			parent = traceContext.Extract(ctx, headerCarrier{m.headers.GetHeaders()})
		}
		t.ctx, _ = tracer.Start(parent, "idem-extproc stream", trace.WithSpanKind(trace.SpanKindServer))
	}
	return tracer.Start(trace.ContextWithSpan(ctx, trace.SpanFromContext(t.ctx)), phaseSpanNames[m.phase])
}

// Background returns a context carrying the stream's span.
func (t *streamTrace) Background() context.Context {
	return cmp.Or(t.ctx, context.Background())
}

// Decided reports a decision to the observer and on the stream's span.
func (t *streamTrace) Decided(policy string, d idem.Decision) {
	t.obs.Decided(policy, d)
	if t.ctx != nil {
		span := trace.SpanFromContext(t.ctx)
		span.AddEvent(string(d))
		span.SetAttributes(attribute.String("idem.decision", string(d)))
	}
}

// shadowed puts a shadow policy's decision, if any, on the stream's span.
func (t *streamTrace) shadowed(d idem.ShadowDecision) {
	if t.ctx != nil && d != "" {
		trace.SpanFromContext(t.ctx).SetAttributes(attribute.String("idem.shadow_decision", string(d)))
	}
}

// end closes the stream's span with what is known about the attempt.
func (t *streamTrace) end(a *attempt.Attempt, err error) {
	if t.ctx == nil {
		return
	}
	span := trace.SpanFromContext(t.ctx)
	if a.Policy != nil {
		span.SetAttributes(attribute.String("idem.policy", a.Policy.Name))
	}
	if a.ID != "" {
		span.SetAttributes(attribute.String("idem.key_hash", string(a.ID)), attribute.String("idem.scope", a.Scope))
	}
	if a.RequestID != "" {
		span.SetAttributes(attribute.String("http.request.header.x-request-id", a.RequestID))
	}
	if a.Number > 0 {
		span.SetAttributes(attribute.Int("idem.attempt", a.Number))
	}
	if err != nil {
		span.SetStatus(otelcodes.Error, err.Error())
	}
	span.End()
}

package envoysim

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Envoy's defaults (ext_proc config.h, the connection manager's buffer).
const (
	DefaultMessageTimeout = 200 * time.Millisecond
	DefaultBufferLimit    = 1 << 20
)

// Options covers what Envoy takes from outside the filter's proto.
type Options struct {
	// BufferLimit is the per-request buffer limit; DefaultBufferLimit when 0.
	BufferLimit int
	// ChunkSize splits a STREAMED body into data chunks of this size as they
	// would arrive from the network. Zero means the whole body arrived
	// before the headers reply, which Envoy sends as a single message.
	ChunkSize int
	// SkipLocalReplies selects Envoy 1.34-1.36, which does not pass its own
	// local replies (upstream timeout, reset) through the response phases.
	SkipLocalReplies bool
	// MaxHeadersCount and MaxHeadersKB are the header map limits a
	// mutation must keep (the connection manager's max_headers_count and
	// max_request_headers_kb); DefaultMaxHeadersCount and
	// DefaultMaxHeadersKB when 0. envoysim applies them to immediate
	// responses' maps too; whether Envoy's local-reply map carries them
	// was not confirmed in header_map_impl.h (see FIDELITY.md).
	MaxHeadersCount int
	MaxHeadersKB    int
	// Edge makes the connection manager an edge one (use_remote_address:
	// true, xff_num_trusted_hops 0, the client external): it overwrites the
	// client's x-forwarded-proto and, unless PreserveExternalRequestID
	// (preserve_external_request_id), its x-request-id
	// (ConnectionManagerUtility::mutateRequestHeaders).
	Edge                      bool
	PreserveExternalRequestID bool
	// CloseStreamEarly selects Envoy 1.37+, which closes the gRPC stream as
	// soon as a reply leaves no later phase that needs the server
	// (ext_proc.cc Filter::closeGrpcStreamIfLastRespReceived, runtime
	// envoy.reloadable_features.ext_proc_stream_close_optimization).
	CloseStreamEarly bool
	// OnReply, when set, is told how long each message waited for its
	// reply: from sending it to receiving the reply that answers it (a
	// CONTINUE or an immediate response). It only observes; a load tool
	// uses it to time each phase. It is called on the goroutine that
	// called Do.
	OnReply func(phase Phase, d time.Duration)
}

// Filter is one configured ext_proc filter talking to one server.
type Filter struct {
	cfg    *extprocfilterv3.ExternalProcessor
	opts   Options
	client extprocv3.ExternalProcessorClient
}

// NewFilter returns a filter with the given configuration, calling the
// ext_proc server on cc.
func NewFilter(cc grpc.ClientConnInterface, cfg *extprocfilterv3.ExternalProcessor, opts Options) *Filter {
	if opts.BufferLimit <= 0 {
		opts.BufferLimit = DefaultBufferLimit
	}
	return &Filter{cfg: cfg, opts: opts, client: extprocv3.NewExternalProcessorClient(cc)}
}

// RecommendedConfig is the filter configuration DESIGN §7 recommends:
// headers SEND, bodies BUFFERED, trailers SKIP, mode override allowed,
// failing closed, with the request and response attributes the server
// reads.
func RecommendedConfig() *extprocfilterv3.ExternalProcessor {
	return &extprocfilterv3.ExternalProcessor{
		ProcessingMode: &extprocfilterv3.ProcessingMode{
			RequestHeaderMode:   extprocfilterv3.ProcessingMode_SEND,
			ResponseHeaderMode:  extprocfilterv3.ProcessingMode_SEND,
			RequestBodyMode:     extprocfilterv3.ProcessingMode_BUFFERED,
			ResponseBodyMode:    extprocfilterv3.ProcessingMode_BUFFERED,
			RequestTrailerMode:  extprocfilterv3.ProcessingMode_SKIP,
			ResponseTrailerMode: extprocfilterv3.ProcessingMode_SKIP,
		},
		AllowModeOverride: true,
		FailureModeAllow:  false,
		// xds.route_name for policies matching on route names; the peer
		// certificate's URI SAN for scope.from: principal (absent, and
		// harmless, without mTLS).
		RequestAttributes:  []string{"xds.route_name", "connection.uri_san_peer_certificate"},
		ResponseAttributes: []string{"response.code_details", "response.flags"},
	}
}

// exchange is one HTTP request going through the filter.
type exchange struct {
	f    *Filter
	req  *Request
	res  *Result
	mode *extprocfilterv3.ProcessingMode
	side sideStream

	// complete is Envoy's processing_complete_: nothing more is sent.
	complete      bool
	reqAttrsSent  bool
	respAttrsSent bool
	configSent    bool
	respStatus    int
	respDetails   string
	respFlags     uint64
	// reqHeaders is the request header map as the connection manager
	// built it, x-request-id included.
	reqHeaders []Header
	// sentAt[i] is when res.Messages[i] was sent; kept only for
	// Options.OnReply.
	sentAt []time.Time
}

// errClientGone ends an exchange whose downstream went away.
var errClientGone = errors.New("downstream client went away")

// ErrSpurious is a reply that does not answer the outstanding message:
// the wrong type, or an empty ProcessingResponse.
var ErrSpurious = errors.New("spurious message")

// Do sends req through the filter and the upstream, and returns what the
// downstream client receives along with a record of the conversation.
func (f *Filter) Do(ctx context.Context, req *Request, up Upstream) *Result {
	x := &exchange{f: f, req: req, res: &Result{}, mode: f.effectiveMode(req)}
	x.reqHeaders = connectionManagerHeaders(req, f.opts)
	x.side.client = f.client
	defer x.side.close()
	resp, err := x.run(ctx, up)
	if errors.Is(err, errClientGone) || ctx.Err() != nil {
		return x.res
	}
	x.res.Response = resp
	return x.res
}

func (f *Filter) effectiveMode(req *Request) *extprocfilterv3.ProcessingMode {
	mode := proto.Clone(f.cfg.GetProcessingMode()).(*extprocfilterv3.ProcessingMode)
	if mode == nil {
		mode = &extprocfilterv3.ProcessingMode{}
	}
	if pr := req.PerRoute; pr != nil {
		switch o := pr.GetOverride().(type) {
		case *extprocfilterv3.ExtProcPerRoute_Disabled:
			if o.Disabled {
				mode.RequestHeaderMode = extprocfilterv3.ProcessingMode_SKIP
				mode.ResponseHeaderMode = extprocfilterv3.ProcessingMode_SKIP
				mode.RequestBodyMode = extprocfilterv3.ProcessingMode_NONE
				mode.ResponseBodyMode = extprocfilterv3.ProcessingMode_NONE
				mode.RequestTrailerMode = extprocfilterv3.ProcessingMode_SKIP
				mode.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SKIP
			}
		case *extprocfilterv3.ExtProcPerRoute_Overrides:
			if pm := o.Overrides.GetProcessingMode(); pm != nil {
				mode = proto.Clone(pm).(*extprocfilterv3.ProcessingMode)
			}
		}
	}
	return mode
}

// shouldRemoveContentLength is ProcessorState::shouldRemoveContentLength
// (ext_proc processor_state.h): in STREAMED, BUFFERED_PARTIAL and
// FULL_DUPLEX_STREAMED, and in BUFFERED with the headers SKIPped, the filter
// cannot keep content-length right if the body changes, so decodeHeaders and
// encodeHeaders remove it right after onHeaders, with the mode in force then
// (before any override the reply carries), unless processing is complete.
// The headers message itself still carries it.
func shouldRemoveContentLength(body extprocfilterv3.ProcessingMode_BodySendMode, headers extprocfilterv3.ProcessingMode_HeaderSendMode) bool {
	switch body {
	case extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL,
		extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return true
	case extprocfilterv3.ProcessingMode_BUFFERED:
		return headers == extprocfilterv3.ProcessingMode_SKIP
	}
	return false
}

func sendHeaders(m extprocfilterv3.ProcessingMode_HeaderSendMode) bool {
	return m != extprocfilterv3.ProcessingMode_SKIP // DEFAULT means SEND for headers
}

func sendTrailers(m extprocfilterv3.ProcessingMode_HeaderSendMode) bool {
	return m == extprocfilterv3.ProcessingMode_SEND // DEFAULT means SKIP for trailers
}

func (x *exchange) run(ctx context.Context, up Upstream) (*Response, error) {
	req := x.req
	headers := x.reqHeaders
	body, trailers := req.Body, req.Trailers
	hasBody := len(body) > 0

	// FULL_DUPLEX_STREAMED: headers, body and trailers in one exchange.
	duplexReq := fullDuplex(x.mode.GetRequestBodyMode()) && !x.complete
	if duplexReq {
		var local *Response
		var err error
		headers, body, trailers, local, err = x.duplex(ctx, true, headers, body, trailers)
		if err != nil || local != nil {
			return local, err
		}
	}

	// Request headers.
	stripCL := !duplexReq && shouldRemoveContentLength(x.mode.GetRequestBodyMode(), x.mode.GetRequestHeaderMode())
	if !duplexReq && sendHeaders(x.mode.GetRequestHeaderMode()) && !x.complete {
		pr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: toHeaderMap(headers), EndOfStream: !hasBody && len(trailers) == 0},
		}}
		reply, local, err := x.call(ctx, pr, PhaseRequestHeaders)
		if err != nil {
			return nil, err
		}
		if local != nil {
			return local, nil
		}
		if stripCL {
			// Removed as onHeaders returns, before the reply (and any
			// mode override in it) is applied.
			headers = remove(headers, "content-length")
		}
		if reply != nil {
			if headers, local = x.mutate(headers, reply.GetRequestHeaders().GetResponse()); local != nil {
				return local, nil
			}
		}
	} else if stripCL && !x.complete {
		headers = remove(headers, "content-length")
	}
	if err := x.clientGoneAfter(PhaseRequestHeaders); err != nil {
		return nil, err
	}

	// Request body.
	if !duplexReq && hasBody && !x.complete {
		var local *Response
		var err error
		headers, body, local, err = x.requestBody(ctx, headers, body, len(trailers) > 0)
		if err != nil || local != nil {
			return local, err
		}
	}
	if err := x.clientGoneAfter(PhaseRequestBody); err != nil {
		return nil, err
	}

	// Request trailers.
	if !duplexReq && len(trailers) > 0 && sendTrailers(x.mode.GetRequestTrailerMode()) && !x.complete {
		pr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocv3.HttpTrailers{Trailers: toHeaderMap(trailers)},
		}}
		_, local, err := x.call(ctx, pr, PhaseRequestTrailers)
		if err != nil || local != nil {
			return local, err
		}
	}
	if err := x.clientGoneAfter(PhaseRequestTrailers); err != nil {
		return nil, err
	}

	// The router.
	upReq := &Request{
		Method: get(headers, ":method"), Path: get(headers, ":path"), Authority: get(headers, ":authority"),
		Scheme: get(headers, ":scheme"), Headers: withoutPseudo(headers), Body: body, Trailers: trailers,
		RouteName: req.RouteName, PeerCertificate: req.PeerCertificate, RemoteAddress: req.RemoteAddress,
	}
	x.res.UpstreamCalled, x.res.UpstreamRequest = true, upReq
	start := time.Now()
	resp, err := up(ctx, upReq)
	if uf := (*UpstreamFailure)(nil); errors.As(err, &uf) && uf.Filter != "" {
		// A decoder filter after ext_proc answered: the router never ran.
		x.res.UpstreamCalled, x.res.UpstreamRequest = false, nil
	}
	if ctx.Err() != nil {
		// The downstream went away while the upstream worked: Envoy resets
		// the whole stream, with no local reply to pass through the filter.
		return nil, errClientGone
	}
	if err := x.clientGoneAfter(PhaseUpstream); err != nil {
		return nil, err
	}
	if err != nil {
		var uf *UpstreamFailure
		if !errors.As(err, &uf) {
			uf = ConnectionTermination
		}
		return x.localReply(ctx, uf)
	}
	resp.Headers = append(append([]Header(nil), resp.Headers...),
		Header{"x-envoy-upstream-service-time", strconv.FormatInt(time.Since(start).Milliseconds(), 10)})
	if resp.Details == "" {
		resp.Details = "via_upstream"
	}
	return x.response(ctx, resp)
}

func (x *exchange) clientGoneAfter(p Phase) error {
	if x.req.ResetAfter == p {
		return errClientGone
	}
	return nil
}

// localReply is Envoy's sendLocalReply after a router failure: the reply
// passes the response phases unless SkipLocalReplies (Envoy 1.34-1.36).
func (x *exchange) localReply(ctx context.Context, uf *UpstreamFailure) (*Response, error) {
	resp := &Response{
		Status:  uf.Status,
		Headers: prepareLocalReply(nil, []byte(uf.Body)),
		Body:    []byte(uf.Body),
		Details: uf.Details,
		Flags:   uf.Flags,
	}
	if x.isGRPC() {
		resp = grpcLocalReply(uf.Status, nil, []byte(uf.Body), nil, uf.Details)
		resp.Flags = uf.Flags
	}
	if x.f.opts.SkipLocalReplies {
		x.complete = true
		return resp, nil
	}
	return x.response(ctx, resp)
}

func (x *exchange) response(ctx context.Context, resp *Response) (*Response, error) {
	x.respStatus, x.respDetails, x.respFlags = resp.Status, resp.Details, resp.Flags
	headers := append([]Header{{":status", strconv.Itoa(resp.Status)}}, resp.Headers...)
	body, trailers := resp.Body, resp.Trailers
	hasBody := len(body) > 0

	duplexResp := fullDuplex(x.mode.GetResponseBodyMode()) && !x.complete
	if duplexResp {
		var local *Response
		var err error
		headers, body, trailers, local, err = x.duplex(ctx, false, headers, body, trailers)
		if err != nil || local != nil {
			return local, err
		}
	}
	stripCL := !duplexResp && shouldRemoveContentLength(x.mode.GetResponseBodyMode(), x.mode.GetResponseHeaderMode())
	if !duplexResp && sendHeaders(x.mode.GetResponseHeaderMode()) && !x.complete {
		pr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{Headers: toHeaderMap(headers), EndOfStream: !hasBody && len(trailers) == 0},
		}}
		reply, local, err := x.call(ctx, pr, PhaseResponseHeaders)
		if err != nil || local != nil {
			return local, err
		}
		if stripCL {
			headers = remove(headers, "content-length")
		}
		if reply != nil {
			if headers, local = x.mutate(headers, reply.GetResponseHeaders().GetResponse()); local != nil {
				return local, nil
			}
		}
	} else if stripCL && !x.complete {
		headers = remove(headers, "content-length")
	}
	if err := x.clientGoneAfter(PhaseResponseHeaders); err != nil {
		return nil, err
	}
	if !duplexResp && hasBody && !x.complete {
		var local *Response
		var err error
		headers, body, local, err = x.responseBody(ctx, headers, body, len(trailers) > 0)
		if err != nil || local != nil {
			return local, err
		}
	}
	if err := x.clientGoneAfter(PhaseResponseBody); err != nil {
		return nil, err
	}
	if !duplexResp && len(trailers) > 0 && sendTrailers(x.mode.GetResponseTrailerMode()) && !x.complete {
		pr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocv3.HttpTrailers{Trailers: toHeaderMap(trailers)},
		}}
		_, local, err := x.call(ctx, pr, PhaseResponseTrailers)
		if err != nil || local != nil {
			return local, err
		}
	}
	out := &Response{Headers: withoutPseudo(headers), Body: body, Trailers: trailers, Details: resp.Details, Flags: resp.Flags}
	out.Status, _ = strconv.Atoi(get(headers, ":status"))
	return out, nil
}

// requestBody runs the request body phase in the mode in force.
func (x *exchange) requestBody(ctx context.Context, headers []Header, body []byte, trailers bool) ([]Header, []byte, *Response, error) {
	switch x.mode.GetRequestBodyMode() {
	case extprocfilterv3.ProcessingMode_BUFFERED:
		if len(body) > x.f.opts.BufferLimit {
			local, err := x.localReply(ctx, &UpstreamFailure{Status: 413, Details: "request_payload_too_large", Body: "Payload Too Large"})
			return headers, body, local, err
		}
		return x.bufferedBody(ctx, headers, body, !trailers, PhaseRequestBody)
	case extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL:
		n, whole := x.partialCut(len(body))
		h, newPart, local, err := x.bufferedBody(ctx, headers, body[:n], whole && !trailers, PhaseRequestBody)
		return h, append(newPart, body[n:]...), local, err
	case extprocfilterv3.ProcessingMode_STREAMED:
		return x.streamedBody(ctx, headers, body, trailers, PhaseRequestBody)
	}
	return headers, body, nil, nil
}

func (x *exchange) responseBody(ctx context.Context, headers []Header, body []byte, trailers bool) ([]Header, []byte, *Response, error) {
	switch x.mode.GetResponseBodyMode() {
	case extprocfilterv3.ProcessingMode_BUFFERED:
		if len(body) > x.f.opts.BufferLimit {
			x.complete = true
			return headers, body, &Response{Status: 500, Body: []byte("Internal Server Error"), Details: "response_payload_too_large"}, nil
		}
		return x.bufferedBody(ctx, headers, body, !trailers, PhaseResponseBody)
	case extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL:
		n, whole := x.partialCut(len(body))
		h, newPart, local, err := x.bufferedBody(ctx, headers, body[:n], whole && !trailers, PhaseResponseBody)
		return h, append(newPart, body[n:]...), local, err
	case extprocfilterv3.ProcessingMode_STREAMED:
		return x.streamedBody(ctx, headers, body, trailers, PhaseResponseBody)
	}
	return headers, body, nil, nil
}

// partialCut is how much of a body of size bytes BUFFERED_PARTIAL sends, and
// whether that is all of it (ext_proc.cc handleDataBufferedPartialMode):
// each data chunk is queued, and the queue goes out, consolidated, at the
// end of the stream or as soon as it holds more than the buffer limit
// (queueOverHighLimit: bytesEnqueued() > bufferLimit()), so the message
// may carry up to a chunk more than the limit. Chunks are Options.ChunkSize
// bytes; with none the body arrived in one piece and goes out whole.
func (x *exchange) partialCut(size int) (n int, whole bool) {
	chunk := x.f.opts.ChunkSize
	if chunk <= 0 {
		return size, true
	}
	for n < size {
		n = min(n+chunk, size)
		if n > x.f.opts.BufferLimit {
			break
		}
	}
	return n, n == size
}

func bodyRequest(phase Phase, chunk []byte, eos bool) *extprocv3.ProcessingRequest {
	b := &extprocv3.HttpBody{Body: chunk, EndOfStream: eos}
	if phase == PhaseRequestBody {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: b}}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: b}}
}

func bodyReply(phase Phase, r *extprocv3.ProcessingResponse) *extprocv3.CommonResponse {
	if phase == PhaseRequestBody {
		return r.GetRequestBody().GetResponse()
	}
	return r.GetResponseBody().GetResponse()
}

// bufferedBody sends the body as one message; the headers are still held,
// so the body reply may mutate them too.
func (x *exchange) bufferedBody(ctx context.Context, headers []Header, body []byte, eos bool, phase Phase) ([]Header, []byte, *Response, error) {
	reply, local, err := x.call(ctx, bodyRequest(phase, body, eos), phase)
	if err != nil || local != nil || reply == nil {
		return headers, body, local, err
	}
	cr := bodyReply(phase, reply)
	if headers, local = x.mutate(headers, cr); local != nil {
		return headers, body, local, nil
	}
	return headers, mutateBody(body, cr.GetBodyMutation()), nil, nil
}

// streamedBody sends every chunk without waiting, then matches the replies
// in order.
func (x *exchange) streamedBody(ctx context.Context, headers []Header, body []byte, trailers bool, phase Phase) ([]Header, []byte, *Response, error) {
	chunks := [][]byte{body}
	if n := x.f.opts.ChunkSize; n > 0 {
		chunks = chunks[:0]
		for len(body) > n {
			chunks = append(chunks, body[:n])
			body = body[n:]
		}
		chunks = append(chunks, body)
	}
	sent := 0
	for i, c := range chunks {
		if x.complete {
			break
		}
		if err := x.sendOnly(ctx, bodyRequest(phase, c, i == len(chunks)-1 && !trailers), phase); err != nil {
			local, ferr := x.failure(ctx, err)
			return headers, nil, local, ferr
		}
		sent++
	}
	var out []byte
	for i := range sent {
		reply, local, err := x.await(ctx, phase)
		if err != nil || local != nil {
			return headers, out, local, err
		}
		if reply == nil { // processing ended; the rest passes unprocessed
			for _, c := range chunks[i:] {
				out = append(out, c...)
			}
			return headers, out, nil, nil
		}
		out = append(out, mutateBody(chunks[i], bodyReply(phase, reply).GetBodyMutation())...)
	}
	return headers, out, nil, nil
}

func mutateBody(body []byte, m *extprocv3.BodyMutation) []byte {
	switch v := m.GetMutation().(type) {
	case *extprocv3.BodyMutation_Body:
		return v.Body
	case *extprocv3.BodyMutation_ClearBody:
		if v.ClearBody {
			return nil
		}
	}
	return body
}

// mutate applies a CommonResponse's header mutation; a rejected mutation is
// a processing error and fails closed like Envoy's handleErrorResponse.
func (x *exchange) mutate(headers []Header, cr *extprocv3.CommonResponse) ([]Header, *Response) {
	if cr.GetHeaderMutation() == nil {
		return headers, nil
	}
	out, err := x.applyMutation(headers, cr.GetHeaderMutation())
	if err != nil {
		x.res.ProcessingError = err
		x.side.close()
		x.complete = true
		// Filter::handleErrorResponse: status_on_error, the status
		// message as details (spaces as "_", sendImmediateResponse).
		return headers, x.errorReply(x.statusOnError(), spaceless(err.Error()))
	}
	return out, nil
}

// call sends one message and waits for its reply. It returns the reply
// (nil when processing ended and the request continues unprocessed), or
// the local reply that replaces the response.
func (x *exchange) call(ctx context.Context, pr *extprocv3.ProcessingRequest, phase Phase) (*extprocv3.ProcessingResponse, *Response, error) {
	if err := x.sendOnly(ctx, pr, phase); err != nil {
		local, ferr := x.failure(ctx, err)
		return nil, local, ferr
	}
	return x.await(ctx, phase)
}

func (x *exchange) sendOnly(ctx context.Context, pr *extprocv3.ProcessingRequest, phase Phase) error {
	if !x.side.opened {
		x.res.StreamOpened = true
		if err := x.side.open(ctx); err != nil {
			return err
		}
	}
	if !x.configSent {
		x.configSent = true
		pr.ProtocolConfig = &extprocv3.ProtocolConfiguration{
			RequestBodyMode:                         x.mode.GetRequestBodyMode(),
			ResponseBodyMode:                        x.mode.GetResponseBodyMode(),
			SendBodyWithoutWaitingForHeaderResponse: x.f.cfg.GetSendBodyWithoutWaitingForHeaderResponse(),
		}
	}
	pr.MetadataContext = x.metadataContext()
	x.addAttributes(pr, phase)
	m := Message{Phase: phase}
	switch r := pr.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		m.EndOfStream = r.RequestHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		m.EndOfStream = r.ResponseHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_RequestBody:
		m.EndOfStream, m.BodyLen = r.RequestBody.GetEndOfStream(), len(r.RequestBody.GetBody())
	case *extprocv3.ProcessingRequest_ResponseBody:
		m.EndOfStream, m.BodyLen = r.ResponseBody.GetEndOfStream(), len(r.ResponseBody.GetBody())
	case *extprocv3.ProcessingRequest_RequestTrailers, *extprocv3.ProcessingRequest_ResponseTrailers:
		m.EndOfStream = true
	}
	x.res.Messages = append(x.res.Messages, m)
	if x.f.opts.OnReply != nil {
		x.sentAt = append(x.sentAt, time.Now())
	}
	return x.side.send(pr)
}

// await reads the reply to the oldest outstanding message of phase.
func (x *exchange) await(ctx context.Context, phase Phase) (*extprocv3.ProcessingResponse, *Response, error) {
	idx := -1
	for i := range x.res.Messages {
		if x.res.Messages[i].Phase == phase && x.res.Messages[i].Reply == "" {
			idx = i
			break
		}
	}
	if idx < 0 {
		return nil, nil, fmt.Errorf("envoysim: no outstanding %s message", phase)
	}
	deadline := time.Now().Add(x.messageTimeout())
	extended := false
	reply, err := x.side.recv(ctx, deadline)
	for err == nil && reply.GetResponse() == nil && reply.GetOverrideMessageTimeout() != nil {
		// A new timeout for the outstanding message, not its reply
		// (onReceiveMessage checks it first; onNewTimeout honours it once,
		// within 1 ms..max_message_timeout, which defaults to 0: never).
		d := reply.GetOverrideMessageTimeout().AsDuration()
		if max := x.f.cfg.GetMaxMessageTimeout().AsDuration(); !extended && d >= time.Millisecond && d <= max {
			deadline, extended = time.Now().Add(d), true
		}
		reply, err = x.side.recv(ctx, deadline)
	}
	if ctx.Err() != nil {
		return nil, nil, errClientGone
	}
	if err != nil {
		x.res.Messages[idx].Reply = "error: " + err.Error()
		local, ferr := x.failure(ctx, err)
		return nil, local, ferr
	}
	if x.f.opts.OnReply != nil && idx < len(x.sentAt) {
		x.f.opts.OnReply(phase, time.Since(x.sentAt[idx]))
	}
	if ir := reply.GetImmediateResponse(); ir != nil {
		x.res.Messages[idx].Reply = "immediate_response"
		x.side.close()
		x.complete = true
		return nil, x.immediate(ir), nil
	}
	if !replyMatches(reply, phase) {
		err := fmt.Errorf("%w: %s reply to a %s message", ErrSpurious, replyKind(reply), phase)
		x.res.Messages[idx].Reply = "spurious"
		local, ferr := x.failure(ctx, err)
		return nil, local, ferr
	}
	x.res.Messages[idx].Reply = "continue"
	if mo := reply.GetModeOverride(); mo != nil && (phase == PhaseRequestHeaders || phase == PhaseResponseHeaders) {
		if x.overrideAllowed() && x.applyOverride(mo) {
			x.res.Messages[idx].Reply = "mode_override"
		} else {
			x.res.Messages[idx].Reply = "mode_override_ignored"
		}
	}
	if x.f.opts.CloseStreamEarly && x.lastReply(phase, x.res.Messages[idx]) {
		x.side.close()
		x.complete = true
		x.res.ClosedEarlyAfter = phase
	}
	return reply, nil, nil
}

// lastReply reports whether, after this reply, no later phase needs the
// server, as Filter::closeGrpcStreamIfLastRespReceived decides (ext_proc.cc,
// 1.37+): after the request headers when the request has no body (or its
// body mode is NONE and no trailers are sent) and the response direction
// sends nothing; after the last request body or the request trailers when
// the response direction sends nothing; after the response headers when the
// response has no body (or body NONE and no trailers); after the last
// response body; after the response trailers. isLastBodyResponse is false
// in BUFFERED and BUFFERED_PARTIAL ("skip stream closing optimization for
// BUFFERED and BUFFERED_PARTIAL for now") and true for the STREAMED chunk
// that ends the stream. The response direction "sends nothing" as
// EncodingProcessorState::noExternalProcess (processor_state.h) says:
// !send_headers_ && !send_trailers_ && body_mode_ == NONE.
func (x *exchange) lastReply(phase Phase, m Message) bool {
	md := x.mode
	encodingIdle := !sendHeaders(md.GetResponseHeaderMode()) && md.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_NONE &&
		!sendTrailers(md.GetResponseTrailerMode())
	lastBody := func(mode extprocfilterv3.ProcessingMode_BodySendMode) bool {
		return mode == extprocfilterv3.ProcessingMode_STREAMED && m.EndOfStream
	}
	switch phase {
	case PhaseRequestHeaders:
		return (m.EndOfStream || md.GetRequestBodyMode() == extprocfilterv3.ProcessingMode_NONE && !sendTrailers(md.GetRequestTrailerMode())) &&
			encodingIdle
	case PhaseRequestBody:
		return lastBody(md.GetRequestBodyMode()) && encodingIdle
	case PhaseRequestTrailers:
		return encodingIdle
	case PhaseResponseHeaders:
		return m.EndOfStream || md.GetResponseBodyMode() == extprocfilterv3.ProcessingMode_NONE && !sendTrailers(md.GetResponseTrailerMode())
	case PhaseResponseBody:
		return lastBody(md.GetResponseBodyMode())
	case PhaseResponseTrailers:
		return true
	}
	return false
}

func (x *exchange) messageTimeout() time.Duration {
	if d := x.f.cfg.GetMessageTimeout(); d != nil {
		return d.AsDuration()
	}
	return DefaultMessageTimeout
}

func (x *exchange) statusOnError() int {
	if c := int(x.f.cfg.GetStatusOnError().GetCode()); c >= 400 && c <= 599 {
		return c
	}
	return 500
}

// failure handles a failed side stream: a server that closed with OK, or
// failure_mode_allow, lets the request continue unprocessed; otherwise the
// request fails closed (504 for a message timeout, status_on_error else).
func (x *exchange) failure(ctx context.Context, err error) (*Response, error) {
	if ctx.Err() != nil {
		return nil, errClientGone
	}
	x.side.close()
	x.complete = true
	if errors.Is(err, errServerClosed) {
		return nil, nil
	}
	x.res.ProcessingError = err
	if x.f.cfg.GetFailureModeAllow() {
		return nil, nil
	}
	if errors.Is(err, errMessageTimeout) {
		return x.errorReply(504, "ext_proc_error_per-message_timeout_exceeded"), nil
	}
	if st, ok := status.FromError(err); ok && st.Code() != 0 && !errors.Is(err, ErrSpurious) {
		// Filter::onGrpcError: "%s_gRPC_error_%i{%s}" with ErrorPrefix
		// "ext_proc_error" and the status message, spaces then replaced by
		// "_" in sendImmediateResponse.
		return x.errorReply(x.statusOnError(),
			spaceless("ext_proc_error_gRPC_error_"+strconv.Itoa(int(st.Code()))+"{"+st.Message()+"}")), nil
	}
	return x.errorReply(x.statusOnError(), err.Error()), nil
}

func (x *exchange) errorReply(code int, details string) *Response {
	if x.isGRPC() {
		return grpcLocalReply(code, nil, nil, nil, details)
	}
	return &Response{Status: code, Details: details}
}

// immediate builds the local reply for an immediate_response
// (Filter::sendImmediateResponse).
func (x *exchange) immediate(ir *extprocv3.ImmediateResponse) *Response {
	code := int(ir.GetStatus().GetCode())
	if code < 200 {
		code = 200
	}
	if x.isGRPC() {
		headers := []Header{{":status", strconv.Itoa(code)}}
		if m := ir.GetHeaders(); m != nil {
			var err error
			if headers, err = x.applyMutation(headers, m); err != nil {
				x.res.ProcessingError = err
			}
		}
		var gs *uint32
		if g := ir.GetGrpcStatus(); g != nil {
			v := g.GetStatus()
			gs = &v
		}
		return grpcLocalReply(code, withoutPseudo(headers), ir.GetBody(), gs, ir.GetDetails())
	}
	// Utility::prepareLocalReply (http/utility.cc): the map starts with
	// :status, the filter's modify_headers (the immediate response's
	// mutation) runs on it, and only then are content-length and
	// content-type settled: set from the body when there is one (a
	// content-type the mutation set is kept), removed when it is empty,
	// whatever the mutation put there.
	headers := []Header{{":status", strconv.Itoa(code)}}
	if m := ir.GetHeaders(); m != nil {
		var err error
		// Filter::sendImmediateResponse only logs a failed mutation
		// ("Immediate response mutations failed with"); what it applied
		// before failing stays.
		if headers, err = x.applyMutation(headers, m); err != nil {
			x.res.ProcessingError = err
		}
	}
	headers = prepareLocalReply(headers, ir.GetBody())
	// sendImmediateResponse: StringUtil::replaceAllEmptySpace(details).
	return &Response{Status: code, Headers: withoutPseudo(headers), Body: ir.GetBody(), Details: spaceless(ir.GetDetails())}
}

// prepareLocalReply settles a non-gRPC local reply's content headers as
// Utility::prepareLocalReply does after modify_headers: with a body,
// content-length is the body's and content-type text/plain unless one is
// set; without, both are removed.
func prepareLocalReply(headers []Header, body []byte) []Header {
	if len(body) == 0 {
		return remove(remove(headers, "content-length"), "content-type")
	}
	headers = append(remove(headers, "content-length"), Header{"content-length", strconv.Itoa(len(body))})
	if _, ok := Get(headers, "content-type"); !ok {
		headers = append(headers, Header{"content-type", "text/plain"})
	}
	return headers
}

func replyMatches(r *extprocv3.ProcessingResponse, phase Phase) bool {
	switch phase {
	case PhaseRequestHeaders:
		return r.GetRequestHeaders() != nil
	case PhaseRequestBody:
		return r.GetRequestBody() != nil
	case PhaseRequestTrailers:
		return r.GetRequestTrailers() != nil
	case PhaseResponseHeaders:
		return r.GetResponseHeaders() != nil
	case PhaseResponseBody:
		return r.GetResponseBody() != nil
	case PhaseResponseTrailers:
		return r.GetResponseTrailers() != nil
	}
	return false
}

func replyKind(r *extprocv3.ProcessingResponse) string {
	switch r.GetResponse().(type) {
	case nil:
		return "empty"
	case *extprocv3.ProcessingResponse_RequestHeaders:
		return "request_headers"
	case *extprocv3.ProcessingResponse_RequestBody:
		return "request_body"
	case *extprocv3.ProcessingResponse_RequestTrailers:
		return "request_trailers"
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		return "response_headers"
	case *extprocv3.ProcessingResponse_ResponseBody:
		return "response_body"
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		return "response_trailers"
	}
	return fmt.Sprintf("%T", r.GetResponse())
}

func (x *exchange) overrideAllowed() bool {
	c := x.f.cfg
	full := extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	return c.GetAllowModeOverride() && !c.GetSendBodyWithoutWaitingForHeaderResponse() &&
		c.GetProcessingMode().GetRequestBodyMode() != full && c.GetProcessingMode().GetResponseBodyMode() != full
}

// applyOverride merges an override into the filter-level mode as
// effectiveModeOverride does, checks allowed_override_modes, and applies it
// to both directions. It reports whether the override took effect.
func (x *exchange) applyOverride(o *extprocfilterv3.ProcessingMode) bool {
	base := x.f.cfg.GetProcessingMode()
	m := proto.Clone(base).(*extprocfilterv3.ProcessingMode)
	if m == nil {
		m = &extprocfilterv3.ProcessingMode{}
	}
	if o.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.RequestHeaderMode = o.GetRequestHeaderMode()
	}
	if o.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.ResponseHeaderMode = o.GetResponseHeaderMode()
	}
	if o.GetRequestTrailerMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.RequestTrailerMode = o.GetRequestTrailerMode()
	}
	if o.GetResponseTrailerMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.ResponseTrailerMode = o.GetResponseTrailerMode()
	}
	m.RequestBodyMode = o.GetRequestBodyMode()
	m.ResponseBodyMode = o.GetResponseBodyMode()
	if allowed := x.f.cfg.GetAllowedOverrideModes(); len(allowed) > 0 {
		ok := false
		for _, a := range allowed {
			ok = ok || (a.GetResponseHeaderMode() == m.GetResponseHeaderMode() &&
				a.GetRequestBodyMode() == m.GetRequestBodyMode() && a.GetResponseBodyMode() == m.GetResponseBodyMode() &&
				a.GetRequestTrailerMode() == m.GetRequestTrailerMode() && a.GetResponseTrailerMode() == m.GetResponseTrailerMode())
		}
		if !ok {
			return false
		}
	}
	x.mode = m
	return true
}

func (x *exchange) metadataContext() *corev3.Metadata {
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	for _, ns := range x.f.cfg.GetMetadataOptions().GetForwardingNamespaces().GetUntyped() {
		if s, ok := x.req.DynamicMetadata[ns]; ok {
			md.FilterMetadata[ns] = s
		}
	}
	return md
}

// addAttributes puts the configured attributes on the first message of
// each direction (Filter::addAttributes).
func (x *exchange) addAttributes(pr *extprocv3.ProcessingRequest, phase Phase) {
	var names []string
	var sent *bool
	if phase <= PhaseRequestTrailers {
		names, sent = x.f.cfg.GetRequestAttributes(), &x.reqAttrsSent
	} else {
		names, sent = x.f.cfg.GetResponseAttributes(), &x.respAttrsSent
	}
	if *sent || len(names) == 0 {
		return
	}
	*sent = true
	fields := map[string]*structpb.Value{}
	for _, n := range names {
		if v := x.attribute(n); v != nil {
			fields[n] = v
		}
	}
	pr.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: fields}}
}

// attribute evaluates one attribute name as Envoy's CEL context does
// (source/extensions/filters/common/expr/context.h names, context.cc
// values). Only names that context defines are answered; any other name
// (source.principal, a typo) evaluates to an error, which
// ExpressionManager::evaluateAttributes (ext_proc matching_utils.cc) skips:
// it is left out of the message, as is a defined name with no value.
// Strings travel as strings, int64 and uint64 as numbers, bools as bools.
func (x *exchange) attribute(name string) *structpb.Value {
	r := x.req
	str := func(s string) *structpb.Value { return structpb.NewStringValue(s) }
	opt := func(s string) *structpb.Value {
		if s == "" {
			return nil
		}
		return structpb.NewStringValue(s)
	}
	first := func(vs []string) *structpb.Value {
		if len(vs) == 0 {
			return nil // SslExtractorsValues: an empty SAN list has no value
		}
		return structpb.NewStringValue(vs[0])
	}
	cert := r.PeerCertificate
	switch name {
	// RequestLookupValues: header-backed values are absent without the header.
	case "request.method":
		return opt(r.Method)
	case "request.path":
		return opt(r.Path)
	case "request.url_path":
		p, _, _ := strings.Cut(r.Path, "?")
		return opt(p)
	case "request.query":
		_, q, _ := strings.Cut(r.Path, "?")
		q, _, _ = strings.Cut(q, "#")
		return str(q)
	case "request.host":
		return opt(r.Authority)
	case "request.scheme":
		return opt(get(x.reqHeaders, ":scheme"))
	case "request.id":
		return opt(get(x.reqHeaders, "x-request-id"))
	case "request.useragent":
		return opt(get(x.reqHeaders, "user-agent"))
	case "request.referer":
		return opt(get(x.reqHeaders, "referer"))
	// ResponseLookupValues: only in the response direction.
	case "response.code":
		if x.respStatus == 0 {
			return nil
		}
		return structpb.NewNumberValue(float64(x.respStatus))
	case "response.code_details":
		return opt(x.respDetails)
	case "response.flags":
		if x.respStatus == 0 {
			return nil
		}
		return structpb.NewNumberValue(float64(x.respFlags))
	// PeerWrapper: the downstream remote address.
	case "source.address":
		return opt(r.RemoteAddress)
	case "source.port":
		_, port, err := net.SplitHostPort(r.RemoteAddress)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			return nil
		}
		return structpb.NewNumberValue(float64(n))
	// ConnectionLookupValues and SslExtractorsValues: without TLS (or a
	// client certificate) there is no SSL connection info and no value.
	case "connection.mtls":
		return structpb.NewBoolValue(cert != nil)
	case "connection.uri_san_peer_certificate":
		if cert == nil {
			return nil
		}
		return first(cert.URISANs)
	case "connection.dns_san_peer_certificate":
		if cert == nil {
			return nil
		}
		return first(cert.DNSSANs)
	case "connection.subject_peer_certificate":
		if cert == nil {
			return nil
		}
		return str(cert.Subject)
	// XDSLookupValues: route_name is the route's name, "" when unnamed.
	case "xds.route_name":
		return str(r.RouteName)
	}
	return nil
}

// connectionManagerHeaders builds the request header map as the connection
// manager hands it to the filter (ConnectionManagerUtility::
// mutateRequestHeaders, http/conn_manager_utility.cc): pseudo-headers, the
// client's headers, then x-forwarded-proto and a fresh x-request-id unless
// the client sent them. At an edge (Options.Edge: use_remote_address with no
// trusted hops, an external client) the client's x-forwarded-proto is
// overwritten with the connection's scheme, and its x-request-id replaced
// unless preserve_external_request_id.
func connectionManagerHeaders(r *Request, opts Options) []Header {
	scheme := r.Scheme
	if scheme == "" {
		scheme = "http"
	}
	hs := make([]Header, 0, len(r.Headers)+6)
	hs = append(hs, Header{":authority", r.Authority}, Header{":path", r.Path}, Header{":method", r.Method}, Header{":scheme", scheme})
	hs = append(hs, r.Headers...)
	if opts.Edge {
		hs = remove(hs, "x-forwarded-proto")
		if !opts.PreserveExternalRequestID {
			hs = remove(hs, "x-request-id")
		}
	}
	if _, ok := Get(hs, "x-forwarded-proto"); !ok {
		hs = append(hs, Header{"x-forwarded-proto", scheme})
	}
	if _, ok := Get(hs, "x-request-id"); !ok {
		hs = append(hs, Header{"x-request-id", newRequestID()})
	}
	return hs
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func toHeaderMap(hs []Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(hs))}
	for _, h := range hs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: h.Name, RawValue: []byte(h.Value)})
	}
	return m
}

func get(hs []Header, name string) string {
	v, _ := Get(hs, name)
	return v
}

func withoutPseudo(hs []Header) []Header {
	out := make([]Header, 0, len(hs))
	for _, h := range hs {
		if len(h.Name) == 0 || h.Name[0] != ':' {
			out = append(out, h)
		}
	}
	return out
}

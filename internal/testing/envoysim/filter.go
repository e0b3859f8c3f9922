package envoysim

import (
	"context"
	"errors"
	"strconv"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
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
	// InternalClient makes the connection manager count the client as
	// internal (its address in internal_address_config), so that it keeps
	// the client's x-envoy-* retry headers; by default, as in Envoy 1.33+,
	// no client is internal and they are removed (retryHeaders).
	InternalClient bool
	// CloseStreamEarly selects Envoy 1.37+, which closes the gRPC stream as
	// soon as a reply leaves no later phase that needs the server
	// (ext_proc.cc Filter::closeGrpcStreamIfLastRespReceived, runtime
	// envoy.reloadable_features.ext_proc_stream_close_optimization).
	CloseStreamEarly bool
	// Routes, when set, is the route configuration: the connection manager
	// selects each request's route from them (its name replaces
	// Request.RouteName), and a filter may clear the route so that the
	// router selects it again from the mutated headers (routecache.go).
	Routes []Route
	// InternalOnlyHeaders is the route configuration's
	// internal_only_headers: removed from every client not counted internal
	// before the filters and the route selection (routecache.go).
	InternalOnlyHeaders []string
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

// RecommendedConfig is the filter configuration docs/design.md §7 recommends:
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
		ResponseAttributes: []string{"response.code_details", "response.flags", "upstream.request_attempt_count"},
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
	// routing is the request's route cache (routecache.go).
	routing routing
	// attempts is StreamInfo::attemptCount(): the router's attempts, 0
	// before the first (router.go).
	attempts int
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
	x.reqHeaders = cleanInternalOnly(connectionManagerHeaders(req, f.opts), f.opts)
	x.startRouting()
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
	headers, body, trailers, local, err := x.request(ctx)
	if err != nil || local != nil {
		return local, err
	}
	return x.route(ctx, up, headers, body, trailers)
}

// request runs the request phases: in FULL_DUPLEX_STREAMED one exchange,
// otherwise headers, body and trailers in turn, each skipped once
// processing is complete. It returns the request as the router gets it,
// or the local reply that ends the exchange.
func (x *exchange) request(ctx context.Context) (headers []Header, body []byte, trailers []Header, local *Response, err error) {
	headers, body, trailers = x.reqHeaders, x.req.Body, x.req.Trailers
	hasBody := len(body) > 0

	// FULL_DUPLEX_STREAMED: headers, body and trailers in one exchange.
	duplexReq := fullDuplex(x.mode.GetRequestBodyMode()) && !x.complete
	if duplexReq {
		if headers, body, trailers, local, err = x.duplex(ctx, true, headers, body, trailers); err != nil || local != nil {
			return headers, body, trailers, local, err
		}
	}
	if headers, local, err = x.requestHeaders(ctx, headers, !hasBody && len(trailers) == 0, duplexReq); err != nil || local != nil {
		return headers, body, trailers, local, err
	}
	if err := x.clientGoneAfter(PhaseRequestHeaders); err != nil {
		return headers, body, trailers, nil, err
	}

	// Request body.
	if !duplexReq && hasBody && !x.complete {
		if headers, body, local, err = x.requestBody(ctx, headers, body, len(trailers) > 0); err != nil || local != nil {
			return headers, body, trailers, local, err
		}
	}
	if err := x.clientGoneAfter(PhaseRequestBody); err != nil {
		return headers, body, trailers, nil, err
	}

	// Request trailers.
	if !duplexReq && len(trailers) > 0 && sendTrailers(x.mode.GetRequestTrailerMode()) && !x.complete {
		pr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
			RequestTrailers: &extprocv3.HttpTrailers{Trailers: toHeaderMap(trailers)},
		}}
		if _, local, err = x.call(ctx, pr, PhaseRequestTrailers); err != nil || local != nil {
			return headers, body, trailers, local, err
		}
	}
	if err := x.clientGoneAfter(PhaseRequestTrailers); err != nil {
		return headers, body, trailers, nil, err
	}
	return headers, body, trailers, nil, nil
}

// requestHeaders runs the request headers phase (none in
// FULL_DUPLEX_STREAMED, whose exchange sent them), removing content-length
// as Envoy does.
func (x *exchange) requestHeaders(ctx context.Context, headers []Header, endOfStream, duplexReq bool) ([]Header, *Response, error) {
	stripCL := !duplexReq && shouldRemoveContentLength(x.mode.GetRequestBodyMode(), x.mode.GetRequestHeaderMode())
	if !duplexReq && sendHeaders(x.mode.GetRequestHeaderMode()) && !x.complete {
		pr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: toHeaderMap(headers), EndOfStream: endOfStream},
		}}
		reply, local, err := x.call(ctx, pr, PhaseRequestHeaders)
		if err != nil {
			return headers, nil, err
		}
		if local != nil {
			return headers, local, nil
		}
		if stripCL {
			// Removed as onHeaders returns, before the reply (and any
			// mode override in it) is applied.
			headers = remove(headers, "content-length")
		}
		if reply != nil {
			if headers, local = x.mutate(headers, reply.GetRequestHeaders().GetResponse()); local != nil {
				return headers, local, nil
			}
			x.clearRouteCache(PhaseRequestHeaders, reply.GetRequestHeaders().GetResponse())
		}
	} else if stripCL && !x.complete {
		headers = remove(headers, "content-length")
	}
	return headers, nil, nil
}

// route sends the request to the upstream as the router does, and runs the
// response phases on its answer, or on the local reply Envoy makes when the
// upstream fails.
func (x *exchange) route(ctx context.Context, up Upstream, headers []Header, body []byte, trailers []Header) (*Response, error) {
	req := x.req
	upReq := &Request{
		Method: get(headers, ":method"), Path: get(headers, ":path"), Authority: get(headers, ":authority"),
		Scheme: get(headers, ":scheme"), Headers: withoutPseudo(headers), Body: body, Trailers: trailers,
		RouteName: req.RouteName, PeerCertificate: req.PeerCertificate, RemoteAddress: req.RemoteAddress,
	}
	up, found := x.routed(headers, up, upReq)
	if !found {
		return x.localReply(ctx, RouteNotFound)
	}
	x.res.UpstreamCalled, x.res.UpstreamRequest = true, upReq
	start := time.Now()
	end, err := x.runAttempts(ctx, up, upReq)
	x.res.UpstreamAttempts = x.attempts
	if end.filter {
		// A decoder filter after ext_proc answered: the router never ran.
		x.res.UpstreamCalled, x.res.UpstreamRequest = false, nil
	}
	if err != nil || ctx.Err() != nil {
		// The downstream went away while the upstream worked: Envoy resets
		// the whole stream, with no local reply to pass through the filter.
		return nil, errClientGone
	}
	if err := x.clientGoneAfter(PhaseUpstream); err != nil {
		return nil, err
	}
	if end.failure != nil {
		uf := end.failure
		if x.attempts > 1 {
			uf = retriedBody(uf)
		}
		return x.localReply(ctx, uf)
	}
	resp := end.resp
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

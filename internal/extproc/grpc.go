package extproc

import (
	"context"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// rpcState is what a stream knows about gRPC calls and about the body modes
// in which every body must be sent back to the client.
//
// Two clients send gRPC calls: Envoy, with pseudo-headers and a
// content-type of application/grpc, and grpc-go's own ext_proc filter
// (gRFC A93, "proxyless"), which sends only the call's metadata and names
// the method, path and authority in request_attributes.
//
// In the GRPC body mode (grpc-go) and FULL_DUPLEX_STREAMED (Envoy) the
// client drains every body message it sends and forwards only what the
// server sends back as streamed_response mutations, in any number of
// replies (external_processor.proto, StreamedBodyResponse; Envoy
// processor_state.cc handleDuplexStreamedBodyResponse; grpc-go
// internal/xds/httpfilter/extproc requestForwardingToDataplaneLoop). That
// lets the server hold a protected request whole: it withholds the headers
// reply and every body echo until the key is reserved, so the upstream sees
// nothing of the call before the reservation, and it withholds the
// response's echoes until the outcome is stored, so a client that has the
// answer and retries at once finds it recorded. The proto allows this
// explicitly: the server "may also choose to buffer the entire message,
// including the headers ... before sending back any response".
type rpcState struct {
	// call: the request is a gRPC call, so the server's own answers are
	// gRPC statuses and its outcome comes from grpc-status.
	call bool
	// proxyless: grpc-go's filter. It reports no gRPC status to ext_proc
	// (grpc-status is not part of the trailer metadata it forwards), so the
	// outcome is inferred: see settleRPC.
	proxyless bool
	// response: the response is a gRPC response (its status decides).
	response bool
	origin   idem.Origin
	// retried: an earlier upstream attempt may have been sent.
	retried bool
	// messages counts response messages.
	messages int

	// held are replies withheld until the decision, in order.
	held []*extprocv3.ProcessingResponse
	// headersHeld: held starts with the request headers reply.
	headersHeld bool
	// Flow control (grpc-go only, from flow_control_init): the client
	// stops sending body messages once it has sent a window's worth the
	// server has not acknowledged with a server_window_update.
	flow      bool
	reqWindow int64
	reqUnack  int64
}

// echoes reports whether a body mode makes the client forward only what the
// server sends back.
func echoes(m procmodev3.ProcessingMode_BodySendMode) bool {
	return m == procmodev3.ProcessingMode_GRPC || m == procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// targetHeaders are the request headers requestTarget keeps, in one copy.
var targetHeaders = [...]string{":method", ":path", ":authority", "x-request-id"}

// requestTarget reads the request's method, path and authority (and its
// x-request-id, into the attempt, in the same copy), and learns
// what kind of client sent it. Envoy sends pseudo-headers; grpc-go sends
// none, and the request_attributes request.method, request.path and
// request.host carry them instead (a gRPC call is always a POST).
func (p *processor) requestTarget(req *extprocv3.ProcessingRequest, hs *corev3.HeaderMap, attrs *structpb.Struct) (method, authority string) {
	var v [len(targetHeaders)]string
	found := copyHeaders(hs, targetHeaders[:], v[:])
	method, authority, p.att.RequestID = v[0], v[2], v[3]
	path := v[1]
	p.rpc.proxyless = found&0b11 == 0 // neither :method nor :path
	if p.rpc.proxyless {
		method, path, authority = attrString(attrs, "request.method"), attrString(attrs, "request.path"), attrString(attrs, "request.host")
		if method == "" {
			method = "POST"
		}
	}
	p.path = path
	ct, _ := headerBytes(hs, "content-type")
	p.rpc.call = p.rpc.proxyless || isGRPCContentType(string(ct)) || p.requestBodyMode == procmodev3.ProcessingMode_GRPC
	if fc := req.GetFlowControlInit(); fc != nil && fc.GetInitialWindowDownstreamToSidestream() > 0 {
		p.rpc.flow, p.rpc.reqWindow = true, fc.GetInitialWindowDownstreamToSidestream()
	}
	return method, authority
}

func isGRPCContentType(ct string) bool {
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
}

// awaitRequestBody is the request headers phase of a protected request
// with a body still to come. In the echo modes the headers reply is
// withheld; grpc-go without a request body mode sends no body at all, so
// the call is decided on its headers (its fingerprint then lacks the
// message). It reports false when the usual handling applies.
func (p *processor) awaitRequestBody(ctx context.Context, req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, bool) {
	switch {
	case p.rpc.proxyless && p.requestBodyMode == procmodev3.ProcessingMode_NONE:
		return p.decide(ctx, req), true
	case echoes(p.requestBodyMode):
		p.rpc.held = append(p.rpc.held, continueFor(req))
		p.rpc.headersHeld = true
		return nil, true
	}
	return nil, false
}

// onStreamedRequestBody reads one body message of a protected request in
// an echo mode: it is fingerprinted and its echo withheld; the last one
// (end_of_stream, or the half-close that grpc-go sends as
// end_of_stream_without_message) decides.
func (p *processor) onStreamedRequestBody(ctx context.Context, req *extprocv3.ProcessingRequest, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if prob := p.takeRequestBody(body); prob != nil {
		return p.refuseUnread(ctx, req, prob, body.GetBody())
	}
	if body.GetEndOfStream() {
		return p.decide(ctx, req)
	}
	p.rpc.held = append(p.rpc.held, p.echo(req))
	if !p.rpc.flow {
		return nil
	}
	// grpc-go sends no more request messages once a window's worth is
	// unacknowledged, and it reads no window update before the headers
	// reply. A call that large (a client stream of more than 64 KiB by
	// default) therefore gets its headers reply now: the upstream sees the
	// call open, but still none of its messages before the reservation.
	p.rpc.reqUnack += int64(len(body.GetBody()))
	if p.rpc.reqUnack < p.rpc.reqWindow {
		return nil
	}
	if p.rpc.headersHeld {
		if err := p.send(p.rpc.held[0]); err != nil {
			return nil
		}
		p.rpc.held, p.rpc.headersHeld = p.rpc.held[1:], false
	}
	n := p.rpc.reqUnack
	p.rpc.reqUnack = 0
	return &extprocv3.ProcessingResponse{ServerWindowUpdate: &extprocv3.ProcessingResponse_ServerWindowUpdate{
		WindowIncrementDownstreamToSidestream: n,
	}}
}

// cont lets the message go on: it first sends every withheld reply, then
// answers the message itself with CONTINUE, or in an echo mode with its
// body sent back.
func (p *processor) cont(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	for i, r := range p.rpc.held {
		if err := p.send(r); err != nil {
			p.rpc.held = p.rpc.held[i:]
			return nil
		}
	}
	p.rpc.held, p.rpc.headersHeld = nil, false
	return p.echo(req)
}

// echo answers a message with CONTINUE; a body message in an echo mode is
// answered with its body sent back unchanged as a streamed_response (a
// reply without one fails the call in grpc-go and is spurious to Envoy).
func (p *processor) echo(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	resp := continueFor(req)
	var body *extprocv3.HttpBody
	var br *extprocv3.BodyResponse
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestBody:
		if !echoes(p.requestBodyMode) {
			return resp
		}
		body, br = r.RequestBody, resp.GetRequestBody()
	case *extprocv3.ProcessingRequest_ResponseBody:
		if !echoes(p.responseBodyMode) {
			return resp
		}
		body, br = r.ResponseBody, resp.GetResponseBody()
	default:
		return resp
	}
	br.Response = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
			Body:                      body.GetBody(),
			EndOfStream:               body.GetEndOfStream(),
			EndOfStreamWithoutMessage: body.GetEndOfStreamWithoutMessage(),
			GrpcMessageCompressed:     body.GetGrpcMessageCompressed(),
		}},
	}}
	return resp
}

package extproc

import (
	"context"
	"encoding/binary"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

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
	// outcome is inferred: see settleResponse.
	proxyless bool
	// response: the response is a gRPC response (its status decides).
	response bool
	origin   idem.Origin
	// retried: an earlier upstream attempt may have been sent.
	retried bool
	// messages counts response messages.
	messages int

	// held are replies withheld until the decision, in order; release
	// says which of them go out ahead of the reply to the current message.
	held []*extprocv3.ProcessingResponse
	// headersHeld: held starts with the request headers reply.
	headersHeld bool
	release     release
	// Flow control (grpc-go only, from flow_control_init): the client
	// stops sending body messages once it has sent a window's worth the
	// server has not acknowledged with a server_window_update.
	flow      bool
	reqWindow int64
	reqUnack  int64
}

// release is which withheld replies the stream loop sends next.
type release uint8

const (
	releaseNone  release = iota
	releaseFirst         // the request headers reply only (flow control)
	releaseAll
)

// hold withholds a reply until the decision.
func (r *rpcState) hold(resp *extprocv3.ProcessingResponse) { r.held = append(r.held, resp) }

// releaseAll lets every withheld reply go, ahead of the reply to the
// current message; the stream loop sends them (released).
func (r *rpcState) releaseAll() {
	r.release, r.headersHeld = releaseAll, false
}

// released returns the withheld replies to send now, in order, and
// forgets them.
func (r *rpcState) released() []*extprocv3.ProcessingResponse {
	n := 0
	switch r.release {
	case releaseNone:
		return nil
	case releaseFirst:
		n = 1
	case releaseAll:
		n = len(r.held)
	}
	out := r.held[:n]
	r.held, r.release = r.held[n:], releaseNone
	if len(r.held) == 0 {
		r.held = nil
	}
	return out
}

// onStreamedRequestBody reads one body message of a protected request in
// an echo mode: it is fingerprinted and its echo withheld; the last one
// (end_of_stream, or the half-close that grpc-go sends as
// end_of_stream_without_message) decides.
func (p *processor) onStreamedRequestBody(ctx context.Context, body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	if prob := p.takeRequestBody(body); prob != nil {
		return p.refuseUnread(ctx, prob, body.GetBody())
	}
	if body.GetEndOfStream() {
		return p.decide(ctx)
	}
	p.rpc.hold(p.echo())
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
		p.rpc.release, p.rpc.headersHeld = releaseFirst, false
	}
	n := p.rpc.reqUnack
	p.rpc.reqUnack = 0
	return &extprocv3.ProcessingResponse{ServerWindowUpdate: &extprocv3.ProcessingResponse_ServerWindowUpdate{
		WindowIncrementDownstreamToSidestream: n,
	}}
}

// frameHeaderLen is a gRPC frame's prefix: the compressed flag and the
// message length (gRPC's PROTOCOL-HTTP2.md, Length-Prefixed-Message).
const frameHeaderLen = 5

func appendFrame(dst, msg []byte, compressed bool) []byte {
	var prefix [frameHeaderLen]byte
	if compressed {
		prefix[0] = 1
	}
	binary.BigEndian.PutUint32(prefix[1:], uint32(len(msg)))
	return append(append(dst, prefix[:]...), msg...)
}

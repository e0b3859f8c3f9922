package extproc

import (
	"encoding/binary"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
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
	// outcome is inferred: see responseEnd.
	proxyless bool
	// response: the response is a gRPC response (its status decides).
	response bool
	origin   idem.Origin
	// retried: an earlier upstream attempt may have been sent.
	retried bool
	// headersHeld: the request headers reply is withheld until the
	// decision; echo holds the body messages withheld with it, or the
	// response's until its outcome is stored. release says which of them
	// go out ahead of the reply to the current message. (The small fields
	// sit together: a processor is allocated per request.)
	headersHeld bool
	release     release
	// messages counts response messages.
	messages int
	echo     heldEcho
	// Flow control (grpc-go only, from flow_control_init; 0 without): the
	// client stops sending body messages once it has sent a window's worth
	// the server has not acknowledged with a server_window_update.
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

// withholds reports whether any reply is withheld.
func (r *rpcState) withholds() bool { return r.headersHeld || len(r.echo.body) > 0 }

// drop forgets every withheld reply: the request never goes on.
func (r *rpcState) drop() { r.headersHeld, r.echo = false, heldEcho{} }

// next returns the next withheld reply to send now, and forgets it; nil
// when none is left to send.
func (r *rpcState) next() *extprocv3.ProcessingResponse {
	if r.release == releaseNone {
		return nil
	}
	if r.headersHeld {
		r.headersHeld = false
		if r.release == releaseFirst {
			r.release = releaseNone
		}
		return continueWith(phaseRequestHeaders, nil)
	}
	if r.release == releaseAll {
		if resp := r.echo.next(); resp != nil {
			return resp
		}
	}
	r.release = releaseNone
	return nil
}

// heldEcho is a body whose echoes are withheld. It is kept as the bytes
// of its messages, not as one reply per message: a reply costs some
// hundreds of bytes of protobuf values whatever its body, so a body sent
// one byte per message would cost that much per byte held. body is the
// buffer the body is read into for the fingerprint or the record
// (processor.reqBody, respBody), shared, not copied.
//
// In FULL_DUPLEX_STREAMED, Envoy puts each streamed_response body into
// the filter chain as it comes, however many replies carry it, and only a
// reply with end_of_stream ends it (processor_state.cc
// ProcessorState::handleDuplexStreamedBodyResponse: a non-empty body is
// injectDataToFilterChain'ed, end_of_stream finishes the call): the
// replies need not match the messages, and the withheld bytes go back in
// replies of up to maxEchoBytes. In GRPC mode each reply is one gRPC
// message to grpc-go (external_processor.proto, StreamedBodyResponse), so
// the body is kept framed (keepChunk) and sent back one reply per
// message, as it came.
type heldEcho struct {
	body   []byte
	phase  phase
	framed bool
}

// maxEchoBytes bounds the body of one reply made of coalesced messages;
// a larger message is split. Envoy takes a streamed_response body of any
// size (handleDuplexStreamedBodyResponse), but the largest reply its gRPC
// client accepts was not read: replies stay far below the 4 MiB a grpc-go
// client accepts by default (clientconn.go,
// defaultClientMaxReceiveMessageSize). The bound leaves a reply, encoded,
// within 32 KiB, the largest of grpc-go's default buffer pool tiers below
// its 1 MiB one (mem/buffer_pool.go, defaultBufferPoolSizeExponents),
// which the codec takes a reply's buffer from (extprocwire.Codec.Marshal)
// and which clears a buffer's whole capacity as it hands it out
// (internal/mem/buffer_pool.go, sizedBufferPool.Get): replies of 64 KiB
// each wrote 1 MiB, and each reply queued for the connection held one.
// 256 bytes is room for the reply's other fields.
const maxEchoBytes = 32<<10 - 256

// next returns the reply that sends back the next part of the body, or
// nil when all of it went.
func (e *heldEcho) next() *extprocv3.ProcessingResponse {
	if len(e.body) == 0 {
		e.body = nil
		return nil
	}
	sr := &extprocv3.StreamedBodyResponse{}
	if e.framed {
		n := frameHeaderLen + int(binary.BigEndian.Uint32(e.body[1:frameHeaderLen]))
		sr.GrpcMessageCompressed, sr.Body, e.body = e.body[0] == 1, e.body[frameHeaderLen:n], e.body[n:]
	} else {
		n := min(len(e.body), maxEchoBytes)
		sr.Body, e.body = e.body[:n], e.body[n:]
	}
	return streamedReply(e.phase, sr)
}

// holdRequestEcho withholds the echo of a protected request's body message
// in an echo mode, until the decision.
func (p *processor) holdRequestEcho(body *extprocv3.HttpBody) *extprocv3.ProcessingResponse {
	p.rpc.echo = heldEcho{body: p.reqBody, phase: p.phase, framed: p.requestBodyMode == procmodev3.ProcessingMode_GRPC}
	if p.rpc.reqWindow == 0 {
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
	p.rpc.release = releaseFirst // the headers reply, if still held
	n := p.rpc.reqUnack
	p.rpc.reqUnack = 0
	return &extprocv3.ProcessingResponse{ServerWindowUpdate: &extprocv3.ProcessingResponse_ServerWindowUpdate{
		WindowIncrementDownstreamToSidestream: n,
	}}
}

// frameHeaderLen is a gRPC frame's prefix: the compressed flag and the
// message length (gRPC's PROTOCOL-HTTP2.md, Length-Prefixed-Message).
const frameHeaderLen = 5

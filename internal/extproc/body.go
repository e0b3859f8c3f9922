package extproc

import (
	"encoding/binary"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// The one body accumulator of both directions, for HTTP requests and gRPC
// calls in every body mode: what is kept, within which limits, and how a
// gRPC message is framed.

// takeRequestBody keeps a request body chunk for the fingerprint, or
// returns the problem to refuse the request with: 413 past the policy's
// max_request_body, or what the server's body budget says
// (bodyBudget.holdRequestBody).
// In GRPC mode each message is framed as gRPC does on the wire, so that
// message boundaries are part of the fingerprint; the half-close grpc-go
// sends as end_of_stream_without_message adds nothing.
func (p *processor) takeRequestBody(body *extprocv3.HttpBody) *problem.Problem {
	msg := body.GetBody()
	if len(p.reqBody)+len(msg) > p.att.Policy.MaxRequestBody {
		return attempt.BodyTooLarge(p.att.Policy.MaxRequestBody)
	}
	if prob := p.srv.budget.holdRequestBody(&p.held, len(p.reqBody), len(msg), p.att.Policy.RetryAfter); prob != nil {
		return prob
	}
	if p.requestBodyMode != procmodev3.ProcessingMode_GRPC {
		p.reqBody = append(p.reqBody, msg...)
	} else if !(body.GetEndOfStream() && body.GetEndOfStreamWithoutMessage()) {
		p.reqBody = appendFrame(p.reqBody, msg, body.GetGrpcMessageCompressed())
	}
	return nil
}

// storeResponseBytes keeps a response body chunk for the record, up to the
// policy's max_stored_body and within the server's body budget; past
// either the response is recorded without its body. grpc-go sends bare
// messages; in GRPC mode they are stored framed, as gRPC sends them on the
// wire and Envoy passes them. It counts the response's messages (a gRPC
// call's outcome may be inferred from them: settleResponse).
func (p *processor) storeResponseBytes(body *extprocv3.HttpBody) {
	p.rpc.messages++
	if p.respTooLarge {
		return
	}
	framed := p.responseBodyMode == procmodev3.ProcessingMode_GRPC
	n := len(body.GetBody())
	if framed {
		n += frameHeaderLen
	}
	if len(p.respBody)+n > p.att.Policy.MaxStoredBody || !p.srv.budget.hold(&p.held, n) {
		p.respTooLarge, p.respBody = true, nil
		p.srv.budget.release(&p.held)
		return
	}
	if framed {
		p.respBody = appendFrame(p.respBody, body.GetBody(), body.GetGrpcMessageCompressed())
	} else {
		p.respBody = append(p.respBody, body.GetBody()...)
	}
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

package envoysim

// The body phase: requestBody and responseBody dispatch by the body mode in
// force to the file of that mode: buffered.go (BUFFERED), partial.go
// (BUFFERED_PARTIAL), streamed.go (STREAMED); FULL_DUPLEX_STREAMED is
// duplex.go.

import (
	"context"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// requestBody runs the request body phase in the mode in force.
func (x *exchange) requestBody(ctx context.Context, headers []Header, body []byte, trailers bool) ([]Header, []byte, *Response, error) {
	switch x.mode.GetRequestBodyMode() {
	case extprocfilterv3.ProcessingMode_BUFFERED:
		if len(body) > x.f.opts.BufferLimit {
			local, err := x.localReply(ctx, &UpstreamFailure{Status: 413, Details: "request_payload_too_large", Body: "Payload Too Large"})
			return headers, body, local, err
		}
		return x.bufferedBody(ctx, headers, body, !trailers, PhaseRequestBody, true)
	case extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL:
		n, whole := x.partialCut(len(body))
		h, newPart, local, err := x.bufferedBody(ctx, headers, body[:n], whole && !trailers, PhaseRequestBody, false)
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
		return x.bufferedBody(ctx, headers, body, !trailers, PhaseResponseBody, true)
	case extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL:
		n, whole := x.partialCut(len(body))
		h, newPart, local, err := x.bufferedBody(ctx, headers, body[:n], whole && !trailers, PhaseResponseBody, false)
		return h, append(newPart, body[n:]...), local, err
	case extprocfilterv3.ProcessingMode_STREAMED:
		return x.streamedBody(ctx, headers, body, trailers, PhaseResponseBody)
	}
	return headers, body, nil, nil
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

package envoysim

import (
	"context"
	"errors"
	"strconv"
)

// bufferedBody sends the body as one message; the headers are still held,
// so the body reply may mutate them too. In BUFFERED (checkLength) a body
// mutation whose body field's size differs from a content-length the held
// headers still carry, after the reply's own header mutation, fails the
// stream ("mismatch between content length and the length of the mutated
// body"); a clear_body mutation is measured the same way, as 0.
// BUFFERED_PARTIAL applies it to the chunk unchecked (processor_state.cc
// ProcessorState::handleBufferedBodyCallback and
// ProcessorState::validateContentLength, which compares
// common_response.body_mutation().body().size() and skips a content-length
// absl::SimpleAtoi cannot read as an unsigned size).
func (x *exchange) bufferedBody(ctx context.Context, headers []Header, body []byte, eos bool, phase Phase, checkLength bool) ([]Header, []byte, *Response, error) {
	reply, local, err := x.call(ctx, bodyRequest(phase, body, eos), phase)
	if err != nil || local != nil || reply == nil {
		return headers, body, local, err
	}
	cr := bodyReply(phase, reply)
	if headers, local = x.mutate(headers, cr); local != nil {
		return headers, body, local, nil
	}
	x.clearRouteCache(phase, cr)
	m := cr.GetBodyMutation()
	if checkLength && m != nil {
		if cl, ok := Get(headers, "content-length"); ok {
			if n, err := strconv.ParseUint(cl, 10, 64); err == nil && n != uint64(len(m.GetBody())) {
				return headers, body, x.failedReply(errors.New("mismatch between content length and the length of the mutated body")), nil
			}
		}
	}
	return headers, mutateBody(body, m), nil, nil
}

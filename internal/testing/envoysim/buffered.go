package envoysim

import (
	"context"
)

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

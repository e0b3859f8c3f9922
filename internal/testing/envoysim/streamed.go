package envoysim

import (
	"context"
)

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

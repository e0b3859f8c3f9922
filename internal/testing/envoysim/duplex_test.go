package envoysim

import (
	"context"
	"errors"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

func duplexConfig() *extprocfilterv3.ExternalProcessor {
	cfg := RecommendedConfig()
	cfg.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	cfg.ProcessingMode.ResponseBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	cfg.ProcessingMode.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
	cfg.ProcessingMode.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
	return cfg
}

func streamed(m *extprocv3.ProcessingRequest, body string, eos bool) *extprocv3.ProcessingResponse {
	r := cont(m)
	cr := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(body), EndOfStream: eos}}}}
	if b := r.GetRequestBody(); b != nil {
		b.Response = cr
	} else {
		r.GetResponseBody().Response = cr
	}
	return r
}

// TestFullDuplexForwardsOnlyWhatComesBack: the headers and every chunk are
// sent before any reply (the server here reads them all first), and the
// upstream gets only the bodies the server sends back, in any number of
// replies.
func TestFullDuplexForwardsOnlyWhatComesBack(t *testing.T) {
	s := &scripted{script: func(st extprocv3.ExternalProcessor_ProcessServer) error {
		var reqs []*extprocv3.ProcessingRequest
		for range 4 { // headers and three chunks, none answered yet
			m, err := st.Recv()
			if err != nil {
				return nil
			}
			reqs = append(reqs, m)
		}
		_ = st.Send(cont(reqs[0]))
		_ = st.Send(streamed(reqs[1], "AB", false))
		_ = st.Send(streamed(reqs[1], "CD", false))
		_ = st.Send(streamed(reqs[1], "", true))
		for {
			m, err := st.Recv()
			if err != nil {
				return nil
			}
			if b := m.GetResponseBody(); b != nil {
				_ = st.Send(streamed(m, strings.ToUpper(string(b.GetBody())), b.GetEndOfStream()))
				continue
			}
			_ = st.Send(cont(m))
		}
	}}
	res := start(t, s, duplexConfig(), Options{ChunkSize: 4}).Do(context.Background(), post("abcdefghij"), echoUpstream(200, "ok"))
	if res.ProcessingError != nil || string(res.UpstreamRequest.Body) != "ABCD" || string(res.Response.Body) != "OK" {
		t.Fatalf("upstream got %q, client got %v", res.UpstreamRequest.Body, res)
	}
}

// TestFullDuplexSpuriousReplies: a body reply without streamed_response, or
// one before the headers reply, fails closed.
func TestFullDuplexSpuriousReplies(t *testing.T) {
	for name, reply := range map[string]func(h, b *extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse{
		"plain body mutation": func(h, b *extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
			return []*extprocv3.ProcessingResponse{cont(h), cont(b)}
		},
		"body before headers": func(h, b *extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
			return []*extprocv3.ProcessingResponse{streamed(b, "x", true), cont(h)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := &scripted{script: func(st extprocv3.ExternalProcessor_ProcessServer) error {
				h, err := st.Recv()
				if err != nil {
					return nil
				}
				b, err := st.Recv()
				if err != nil {
					return nil
				}
				for _, r := range reply(h, b) {
					_ = st.Send(r)
				}
				_, _ = st.Recv()
				return nil
			}}
			res := start(t, s, duplexConfig(), Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
			if !errors.Is(res.ProcessingError, ErrSpurious) || res.UpstreamCalled || res.Response.Status != 500 {
				t.Fatalf("%v", res)
			}
		})
	}
}

// TestGRPCLocalReplyIsTrailersOnly: an immediate response to a gRPC
// request reaches the client as :status 200 with grpc-status and the
// percent-encoded body as grpc-message.
func TestGRPCLocalReplyIsTrailersOnly(t *testing.T) {
	s := &scripted{script: continueAll(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{GrpcStatus: &extprocv3.GrpcStatus{Status: 6}, Body: []byte("done 100%")},
	}})}
	req := post("x")
	req.Headers = append(req.Headers, Header{"content-type", "application/grpc"})
	res := start(t, s, nil, Options{}).Do(context.Background(), req, echoUpstream(200, "ok"))
	r := res.Response
	if r.Status != 200 || get(r.Headers, "grpc-status") != "6" || get(r.Headers, "grpc-message") != "done 100%25" ||
		get(r.Headers, "content-type") != "application/grpc" || len(r.Body) != 0 {
		t.Fatalf("%v %v", r.Status, r.Headers)
	}
}

package extproc_test

import (
	"context"
	"testing"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// proxylessHeaders is request_headers as grpc-go's filter sends them: the
// call's metadata only, the method in request_attributes, the GRPC body
// modes in protocol_config and its flow-control windows.
func proxylessHeaders(kv ...string) *extprocv3.ProcessingRequest {
	attrs, _ := structpb.NewStruct(map[string]any{
		"request.path": "/orders.v1.Orders/Create", "request.host": "orders", "request.method": "POST",
	})
	return &extprocv3.ProcessingRequest{
		Request:    &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(false, kv...)},
		Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode: procmodev3.ProcessingMode_GRPC, ResponseBodyMode: procmodev3.ProcessingMode_GRPC,
		},
		FlowControlInit: &extprocv3.ProcessingRequest_FlowControlInit{
			InitialWindowDownstreamToSidestream: 65536, InitialWindowUpstreamToSidestream: 65536,
		},
	}
}

func requestBody(msg string, halfClose bool) *extprocv3.ProcessingRequest {
	b := &extprocv3.HttpBody{Body: []byte(msg)}
	if halfClose {
		b = &extprocv3.HttpBody{EndOfStream: true, EndOfStreamWithoutMessage: true}
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: b}}
}

// replies reads a stream's replies on one goroutine.
func replies(st extprocv3.ExternalProcessor_ProcessClient) <-chan *extprocv3.ProcessingResponse {
	ch := make(chan *extprocv3.ProcessingResponse, 16)
	go func() {
		defer close(ch)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			ch <- r
		}
	}()
	return ch
}

// TestProtectedCallHeldUntilReserved: grpc-go forwards the call upstream
// only on the headers reply and each message only on its echo; for a
// protected call the server sends neither before the half-close, then the
// headers reply and every message back in order.
func TestProtectedCallHeldUntilReserved(t *testing.T) {
	c := client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*extprocv3.ProcessingRequest{proxylessHeaders("idempotency-key", "k1"), requestBody("m1", false), requestBody("m2", false)} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	rs := replies(st)
	select {
	case r := <-rs:
		t.Fatalf("a reply before the half-close: %v", r)
	case <-time.After(200 * time.Millisecond):
	}
	if err := st.Send(requestBody("", true)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 4 {
		r, ok := <-rs
		if !ok {
			t.Fatal("the stream ended")
		}
		switch {
		case r.GetRequestHeaders() != nil:
			got = append(got, "headers")
		case r.GetRequestBody() != nil:
			sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr.GetEndOfStreamWithoutMessage() && sr.GetEndOfStream() {
				got = append(got, "half-close")
			} else {
				got = append(got, string(sr.GetBody()))
			}
		default:
			t.Fatalf("unexpected reply %v", r)
		}
	}
	if want := []string{"headers", "m1", "m2", "half-close"}; len(got) != 4 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Fatalf("replies %v, want %v", got, want)
	}
}

// TestUnprotectedCallEchoed: a call no policy protects is answered at
// once, every body sent back as a streamed_response (grpc-go fails a body
// reply without one), and a standalone client_window_update gets no reply.
func TestUnprotectedCallEchoed(t *testing.T) {
	c := client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		t.Helper()
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := send(proxylessHeaders()); r.GetRequestHeaders() == nil {
		t.Fatalf("headers answered %v", r)
	}
	if sr := send(requestBody("m1", false)).GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(sr.GetBody()) != "m1" {
		t.Fatalf("body not echoed: %v", sr)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{ClientWindowUpdate: &extprocv3.ProcessingRequest_ClientWindowUpdate{WindowIncrementSidestreamToUpstream: 2}}); err != nil {
		t.Fatal(err)
	}
	if sr := send(requestBody("", true)).GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); !sr.GetEndOfStream() || !sr.GetEndOfStreamWithoutMessage() {
		t.Fatalf("half-close not echoed: %v", sr)
	}
	resp := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("r1")}}}
	if r := send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers(false, "content-type", "application/grpc")}}); r.GetResponseHeaders() == nil {
		t.Fatalf("response headers answered %v", r)
	}
	if sr := send(resp).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(sr.GetBody()) != "r1" || sr.GetEndOfStream() {
		t.Fatalf("response body not echoed: %v", sr)
	}
	if r := send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}); r.GetResponseTrailers() == nil {
		t.Fatalf("trailers answered %v", r)
	}
}

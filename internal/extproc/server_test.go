package extproc_test

import (
	"context"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
)

func client(t *testing.T) extprocv3.ExternalProcessorClient {
	t.Helper()
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = st.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, extproc.New(extproc.Config{Store: st}))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return extprocv3.NewExternalProcessorClient(cc)
}

func headers(eos bool, kv ...string) *extprocv3.HttpHeaders {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.HttpHeaders{Headers: m, EndOfStream: eos}
}

// TestProtocolViolationsEndTheStream: messages Envoy never sends in that
// order end the stream with InvalidArgument (Envoy then fails closed), and
// never with a CONTINUE that could let a request through unchecked.
func TestProtocolViolationsEndTheStream(t *testing.T) {
	c := client(t)
	for name, msgs := range map[string][]*extprocv3.ProcessingRequest{
		"body before headers":     {{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("x"), EndOfStream: true}}}},
		"trailers before headers": {{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}},
		"headers twice": {
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(false, ":method", "POST", ":path", "/", "idempotency-key", "k")}},
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(false, ":method", "POST", ":path", "/", "idempotency-key", "k")}},
		},
		"empty message": {{}},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := c.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var last error
			for i, m := range msgs {
				if err := st.Send(m); err != nil {
					break
				}
				resp, err := st.Recv()
				if err != nil {
					last = err
					break
				}
				if i == len(msgs)-1 {
					t.Fatalf("the violation was answered: %v", resp)
				}
			}
			if status.Code(last) != codes.InvalidArgument {
				t.Fatalf("stream ended with %v, want InvalidArgument", last)
			}
		})
	}
}

// TestPhasesAfterSkipAreContinued: an Envoy that does not honour
// mode_override still sends every phase of an unprotected request; each
// gets a CONTINUE of its own type.
func TestPhasesAfterSkipAreContinued(t *testing.T) {
	c := client(t)
	st, err := c.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(false, ":method", "GET", ":path", "/")}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("x"), EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers(false, ":status", "200")}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("y"), EndOfStream: true}}},
	}
	for i, m := range msgs {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		switch i {
		case 0:
			ok = resp.GetRequestHeaders() != nil && resp.GetModeOverride() != nil
		case 1:
			ok = resp.GetRequestBody() != nil
		case 2:
			ok = resp.GetResponseHeaders() != nil
		case 3:
			ok = resp.GetResponseBody() != nil
		}
		if !ok {
			t.Fatalf("message %d answered %v", i, resp)
		}
	}
	_ = st.CloseSend()
}

package extprocwire

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// script is an ext_proc server that records what it receives and answers
// the i-th message with the i-th response.
type script struct {
	extprocv3.UnimplementedExternalProcessorServer
	replies []*extprocv3.ProcessingResponse
	got     chan *extprocv3.ProcessingRequest
}

func (s *script) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	for i := 0; ; i++ {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		s.got <- req
		if err := st.Send(s.replies[i]); err != nil {
			return err
		}
	}
}

// TestGRPCRoundTrip: over a real connection, with grpc-go's own client and
// its standard codec on the client side, every request reaches the server
// (decoded by this codec) proto.Equal to what the client sent, every
// response (encoded by it) reaches the client proto.Equal to what the
// server sent, and the health service, on the same server, still works
// through the standard codec behind it.
func TestGRPCRoundTrip(t *testing.T) {
	var reqs []*extprocv3.ProcessingRequest
	for _, k := range sortedKeys(requestCases()) {
		reqs = append(reqs, requestCases()[k])
	}
	var resps []*extprocv3.ProcessingResponse
	for _, k := range sortedKeys(responseCases()) {
		resps = append(resps, responseCases()[k])
	}
	for len(resps) < len(reqs) {
		resps = append(resps, resps[0])
	}
	srv := &script{replies: resps, got: make(chan *extprocv3.ProcessingRequest, len(reqs))}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(ServerOption())
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hr, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check through the fallback codec: %v, %v", hr, err)
	}

	st, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, req := range reqs {
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		if got := <-srv.got; !proto.Equal(got, req) {
			t.Errorf("message %d: server got %v, client sent %v", i, got, req)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(resp, resps[i]) {
			t.Errorf("reply %d: client got %v, server sent %v", i, resp, resps[i])
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("stream end: %v", err)
	}
}

// TestLargeResponseUsesThePool: a response above grpc-go's pooling
// threshold is encoded into a pooled buffer and still reads back exactly.
func TestLargeResponseUsesThePool(t *testing.T) {
	m := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Body: make([]byte, 64<<10)}}}
	data, err := NewCodec().Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	back := new(extprocv3.ProcessingResponse)
	if err := proto.Unmarshal(data.Materialize(), back); err != nil || !proto.Equal(back, m) {
		t.Fatalf("large response: %v", err)
	}
	if n := data.Len(); n != proto.Size(m) {
		t.Fatalf("%d bytes, proto.Size %d", n, proto.Size(m))
	}
}

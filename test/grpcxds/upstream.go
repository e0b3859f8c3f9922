package grpcxds

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// Upstream is a gRPC application with a visible side effect: every call it
// executes is appended to its effect log, as a real service would create an
// order. Calls steer it through their metadata and request:
// x-upstream-delay (a Go duration to wait before the effect) and the
// request's response_status (answer with that status instead of a
// message, after the effect; with x-upstream-details set, the status
// carries a detail, so it travels in grpc-status-details-bin too).
type Upstream struct {
	testgrpc.UnimplementedTestServiceServer
	// Addr is the server's loopback address.
	Addr string

	mu      sync.Mutex
	effects []Effect
	calls   int
}

// Effect is one call the upstream executed.
type Effect struct {
	Seq int
	// Key is the idempotency-key metadata as received.
	Key string
	// Body is the request payload's body.
	Body string
}

// StartUpstream serves the TestService until the test ends.
func StartUpstream(t testing.TB) *Upstream {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &Upstream{Addr: lis.Addr().String()}
	gs := grpc.NewServer(grpc.StatsHandler(callCounter{u}))
	testgrpc.RegisterTestServiceServer(gs, u)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return u
}

// UnaryCall executes the call: it records the effect and answers with a
// payload naming it ("order-<seq>").
func (u *Upstream) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if d := first(md, "x-upstream-delay"); d != "" {
		if dur, err := time.ParseDuration(d); err == nil {
			time.Sleep(dur) // the effect happens even if the caller left
		}
	}
	u.mu.Lock()
	seq := len(u.effects) + 1
	u.effects = append(u.effects, Effect{Seq: seq, Key: first(md, "idempotency-key"), Body: string(req.GetPayload().GetBody())})
	u.mu.Unlock()
	if st := req.GetResponseStatus(); st != nil && st.GetCode() != 0 {
		s := status.New(codes.Code(st.GetCode()), st.GetMessage())
		if first(md, "x-upstream-details") != "" {
			// Any detail makes grpc-go send grpc-status-details-bin.
			s, _ = s.WithDetails(&testgrpc.EchoStatus{Code: st.GetCode()})
		}
		return nil, s.Err()
	}
	return &testgrpc.SimpleResponse{Payload: &testgrpc.Payload{Body: []byte("order-" + strconv.Itoa(seq))}}, nil
}

// Calls returns how many calls reached the upstream at all, executed or
// not: a call counts as soon as its headers arrive, before any message.
func (u *Upstream) Calls() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls
}

// callCounter counts the calls whose headers reach the upstream.
type callCounter struct{ u *Upstream }

func (c callCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (c callCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (c callCounter) HandleConn(context.Context, stats.ConnStats) {}
func (c callCounter) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InHeader); ok {
		c.u.mu.Lock()
		c.u.calls++
		c.u.mu.Unlock()
	}
}

// StreamingInputCall executes a client-streaming call once all its
// messages arrived: it records one effect whose body is the number of
// payload bytes received, and answers that number.
func (u *Upstream) StreamingInputCall(stream testgrpc.TestService_StreamingInputCallServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	total := 0
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		total += len(req.GetPayload().GetBody())
	}
	u.mu.Lock()
	seq := len(u.effects) + 1
	u.effects = append(u.effects, Effect{Seq: seq, Key: first(md, "idempotency-key"), Body: strconv.Itoa(total)})
	u.mu.Unlock()
	return stream.SendAndClose(&testgrpc.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
}

// Effects returns a copy of the effect log.
func (u *Upstream) Effects() []Effect {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Effect(nil), u.effects...)
}

// CountKey returns how many executed calls carried key.
func (u *Upstream) CountKey(key string) int {
	n := 0
	for _, e := range u.Effects() {
		if e.Key == key {
			n++
		}
	}
	return n
}

func first(md metadata.MD, name string) string {
	if v := md.Get(name); len(v) > 0 {
		return v[0]
	}
	return ""
}

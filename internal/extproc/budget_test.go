package extproc_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// inFlightSignal tells when a Reserve first found the key in flight. It
// embeds the memory store itself, not idem.Store, so that it is still an
// idem.Watcher, which a wait needs (attempt.waits).
type inFlightSignal struct {
	*memstore.Store
	once sync.Once
	seen chan struct{}
}

func (s *inFlightSignal) Reserve(ctx context.Context, r idem.Reservation) (idem.ReserveResult, error) {
	res, err := s.Store.Reserve(ctx, r)
	if err == nil && res.Outcome == idem.InFlight {
		s.once.Do(func() { close(s.seen) })
	}
	return res, err
}

// TestWaitingEchoesStayCharged: in FULL_DUPLEX_STREAMED a duplicate that
// waits for the attempt in flight (wait_for_in_flight) still holds its
// body, withheld for the echoes that follow the wait, so the body budget
// still counts it: a request that needs more than what is left is refused
// 503 idempotency-capacity-exceeded meanwhile. Before, the budget was
// given back as the body was fingerprinted, and the waiting bodies were
// held uncounted.
func TestWaitingEchoesStayCharged(t *testing.T) {
	mem := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = mem.Close() })
	st := &inFlightSignal{Store: mem, seen: make(chan struct{})}
	pol := policy.Default()
	pol.WaitForInFlight = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := budgetServer(t, ctx, st, pol)
	// The first attempt reserves the key and stays in flight.
	half := strings.Repeat("a", 30)
	first := open(withModes(reqH(false, "k"), duplex, duplex), reqBody(half, false), reqBody(half, true))
	if _, err := first.Recv(); err != nil {
		t.Fatal(err)
	}
	// Its duplicate, with the same 60-byte body, waits for it.
	open(withModes(reqH(false, "k"), duplex, duplex), reqBody(half, false), reqBody(half, true))
	select {
	case <-st.seen:
	case <-ctx.Done():
		t.Fatal("the duplicate was never decided")
	}
	// 50 more bytes do not fit in the 100 the server may hold.
	other := open(withModes(reqH(false, "other"), duplex, duplex), reqBody(strings.Repeat("b", 50), true))
	r, err := other.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ir := r.GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 503 {
		t.Fatalf("a request past the budget while a duplicate waits got %v, want a 503 immediate response", r)
	}
}

// TestRefusedBodyGivesBackItsBudget: a request body refused before it was
// read whole (here past its policy's max_request_body) gives its bytes
// back to the body budget when it is refused, not when Envoy ends the
// stream: a FULL_DUPLEX_STREAMED stream is not ended early by the server,
// and the refused request's stream stays open below. Before, its 50 bytes
// stayed charged, and the next request's 60 were refused 503.
func TestRefusedBodyGivesBackItsBudget(t *testing.T) {
	mem := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = mem.Close() })
	pol := policy.Default()
	pol.MaxRequestBody = 60
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := budgetServer(t, ctx, mem, pol)
	refused := open(withModes(reqH(false, "k"), duplex, duplex), reqBody(strings.Repeat("a", 50), false), reqBody(strings.Repeat("a", 20), true))
	if r, err := refused.Recv(); err != nil || r.GetImmediateResponse().GetStatus().GetCode() != 413 {
		t.Fatalf("a body past max_request_body got %v, %v; want a 413 immediate response", r, err)
	}
	next := open(withModes(reqH(false, "other"), duplex, duplex), reqBody(strings.Repeat("b", 60), true))
	r, err := next.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r.GetImmediateResponse() != nil {
		t.Fatalf("a 60-byte body beside a refused one got %v, want it let through", r)
	}
}

const duplex = procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED

func reqBody(s string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(s), EndOfStream: eos}}}
}

// budgetServer serves ext_proc with pol and a body budget of 100 bytes,
// and returns a function that opens a stream and sends msgs on it.
func budgetServer(t *testing.T, ctx context.Context, st idem.Store, pol *policy.Policy) func(msgs ...*extprocv3.ProcessingRequest) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	set := &policy.Set{Policies: []*policy.Policy{pol}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, extproc.New(extproc.Config{
		Store: st, Policies: func() *policy.Set { return set }, MaxBufferedBytes: 100,
		StoreTimeout: 10 * time.Second, // no store call of these tests may time out under -race
	}))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	c := extprocv3.NewExternalProcessorClient(cc)
	return func(msgs ...*extprocv3.ProcessingRequest) extprocv3.ExternalProcessor_ProcessClient {
		st, err := c.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		return st
	}
}

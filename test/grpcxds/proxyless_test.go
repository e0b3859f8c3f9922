package grpcxds_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/test/grpcxds"
)

// TestMain enables grpc-go's ext_proc filter, which grpc-go reads from the
// environment at process start.
func TestMain(m *testing.M) { os.Exit(grpcxds.EnableExtProcAndRun(m)) }

// call makes one unary call with an idempotency-key (none when key is "")
// and extra metadata pairs. It waits for the xDS configuration rather than
// failing fast while the client is still receiving it.
func call(t *testing.T, env *grpcxds.Env, key, payload string, md ...string) (*testgrpc.SimpleResponse, error) {
	t.Helper()
	return callWith(env, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(payload)}}, key, md...)
}

func callWith(env *grpcxds.Env, req *testgrpc.SimpleRequest, key string, md ...string) (*testgrpc.SimpleResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if key != "" {
		md = append(md, "idempotency-key", key)
	}
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	return env.Client.UnaryCall(ctx, req, grpc.WaitForReady(true))
}

func wantOK(t *testing.T, resp *testgrpc.SimpleResponse, err error, body string) {
	t.Helper()
	if err != nil {
		t.Fatalf("call failed: %v", err)
	}
	if got := string(resp.GetPayload().GetBody()); got != body {
		t.Fatalf("response payload %q, want %q", got, body)
	}
}

func wantCode(t *testing.T, err error, code codes.Code, msgPart string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), msgPart) {
		t.Fatalf("status %v %q, want %v containing %q", st.Code(), st.Message(), code, msgPart)
	}
}

// TestKeylessCallsPass: calls without a key are not protected; each one
// executes and gets its own answer.
func TestKeylessCallsPass(t *testing.T) {
	env := grpcxds.Start(t, grpcxds.Options{})
	for i, want := range []string{"order-1", "order-2"} {
		resp, err := call(t, env, "", "book")
		wantOK(t, resp, err, want)
		if n := len(env.Upstream.Effects()); n != i+1 {
			t.Fatalf("effects = %d, want %d", n, i+1)
		}
	}
}

// TestFirstCallExecutesRetryDoesNot: the first keyed call executes and
// returns the upstream's message; its retry is answered ALREADY_EXISTS,
// naming the original status, and never reaches the upstream.
func TestFirstCallExecutesRetryDoesNot(t *testing.T) {
	env := grpcxds.Start(t, grpcxds.Options{})
	resp, err := call(t, env, "order-42", "book")
	wantOK(t, resp, err, "order-1")
	calls := env.Upstream.Calls()

	_, err = call(t, env, "order-42", "book")
	wantCode(t, err, codes.AlreadyExists, "operation already completed with status OK")
	if n := env.Upstream.CountKey("order-42"); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
	if n := env.Upstream.Calls(); n != calls {
		t.Fatalf("the retry reached the upstream (%d calls, want %d)", n, calls)
	}
}

// TestSameKeyOtherPayloadRefused: a key reused for a different message is
// refused FAILED_PRECONDITION before the upstream sees anything.
func TestSameKeyOtherPayloadRefused(t *testing.T) {
	env := grpcxds.Start(t, grpcxds.Options{})
	resp, err := call(t, env, "k-reuse", "book")
	wantOK(t, resp, err, "order-1")
	calls := env.Upstream.Calls()
	_, err = call(t, env, "k-reuse", "ten books")
	wantCode(t, err, codes.FailedPrecondition, "idempotency-key-reused")
	if n, c := env.Upstream.CountKey("k-reuse"), env.Upstream.Calls(); n != 1 || c != calls {
		t.Fatalf("executions = %d, calls = %d; want 1 and %d", n, c, calls)
	}
}

// TestConcurrentDuplicatesExecuteOnce: 20 attempts of one operation at once
// execute once; the others are told it is in progress (ABORTED) or, once
// it completed, get the replay status.
func TestConcurrentDuplicatesExecuteOnce(t *testing.T) {
	env := grpcxds.Start(t, grpcxds.Options{})
	// Warm up: the client has its xDS configuration and connections.
	resp, err := call(t, env, "", "warm-up")
	wantOK(t, resp, err, "order-1")

	const n = 20
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = call(t, env, "k-concurrent", "book", "x-upstream-delay", "300ms")
		})
	}
	close(start)
	wg.Wait()
	var ok, inFlight, replayed int
	for _, err := range errs {
		switch status.Code(err) {
		case codes.OK:
			ok++
		case codes.Aborted:
			inFlight++
		case codes.AlreadyExists:
			replayed++
		default:
			t.Errorf("unexpected answer: %v", err)
		}
	}
	if got := env.Upstream.CountKey("k-concurrent"); got != 1 || ok != 1 {
		t.Fatalf("executions = %d, successes = %d (in flight %d, replayed %d); want 1 and 1", got, ok, inFlight, replayed)
	}
}

// TestStoreDownIsUnavailable: with Redis down a keyed call fails
// UNAVAILABLE and the upstream sees nothing of it; protection resumes when
// Redis is back.
func TestStoreDownIsUnavailable(t *testing.T) {
	env := grpcxds.Start(t, grpcxds.Options{StoreTimeout: 200 * time.Millisecond})
	resp, err := call(t, env, "", "warm-up")
	wantOK(t, resp, err, "order-1")
	calls := env.Upstream.Calls()

	env.Redis.Kill()
	_, err = call(t, env, "k-down", "book")
	wantCode(t, err, codes.Unavailable, "idempotency-store-unavailable")
	if c := env.Upstream.Calls(); c != calls {
		t.Fatalf("the refused call reached the upstream")
	}

	env.Redis.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err = call(t, env, "k-down", "book")
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantOK(t, resp, err, "order-2")
}

// TestInvalidKeyIsInvalidArgument: a malformed key is refused
// INVALID_ARGUMENT before any store call or upstream contact.
func TestInvalidKeyIsInvalidArgument(t *testing.T) {
	env := grpcxds.Start(t, grpcxds.Options{})
	_, err := call(t, env, strings.Repeat("k", 300), "book")
	wantCode(t, err, codes.InvalidArgument, "idempotency-key-invalid")
	if c := env.Upstream.Calls(); c != 0 {
		t.Fatalf("the refused call reached the upstream (%d calls)", c)
	}
}

// TestUpstreamErrorsAreRecorded: an upstream that fails a call answered it:
// the failure is stored and its retry replayed, with the status when the
// upstream sent one in grpc-status-details-bin (grpc-go forwards no
// grpc-status), else as UNKNOWN. RESOURCE_EXHAUSTED, like HTTP 429, asks
// for a retry: the record is released and the retry executes.
func TestUpstreamErrorsAreRecorded(t *testing.T) {
	env := grpcxds.Start(t, grpcxds.Options{})
	failing := func(code codes.Code) *testgrpc.SimpleRequest {
		return &testgrpc.SimpleRequest{
			Payload:        &testgrpc.Payload{Body: []byte("book")},
			ResponseStatus: &testgrpc.EchoStatus{Code: int32(code), Message: "no stock"},
		}
	}
	_, err := callWith(env, failing(codes.FailedPrecondition), "k-fail")
	wantCode(t, err, codes.FailedPrecondition, "no stock")
	_, err = callWith(env, failing(codes.FailedPrecondition), "k-fail")
	wantCode(t, err, codes.AlreadyExists, "operation already completed with status UNKNOWN")
	if n := env.Upstream.CountKey("k-fail"); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}

	detailed := failing(codes.InvalidArgument)
	detailed.Payload.Body = []byte("details")
	_, err = callWith(env, detailed, "k-detailed", "x-upstream-details", "true")
	wantCode(t, err, codes.InvalidArgument, "no stock")
	_, err = callWith(env, detailed, "k-detailed", "x-upstream-details", "true")
	wantCode(t, err, codes.AlreadyExists, "operation already completed with status INVALID_ARGUMENT: no stock")

	busy := failing(codes.ResourceExhausted)
	_, err = callWith(env, busy, "k-busy", "x-upstream-details", "true")
	wantCode(t, err, codes.ResourceExhausted, "no stock")
	resp, err := call(t, env, "k-busy", "book")
	if err != nil || env.Upstream.CountKey("k-busy") != 2 {
		t.Fatalf("the retry after RESOURCE_EXHAUSTED: %v, %v; executions %d, want 2", resp, err, env.Upstream.CountKey("k-busy"))
	}
}

// TestClientStreamBeyondTheWindow: a client stream larger than grpc-go's
// 64 KiB ext_proc flow-control window is held whole, executes once, and
// its retry is replayed.
func TestClientStreamBeyondTheWindow(t *testing.T) {
	env := grpcxds.Start(t, grpcxds.Options{})
	send := func() (*testgrpc.StreamingInputCallResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", "k-stream")
		st, err := env.Client.StreamingInputCall(ctx, grpc.WaitForReady(true))
		if err != nil {
			return nil, err
		}
		chunk := strings.Repeat("x", 16<<10)
		for range 10 {
			if err := st.Send(&testgrpc.StreamingInputCallRequest{Payload: &testgrpc.Payload{Body: []byte(chunk)}}); err != nil {
				break // the status comes from CloseAndRecv
			}
		}
		return st.CloseAndRecv()
	}
	resp, err := send()
	if err != nil || resp.GetAggregatedPayloadSize() != 160<<10 {
		t.Fatalf("first stream: %v, %v", resp, err)
	}
	_, err = send()
	wantCode(t, err, codes.AlreadyExists, "status OK")
	if n := env.Upstream.CountKey("k-stream"); n != 1 {
		t.Fatalf("executions = %d, want 1", n)
	}
}

// TestPoliciesMatchGRPCMethods: with no pseudo-headers, policies match on
// the request.path and request.host attributes: a policy for one service's
// methods (path prefix /grpc.testing.TestService/, host orders) requires a
// key there, while default_policy is off.
func TestPoliciesMatchGRPCMethods(t *testing.T) {
	set, err := config.Parse("policies.yaml", []byte(`
policies:
  - name: orders
    match:
      hosts: [orders]
      methods: [POST]
      path: {prefix: /grpc.testing.TestService/}
    key: {required: true}
default_policy:
  enabled: false
`))
	if err != nil {
		t.Fatal(err)
	}
	env := grpcxds.Start(t, grpcxds.Options{Policies: set})
	_, err = call(t, env, "", "book")
	wantCode(t, err, codes.InvalidArgument, "idempotency-key-missing")
	resp, err := call(t, env, "k-policy", "book")
	wantOK(t, resp, err, "order-1")
	_, err = call(t, env, "k-policy", "book")
	wantCode(t, err, codes.AlreadyExists, "status OK")
}

// TestShadowNeverBlocksProxylessCalls: under a shadow policy a retry, a
// reused key and a missing required key all reach the upstream and get its
// answer; only the counters know what enforcement would have done.
func TestShadowNeverBlocksProxylessCalls(t *testing.T) {
	set, err := config.Parse("policies.yaml", []byte(`
default_policy:
  enforcement: shadow
  shadow_header: idempotency-shadow
  key: {required: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	env := grpcxds.Start(t, grpcxds.Options{Policies: set})
	for i, c := range []struct{ key, payload string }{{"s-1", "book"}, {"s-1", "book"}, {"s-1", "pen"}, {"", "book"}} {
		resp, err := call(t, env, c.key, c.payload)
		wantOK(t, resp, err, "order-"+strconv.Itoa(i+1))
	}
	if n := len(env.Upstream.Effects()); n != 4 {
		t.Fatalf("executions = %d, want 4", n)
	}
}

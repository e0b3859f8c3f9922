package e2e

import (
	"context"
	"encoding/binary"
	"strconv"
	"strings"
	"sync"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/grpc/codes"

	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// grpcUpstream is a gRPC service behind Envoy's router, speaking gRPC's
// HTTP/2 mapping: a framed message and grpc-status trailers, or a
// trailers-only error when the call carries x-upstream-grpc-status; or,
// with x-upstream-fail, the router failure Envoy answers itself.
type grpcUpstream struct {
	mu      sync.Mutex
	effects []string // the idempotency-key of each execution
}

func (u *grpcUpstream) serve(_ context.Context, req *envoysim.Request) (*envoysim.Response, error) {
	if v, _ := envoysim.Get(req.Headers, "x-upstream-fail"); v == "connect" {
		return nil, envoysim.ConnectFailure
	}
	key, _ := envoysim.Get(req.Headers, "idempotency-key")
	u.mu.Lock()
	u.effects = append(u.effects, key)
	seq := len(u.effects)
	u.mu.Unlock()
	grpcHeaders := []envoysim.Header{{Name: "content-type", Value: "application/grpc"}}
	if code, _ := envoysim.Get(req.Headers, "x-upstream-grpc-status"); code != "" {
		return &envoysim.Response{Status: 200, Headers: append(grpcHeaders,
			envoysim.Header{Name: "grpc-status", Value: code}, envoysim.Header{Name: "grpc-message", Value: "no%20stock"})}, nil
	}
	return &envoysim.Response{
		Status:   200,
		Headers:  grpcHeaders,
		Body:     frame("order-" + strconv.Itoa(seq)),
		Trailers: []envoysim.Header{{Name: "grpc-status", Value: "0"}},
	}, nil
}

func (u *grpcUpstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, k := range u.effects {
		if k == key {
			n++
		}
	}
	return n
}

// frame is one uncompressed gRPC message on the wire.
func frame(msg string) []byte {
	b := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// grpcCall sends one unary gRPC call through the Envoy-faithful filter.
func grpcCall(env *harness.Env, up *grpcUpstream, key, payload string, hs ...string) *envoysim.Result {
	headers := []envoysim.Header{{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}}
	if key != "" {
		headers = append(headers, envoysim.Header{Name: "idempotency-key", Value: key})
	}
	for i := 0; i+1 < len(hs); i += 2 {
		headers = append(headers, envoysim.Header{Name: hs[i], Value: hs[i+1]})
	}
	res := env.Filter.Do(context.Background(), &envoysim.Request{
		Method: "POST", Path: "/orders.v1.Orders/Create", Authority: "orders.example", Scheme: "http",
		Headers: headers, Body: frame(payload),
	}, up.serve)
	env.Proxy.Observe(res)
	return res
}

// grpcStatus reads a response's gRPC status: from the trailers, or from
// the headers of a trailers-only response.
func grpcStatus(t *testing.T, res *envoysim.Result) (codes.Code, string) {
	t.Helper()
	if res.Response == nil {
		t.Fatalf("no response: %v", res)
	}
	if res.Response.Status != 200 {
		t.Fatalf("HTTP status %d for a gRPC call: %v", res.Response.Status, res)
	}
	hs := res.Response.Trailers
	if _, ok := envoysim.Get(hs, "grpc-status"); !ok {
		hs = res.Response.Headers
	}
	s, ok := envoysim.Get(hs, "grpc-status")
	n, err := strconv.Atoi(s)
	if !ok || err != nil {
		t.Fatalf("no grpc-status in %v", res.Response)
	}
	msg, _ := envoysim.Get(hs, "grpc-message")
	return codes.Code(n), strings.ReplaceAll(msg, "%20", " ")
}

func wantGRPC(t *testing.T, res *envoysim.Result, code codes.Code, msgPart string) {
	t.Helper()
	got, msg := grpcStatus(t, res)
	if got != code || !strings.Contains(msg, msgPart) {
		t.Fatalf("grpc-status %v %q, want %v containing %q; %v", got, msg, code, msgPart, res)
	}
}

// TestGRPCOverEnvoy: gRPC calls through Envoy get the same contract as
// proxyless ones, in every filter configuration: the status decides the
// outcome, and the server's own answers are trailers-only gRPC statuses.
func TestGRPCOverEnvoy(t *testing.T) {
	trailersSent := envoysim.RecommendedConfig()
	trailersSent.ProcessingMode.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
	for name, cfg := range map[string]*extprocfilterv3.ExternalProcessor{
		"buffered, trailers asked for by override": envoysim.RecommendedConfig(),
		"buffered, trailers sent":                  trailersSent,
		"full duplex":                              fullDuplexConfig(),
	} {
		t.Run(name, func(t *testing.T) {
			env := harness.Start(t, harness.Options{Filter: cfg, FilterOptions: envoysim.Options{ChunkSize: 3}})
			up := &grpcUpstream{}

			first := grpcCall(env, up, "g-1", "book")
			wantGRPC(t, first, codes.OK, "")
			if string(first.Response.Body) != string(frame("order-1")) {
				t.Fatalf("first answer %q", first.Response.Body)
			}
			if cfg.GetProcessingMode().GetResponseTrailerMode() == extprocfilterv3.ProcessingMode_SKIP {
				// The status is in the trailers: the server asks for them.
				for _, m := range first.Messages {
					if m.Phase == envoysim.PhaseResponseHeaders && m.Reply != "mode_override" {
						t.Fatalf("response headers answered %q: %v", m.Reply, first)
					}
				}
			}
			replay := grpcCall(env, up, "g-1", "book")
			wantGRPC(t, replay, codes.AlreadyExists, "operation already completed with status OK")
			if v, _ := envoysim.Get(replay.Response.Headers, "idempotent-replayed"); v != "true" {
				t.Fatalf("replay not marked: %v", replay.Response.Headers)
			}
			wantGRPC(t, grpcCall(env, up, "g-1", "ten books"), codes.FailedPrecondition, "idempotency-key-reused")
			if n := up.count("g-1"); n != 1 {
				t.Fatalf("executions = %d, want 1", n)
			}

			// An upstream error is the upstream's answer: stored, replayed
			// with its status.
			wantGRPC(t, grpcCall(env, up, "g-err", "book", "x-upstream-grpc-status", "14"), codes.Unavailable, "no stock")
			wantGRPC(t, grpcCall(env, up, "g-err", "book", "x-upstream-grpc-status", "14"), codes.AlreadyExists,
				"operation already completed with status UNAVAILABLE: no stock")
			if n := up.count("g-err"); n != 1 {
				t.Fatalf("executions = %d, want 1", n)
			}

			// RESOURCE_EXHAUSTED, like 429, and a request Envoy never sent
			// (connect failure) release the key: the retry runs.
			wantGRPC(t, grpcCall(env, up, "g-busy", "book", "x-upstream-grpc-status", "8"), codes.ResourceExhausted, "no stock")
			wantGRPC(t, grpcCall(env, up, "g-busy", "book"), codes.OK, "")
			if n := up.count("g-busy"); n != 2 {
				t.Fatalf("executions = %d, want 2", n)
			}
			wantGRPC(t, grpcCall(env, up, "g-down", "book", "x-upstream-fail", "connect"), codes.Unavailable, "")
			wantGRPC(t, grpcCall(env, up, "g-down", "book"), codes.OK, "")
		})
	}
}

// TestGRPCOverEnvoyRefusals: the server's refusals of gRPC calls through
// Envoy are gRPC statuses; none reaches the upstream.
func TestGRPCOverEnvoyRefusals(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	up := &grpcUpstream{}
	wantGRPC(t, grpcCall(env, up, strings.Repeat("k", 300), "book"), codes.InvalidArgument, "idempotency-key-invalid")

	// In flight: ABORTED, with gRPC's retry pushback.
	done := make(chan *envoysim.Result)
	slow := &slowUpstream{grpcUpstream: up, release: make(chan struct{})}
	go func() { done <- grpcCallVia(env, slow.serve, "g-slow", "book") }()
	testwait.For(t, func() bool { return reservedCount(t, env) == 1 })
	busy := grpcCall(env, up, "g-slow", "book")
	wantGRPC(t, busy, codes.Aborted, "request-in-progress")
	if v, _ := envoysim.Get(busy.Response.Headers, "grpc-retry-pushback-ms"); v != "1000" {
		t.Fatalf("pushback %q, want 1000", v)
	}
	close(slow.release)
	wantGRPC(t, <-done, codes.OK, "")

	env.Redis.Kill()
	wantGRPC(t, grpcCall(env, up, "g-store", "book"), codes.Unavailable, "idempotency-store-unavailable")
	if n := up.count("g-store") + up.count(strings.Repeat("k", 300)); n != 0 {
		t.Fatalf("refused calls executed %d times", n)
	}
	env.Redis.Restart()
}

// slowUpstream holds each call until release is closed.
type slowUpstream struct {
	*grpcUpstream
	release chan struct{}
}

func (s *slowUpstream) serve(ctx context.Context, req *envoysim.Request) (*envoysim.Response, error) {
	<-s.release
	return s.grpcUpstream.serve(ctx, req)
}

func grpcCallVia(env *harness.Env, serve envoysim.Upstream, key, payload string) *envoysim.Result {
	res := env.Filter.Do(context.Background(), &envoysim.Request{
		Method: "POST", Path: "/orders.v1.Orders/Create", Authority: "orders.example",
		Headers: []envoysim.Header{{Name: "content-type", Value: "application/grpc"}, {Name: "idempotency-key", Value: key}},
		Body:    frame(payload),
	}, serve)
	env.Proxy.Observe(res)
	return res
}

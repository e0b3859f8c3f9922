package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// budgetServer runs an ext_proc server with a total body budget of limit
// bytes on a real Redis, and the Envoy-faithful proxy in front of it.
func budgetServer(t *testing.T, limit int64) (*harness.Env, string) {
	t.Helper()
	env := harness.Start(t, harness.Options{MaxBufferedBytes: limit})
	return env, env.ServerAddr()
}

// hog opens a stream that holds n buffered bytes of a protected request:
// a STREAMED body chunk that is not the last, as Envoy sends while a slow
// client uploads. Closing it ends the stream.
func hog(t *testing.T, addr string, n int) (closeHog func()) {
	t.Helper()
	return hogAt(t, addr, "/orders", n)
}

// hogAt is hog for a request to path, with the extra headers given (name,
// value pairs).
func hogAt(t *testing.T, addr, path string, n int, extra ...string) (closeHog func()) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hs := &corev3.HeaderMap{}
	for _, kv := range [][2]string{{":method", "POST"}, {":path", path}, {":authority", "api.example"}, {"idempotency-key", "hog"}} {
		hs.Headers = append(hs.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	for i := 0; i+1 < len(extra); i += 2 {
		hs.Headers = append(hs.Headers, &corev3.HeaderValue{Key: extra[i], RawValue: []byte(extra[i+1])})
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{
			Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hs}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: procmodev3.ProcessingMode_STREAMED, ResponseBodyMode: procmodev3.ProcessingMode_STREAMED},
		},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: make([]byte, n)}}},
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
		// The reply comes once the message was buffered (and charged).
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	return func() {
		cancel()
		_ = cc.Close()
	}
}

// TestBodyBudgetRefusesThenRecovers: with the budget held by streams in
// the middle of their bodies, new protected requests get 503
// idempotency-capacity-exceeded with Retry-After, reserve nothing and
// reach no upstream; once those streams end, the same keys go through,
// each executed once. Failed before the budget: the requests were let
// through (201).
func TestBodyBudgetRefusesThenRecovers(t *testing.T) {
	const limit = 1 << 20
	env, addr := budgetServer(t, limit)
	// The hog leaves less room than one body: each request is refused at
	// its body, the one message Envoy sends in BUFFERED mode.
	closeHog := hog(t, addr, limit-1000)
	body := `{"pad":"` + strings.Repeat("x", 64<<10) + `"}`
	const n = 16
	replies := make([]harness.Reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = env.Post("/orders", fmt.Sprintf("budget-%d", i), body)
		}()
	}
	wg.Wait()
	for _, r := range replies {
		p := wantProblem(t, r, problem.CapacityExceeded)
		if r.Header.Get("Retry-After") == "" {
			t.Fatalf("no Retry-After on %v", p)
		}
	}
	if n := len(env.Upstream.Effects()); n != 0 {
		t.Fatalf("refused requests reached the upstream %d times", n)
	}
	if n := reservedCount(t, env); n != 0 {
		t.Fatalf("refused requests left %d records", n)
	}

	closeHog()
	// The hog's bytes return when its stream ends, which the server sees
	// shortly after the client cancels: wait for that event by retrying the
	// first key, whose refusals are harmless (nothing is recorded).
	deadline := time.Now().Add(30 * time.Second)
	var first harness.Reply
	for {
		first = env.Post("/orders", "budget-0", body)
		if first.Status != problem.CapacityExceeded.Status || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	wantStatus(t, first, http.StatusCreated)
	for i := 1; i < n; i++ {
		wantStatus(t, env.Post("/orders", fmt.Sprintf("budget-%d", i), body), http.StatusCreated)
	}
	for i := range n {
		if r := env.Post("/orders", fmt.Sprintf("budget-%d", i), body); r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry of budget-%d not replayed: %d %v", i, r.Status, r.Header)
		}
		if c := env.Upstream.CountKey(fmt.Sprintf("budget-%d", i)); c != 1 {
			t.Fatalf("budget-%d executed %d times", i, c)
		}
	}
}

// TestBodyBudgetUnderABurst: many concurrent large protected requests,
// each sent twice at once, against a budget far below their total: each
// gets 201, a replay, 409 (its twin in flight) or 503 capacity-exceeded;
// refused ones are retried with the same key. The server stays up and
// every key executes exactly once.
func TestBodyBudgetUnderABurst(t *testing.T) {
	const limit = 1 << 20
	// 48 streams of 256 KiB bodies at once, each answer stored: under the
	// race detector on a loaded machine one message could wait past the
	// harness's 5 s message timeout, and Envoy's 504 then is a latency
	// failure, not the budget's. This test is about the budget and
	// exactly-once, so the filter waits a minute.
	cfg := envoysim.RecommendedConfig()
	cfg.MessageTimeout = durationpb.New(time.Minute)
	env := harness.Start(t, harness.Options{MaxBufferedBytes: limit, Filter: cfg})
	body := `{"pad":"` + strings.Repeat("y", 256<<10) + `"}`
	const keys = 24
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		refused  int
		failures []string
	)
	for i := range 2 * keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("burst-%d", i%keys)
			deadline := time.Now().Add(60 * time.Second)
			for {
				r := env.Post("/orders", key, body)
				switch {
				case r.Err != nil:
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %v", key, r.Err))
					mu.Unlock()
					return
				case r.Status == http.StatusCreated:
					return
				case r.Status == http.StatusServiceUnavailable && strings.Contains(r.Body, problem.CapacityExceeded.Slug),
					r.Status == http.StatusConflict && strings.Contains(r.Body, problem.InProgress.Slug):
					if r.Status == http.StatusServiceUnavailable {
						mu.Lock()
						refused++
						mu.Unlock()
					}
					if time.Now().After(deadline) {
						mu.Lock()
						failures = append(failures, key+": still refused after 60s")
						mu.Unlock()
						return
					}
					time.Sleep(5 * time.Millisecond)
				default:
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %d %s", key, r.Status, r.Body[:min(len(r.Body), 200)]))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %s", len(failures), failures[0])
	}
	for i := range keys {
		if c := env.Upstream.CountKey(fmt.Sprintf("burst-%d", i)); c != 1 {
			t.Fatalf("burst-%d executed %d times", i, c)
		}
	}
	// Still serving.
	wantStatus(t, env.Post("/orders", "after-burst", `{}`), http.StatusCreated)
	t.Logf("%d refusals for capacity during the burst", refused)
}

// TestBodyLargerThanTheBudget: a body that alone passes the whole budget
// could never be taken, so it is 413 request-body-too-large (not a 503
// whose retry would never succeed), and nothing runs.
func TestBodyLargerThanTheBudget(t *testing.T) {
	env, _ := budgetServer(t, 64<<10)
	r := env.Post("/orders", "too-big-for-the-budget", `{"pad":"`+strings.Repeat("z", 128<<10)+`"}`)
	wantProblem(t, r, problem.BodyTooLarge)
	if n := len(env.Upstream.Effects()); n != 0 {
		t.Fatalf("the upstream ran %d times", n)
	}
	wantStatus(t, env.Post("/orders", "fits", `{}`), http.StatusCreated)
}

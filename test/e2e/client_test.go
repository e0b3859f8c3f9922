package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/idemclient"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// The client's end-to-end tests: idemclient in front of the Envoy-faithful
// proxy, the real server over ext_proc gRPC, a real redis-server and the
// counting upstream, so the outcomes of docs/client.md are checked from
// the caller's seat.

// lossyFront is an HTTP front for env's proxy that loses the answer of
// the requests lose picks. Such a request still runs to its end through
// the proxy, the server and the upstream (the exchange is detached from
// the client's connection, as a response already on its way back is), and
// only then is the answer lost: with reset, the connection is reset (RST)
// instead; without, the front holds the answer until the client gives up.
// Losing it only after the exchange ended keeps the test from depending on
// how fast the machine is.
func lossyFront(t *testing.T, env *harness.Env, reset bool, lose func(*http.Request) bool) (string, *atomic.Int32) {
	t.Helper()
	var lost atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !lose(r) {
			env.Proxy.ServeHTTP(w, r)
			return
		}
		env.Proxy.ServeHTTP(httptest.NewRecorder(), r.WithContext(context.WithoutCancel(r.Context())))
		lost.Add(1)
		if !reset {
			<-r.Context().Done()
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &lost
}

func firstAttempt(r *http.Request) bool { return r.Header.Get(idemclient.AttemptHeader) == "1" }

// clientPost sends one POST through c with key (none when "").
func clientPost(t *testing.T, ctx context.Context, c *http.Client, url, key, body string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		if err := idemclient.SetKey(req, key); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b), nil
}

// quoted is the key as the upstream receives it from idemclient.
func quoted(key string) string { return strconv.Quote(key) }

// TestClientArticleOutcomes plays the four outcomes of one
// operation from the caller's seat: the first request succeeds; a timeout
// after the write is retried by the client and answered with the replay,
// one effect; the same request again gets the same answer; a changed body
// under the same key is refused before any effect.
func TestClientArticleOutcomes(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	front, lost := lossyFront(t, env, false, func(r *http.Request) bool {
		return r.Header.Get("x-lose-first") == "yes" && firstAttempt(r)
	})
	c := idemclient.NewClient(idemclient.Options{AttemptTimeout: time.Second, MaxAttempts: 10})
	body := `{"item":"book","amount":100}`

	// 1. First success.
	const key = "order-42"
	resp, first, err := clientPost(t, context.Background(), c, front+"/orders", key, body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || idemclient.Replayed(resp) || idemclient.Attempts(resp) != 1 {
		t.Fatalf("first: %d, replayed %v, attempts %d", resp.StatusCode, idemclient.Replayed(resp), idemclient.Attempts(resp))
	}

	// 2. Timeout after the write: the first attempt's answer never comes
	// back, the client's attempt timeout fires, and the retry with the same
	// key gets the stored answer. One effect.
	const key2 = "order-43"
	req, _ := http.NewRequest(http.MethodPost, front+"/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-lose-first", "yes")
	_ = idemclient.SetKey(req, key2)
	resp2, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := io.ReadAll(resp2.Body)
	_ = resp2.Body.Close()
	if resp2.StatusCode != http.StatusCreated || !idemclient.Replayed(resp2) || idemclient.Attempts(resp2) < 2 || lost.Load() != 1 {
		t.Fatalf("after a lost answer: %d, replayed %v, attempts %d, lost %d", resp2.StatusCode, idemclient.Replayed(resp2), idemclient.Attempts(resp2), lost.Load())
	}
	if n := env.Upstream.CountKey(quoted(key2)); n != 1 {
		t.Fatalf("effects of the timed-out operation = %d, want 1", n)
	}
	if eff := env.Upstream.Effects(); eff[len(eff)-1].ResponseBody != string(b2) {
		t.Fatalf("the replay %q is not the executed answer %q", b2, eff[len(eff)-1].ResponseBody)
	}

	// 3. The same request again: the same answer, marked as a replay.
	resp3, again, err := clientPost(t, context.Background(), c, front+"/orders", key, body)
	if err != nil {
		t.Fatal(err)
	}
	if resp3.StatusCode != http.StatusCreated || !idemclient.Replayed(resp3) || again != first {
		t.Fatalf("again: %d, replayed %v, body %q want %q", resp3.StatusCode, idemclient.Replayed(resp3), again, first)
	}

	// 4. A changed body under the same key: refused before any effect,
	// with a typed error, in one attempt.
	var attempts atomic.Int32
	c4 := idemclient.NewClient(idemclient.Options{OnAttempt: func(idemclient.Attempt) { attempts.Add(1) }})
	_, _, err = clientPost(t, context.Background(), c4, front+"/orders", key, `{"item":"book","amount":10000}`)
	var pe *idemclient.ProblemError
	if !errors.Is(err, idemclient.ErrKeyReused) || !errors.As(err, &pe) || pe.Status != 422 || attempts.Load() != 1 {
		t.Fatalf("changed body: err %v after %d attempts", err, attempts.Load())
	}
	if n := env.Upstream.CountKey(quoted(key)); n != 1 {
		t.Fatalf("effects of order-42 = %d, want 1", n)
	}
}

// TestClientDeadlineBoundsTheChain: while another attempt holds the
// operation, the client is told 409 request-in-progress with Retry-After
// (1 s by default) and waits; its context's deadline ends the chain: no
// attempt starts after it, and no more attempts are made than fit.
func TestClientDeadlineBoundsTheChain(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	const key = "slow-op"
	body := `{"n":1}`
	holder := make(chan harness.Reply, 1)
	go func() {
		holder <- env.Post("/orders", quoted(key), body, "x-upstream-delay", "5s")
	}()
	testwait.For(t, func() bool { return env.Upstream.ArrivedKey(quoted(key)) == 1 })

	var mu sync.Mutex
	var starts []time.Time
	var last idemclient.Attempt
	c := idemclient.NewClient(idemclient.Options{Base: timedBase(&mu, &starts), MaxAttempts: 100,
		OnAttempt: func(a idemclient.Attempt) { mu.Lock(); last = a; mu.Unlock() }})
	const budget = 3500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	deadline, _ := ctx.Deadline()
	resp, _, err := clientPost(t, ctx, c, env.URL+"/orders", key, body)
	switch {
	case err == nil:
		// The chain gave up with the last answer rather than wait past
		// the deadline.
		if resp.StatusCode != http.StatusConflict || idemclient.Replayed(resp) {
			t.Fatalf("status %d, want the last 409 request-in-progress", resp.StatusCode)
		}
	case !errors.Is(err, context.DeadlineExceeded):
		// An attempt still running at the deadline ends with it, which a
		// loaded machine may cause; anything else is wrong.
		t.Fatalf("err %v, want the last 409 or the deadline", err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Each wait is at least Retry-After (1 s), so at most 4 attempts fit
	// in 3.5 s; a second one is sent unless the first took 2.5 s.
	if len(starts) < 2 || len(starts) > 4 {
		t.Fatalf("%d attempts in %v, want 2 to 4", len(starts), budget)
	}
	// The chain never began a wait it could not finish before the
	// deadline: its last attempt is a stop, or a retry whose planned wait
	// ended before the deadline (a loaded machine may fire the timer late,
	// which is the scheduler's doing, not the chain's).
	if last.Outcome != idemclient.OutcomeStop {
		planned := starts[len(starts)-1].Add(last.Duration + last.Wait)
		if planned.After(deadline) {
			t.Fatalf("last attempt %+v: the chain began a wait ending %v after the deadline", last, planned.Sub(deadline))
		}
	}
	for i, st := range starts {
		if !st.Before(deadline) {
			t.Fatalf("attempt %d started %v after the deadline", i+1, st.Sub(deadline))
		}
	}
	if r := <-holder; r.Status != http.StatusCreated {
		t.Fatalf("the holder got %d", r.Status)
	}
	if n := env.Upstream.CountKey(quoted(key)); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// timedBase records when each attempt is handed to the network.
func timedBase(mu *sync.Mutex, starts *[]time.Time) http.RoundTripper {
	return roundTrip(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		*starts = append(*starts, time.Now())
		mu.Unlock()
		return http.DefaultTransport.RoundTrip(r)
	})
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClientStopsOnOutcomeUnknown: an earlier attempt left once the
// upstream had it, so its outcome is unknown to the server; the client is
// told 409 outcome-unknown and stops with ErrOutcomeUnknown, without a
// second effect.
func TestClientStopsOnOutcomeUnknown(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	const key = "lost-op"
	body := `{"n":2}`
	if err := env.Abandon("/orders", key, body); err != nil {
		t.Fatal(err)
	}
	c := idemclient.NewClient(idemclient.Options{MaxAttempts: 10})
	_, _, err := clientPost(t, context.Background(), c, env.URL+"/orders", key, body)
	var pe *idemclient.ProblemError
	if !errors.Is(err, idemclient.ErrOutcomeUnknown) || !errors.As(err, &pe) || pe.Slug() != problem.OutcomeUnknown.Slug {
		t.Fatalf("err %v, want ErrOutcomeUnknown", err)
	}
	testwait.For(t, func() bool { return env.Upstream.CountKey(key) == 1 })
	if n := env.Upstream.ArrivedKey(quoted(key)); n != 0 {
		t.Fatalf("the client's attempts reached the upstream %d times", n)
	}
}

// TestClientKeylessNotRetriedAfterReset: a POST without a key whose answer
// is lost to a connection reset after it was executed is not sent again:
// the caller gets the error and there is one effect. The same with a key
// is retried and answered by the replay.
func TestClientKeylessNotRetriedAfterReset(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	front, lost := lossyFront(t, env, true, firstAttempt)
	base := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(base.CloseIdleConnections)
	c := idemclient.NewClient(idemclient.Options{Base: base})

	_, _, err := clientPost(t, context.Background(), c, front+"/orders", "", `{"keyless":true}`)
	var e *idemclient.Error
	if !errors.As(err, &e) || e.Attempts != 1 || lost.Load() != 1 {
		t.Fatalf("keyless: err %v, lost %d", err, lost.Load())
	}
	if n := env.Upstream.Count(func(e harness.Effect) bool { return e.Body == `{"keyless":true}` }); n != 1 {
		t.Fatalf("keyless effects = %d, want 1", n)
	}

	resp, _, err := clientPost(t, context.Background(), c, front+"/orders", "keyed-reset", `{"keyless":false}`)
	if err != nil {
		t.Fatal(err)
	}
	if !idemclient.Replayed(resp) || idemclient.Attempts(resp) != 2 || env.Upstream.CountKey(quoted("keyed-reset")) != 1 {
		t.Fatalf("keyed: replayed %v, attempts %d, effects %d", idemclient.Replayed(resp), idemclient.Attempts(resp), env.Upstream.CountKey(quoted("keyed-reset")))
	}
}

// TestClientConcurrentCallersOneKey: callers racing with one key and one
// body all get the same answer, one of them fresh and the others replays
// (after waiting out request-in-progress), and the operation runs once.
func TestClientConcurrentCallersOneKey(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	c := idemclient.NewClient(idemclient.Options{MaxAttempts: 20})
	const callers = 8
	const key = "shared-op"
	type got struct {
		status   int
		replayed bool
		body     string
		err      error
	}
	results := make(chan got, callers)
	var start sync.WaitGroup
	start.Add(1)
	for range callers {
		go func() {
			start.Wait()
			req, _ := http.NewRequest(http.MethodPost, env.URL+"/orders", strings.NewReader(`{"n":3}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("x-upstream-delay", "300ms")
			_ = idemclient.SetKey(req, key)
			resp, err := c.Do(req)
			if err != nil {
				results <- got{err: err}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			results <- got{resp.StatusCode, idemclient.Replayed(resp), string(b), nil}
		}()
	}
	start.Done()
	fresh := 0
	var body string
	for range callers {
		g := <-results
		if g.err != nil || g.status != http.StatusCreated {
			t.Fatalf("a caller got %d, %v", g.status, g.err)
		}
		if body == "" {
			body = g.body
		} else if g.body != body {
			t.Fatalf("answers differ: %q and %q", g.body, body)
		}
		if !g.replayed {
			fresh++
		}
	}
	if fresh != 1 || env.Upstream.CountKey(quoted(key)) != 1 {
		t.Fatalf("%d fresh answers and %d effects, want 1 and 1", fresh, env.Upstream.CountKey(quoted(key)))
	}
}

// TestClientAttemptsTraceable: each attempt of one operation can be
// followed from the client's log to the server's by its request id: the
// client logs the key, its attempt number and the request id it sent, and
// the server's "decision" line for that attempt carries the same request
// id, its own attempt count and the decision (reserved, then the replay of
// the completed record).
func TestClientAttemptsTraceable(t *testing.T) {
	var serverLog, clientLog harness.LogBuffer
	env := harness.Start(t, harness.Options{
		Logger: slog.New(slog.NewJSONHandler(&serverLog, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	front, _ := lossyFront(t, env, true, firstAttempt)
	base := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(base.CloseIdleConnections)
	c := idemclient.NewClient(idemclient.Options{Base: base,
		Logger: slog.New(slog.NewJSONHandler(&clientLog, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	resp, _, err := clientPost(t, context.Background(), c, front+"/orders", "traced-op", `{"n":4}`)
	if err != nil {
		t.Fatal(err)
	}
	if !idemclient.Replayed(resp) || idemclient.Attempts(resp) != 2 {
		t.Fatalf("replayed %v after %d attempts", idemclient.Replayed(resp), idemclient.Attempts(resp))
	}

	type line struct {
		Msg       string  `json:"msg"`
		Key       string  `json:"idempotency_key"`
		Attempt   float64 `json:"attempt"`
		RequestID string  `json:"request_id"`
		Outcome   string  `json:"outcome"`
		Decision  string  `json:"decision"`
	}
	parse := func(s string) []line {
		var out []line
		for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
			var v line
			if err := json.Unmarshal([]byte(l), &v); err != nil {
				t.Fatalf("log line %q: %v", l, err)
			}
			out = append(out, v)
		}
		return out
	}
	client := parse(clientLog.String())
	if len(client) != 2 || client[0].Outcome != "retry" || client[1].Outcome != "done" {
		t.Fatalf("client log %+v", client)
	}
	decisions := map[string]line{}
	for _, l := range parse(serverLog.String()) {
		if l.Msg == "decision" {
			decisions[l.RequestID] = l
		}
	}
	// The server's decision lines use the metric's names: the second
	// attempt is answered from the stored record, a replay.
	want := []string{"reserved", "replayed"}
	for i, cl := range client {
		if cl.Key != "traced-op" || cl.Attempt != float64(i+1) || cl.RequestID == "" {
			t.Fatalf("client line %d: %+v", i+1, cl)
		}
		sl, ok := decisions[cl.RequestID]
		if !ok || sl.Attempt != float64(i+1) || sl.Decision != want[i] {
			t.Fatalf("server decision for attempt %d (request id %s): %+v, want %s; all: %v", i+1, cl.RequestID, sl, want[i], decisions)
		}
	}
}

// TestClientRetriesStoreUnavailable: with Redis down the server refuses
// the write with 503 idempotency-store-unavailable and Retry-After, having
// executed nothing; the client waits and retries with the same key, and
// once Redis is back the write runs once.
func TestClientRetriesStoreUnavailable(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	env.Redis.Kill()
	var mu sync.Mutex
	var seen []idemclient.Attempt
	c := idemclient.NewClient(idemclient.Options{MaxAttempts: 10, OnAttempt: func(a idemclient.Attempt) {
		mu.Lock()
		seen = append(seen, a)
		first := len(seen) == 1
		mu.Unlock()
		if first && a.Outcome == idemclient.OutcomeRetry {
			env.Redis.Restart() // while the client waits out Retry-After
		}
	}})
	resp, _, err := clientPost(t, context.Background(), c, env.URL+"/orders", "store-down-op", `{"n":5}`)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[0].Status != http.StatusServiceUnavailable || seen[0].ProblemType != idemclient.ProblemType(problem.StoreUnavailable.Slug) || seen[0].Wait < time.Second {
		t.Fatalf("first attempt %+v, want 503 store-unavailable waited out for Retry-After (1 s)", seen[0])
	}
	if resp.StatusCode != http.StatusCreated || idemclient.Replayed(resp) || env.Upstream.CountKey(quoted("store-down-op")) != 1 {
		t.Fatalf("status %d, replayed %v, effects %d", resp.StatusCode, idemclient.Replayed(resp), env.Upstream.CountKey(quoted("store-down-op")))
	}
}

// TestClientRetriesCapacityExceeded: with the server's body budget full it
// refuses the write with 503 idempotency-capacity-exceeded and
// Retry-After, having reserved and executed nothing; the client waits and
// retries with the same key, and once the budget has room the write runs
// once. Failed before the client knew the type: the chain stopped at the
// first answer with ErrUnknownProblem.
func TestClientRetriesCapacityExceeded(t *testing.T) {
	const limit = 1 << 20
	env, addr := budgetServer(t, limit)
	closeHog := hog(t, addr, limit-1000) // less room left than one body
	t.Cleanup(closeHog)
	body := `{"pad":"` + strings.Repeat("x", 64<<10) + `"}`
	var mu sync.Mutex
	var seen []idemclient.Attempt
	c := idemclient.NewClient(idemclient.Options{MaxAttempts: 5, OnAttempt: func(a idemclient.Attempt) {
		mu.Lock()
		seen = append(seen, a)
		first := len(seen) == 1
		mu.Unlock()
		if !first || a.Outcome != idemclient.OutcomeRetry {
			return
		}
		// Free the budget while the client waits out Retry-After. The
		// server sees the hog's stream end shortly after it is cancelled:
		// wait for that with a probe under another key (a refusal records
		// nothing).
		closeHog()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if r := env.Post("/orders", "capacity-probe", body); r.Status != problem.CapacityExceeded.Status || time.Now().After(deadline) {
				return
			}
		}
	}})
	resp, _, err := clientPost(t, context.Background(), c, env.URL+"/orders", "capacity-op", body)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[0].Status != http.StatusServiceUnavailable || seen[0].ProblemType != idemclient.ProblemType(problem.CapacityExceeded.Slug) ||
		seen[0].Outcome != idemclient.OutcomeRetry || seen[0].Wait < time.Second {
		t.Fatalf("first attempt %+v, want 503 capacity-exceeded waited out for Retry-After (1 s)", seen[0])
	}
	if resp.StatusCode != http.StatusCreated || idemclient.Replayed(resp) || env.Upstream.CountKey(quoted("capacity-op")) != 1 {
		t.Fatalf("status %d, replayed %v, effects %d", resp.StatusCode, idemclient.Replayed(resp), env.Upstream.CountKey(quoted("capacity-op")))
	}
}

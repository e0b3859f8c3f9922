package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// TestUnprotectedRequestsCostNothing: reads, PUT, DELETE and keyless writes
// reach the upstream, are answered at request headers with one message and
// a skip-everything override, and issue no Redis command at all.
func TestUnprotectedRequestsCostNothing(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	ctx := context.Background()
	// Warm up the client's connection so its handshake is not counted.
	if err := env.Store.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	before, err := env.Redis.CommandCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, method, key, body string
	}{
		{"GET with key", http.MethodGet, "k-get", ""},
		{"HEAD with key", http.MethodHead, "k-head", ""},
		{"OPTIONS with key", http.MethodOptions, "k-options", ""},
		{"PUT with key", http.MethodPut, "k-put", `{"a":1}`},
		{"DELETE with key", http.MethodDelete, "k-delete", ""},
		{"POST without key", http.MethodPost, "", `{"a":1}`},
		{"PATCH without key", http.MethodPatch, "", `{"a":1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var hs []string
			if tc.key != "" {
				hs = append(hs, "Idempotency-Key", tc.key)
			}
			n := len(env.Upstream.Effects())
			r := env.Do(tc.method, "/orders", tc.body, 0, hs...)
			if r.Err != nil || r.Status >= 300 {
				t.Fatalf("answer %d %v", r.Status, r.Err)
			}
			if got := len(env.Upstream.Effects()); got != n+1 {
				t.Fatalf("upstream saw %d new requests, want 1", got-n)
			}
			res := env.Results()[len(env.Results())-1]
			if len(res.Messages) != 1 || res.Messages[0].Phase != envoysim.PhaseRequestHeaders || res.Messages[0].Reply != "mode_override" {
				t.Fatalf("ext_proc conversation %v, want one request_headers message answered with a mode_override", res)
			}
		})
	}
	// A repeated keyless POST runs twice: it asked for no protection.
	env.Post("/orders", "", `{"a":1}`)
	after, err := env.Redis.CommandCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("unprotected requests issued %d Redis commands, want 0", after-before)
	}
}

// TestPatchIsProtected: PATCH is protected like POST.
func TestPatchIsProtected(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	first := env.Do(http.MethodPatch, "/orders/7", `{"qty":2}`, 0, "Idempotency-Key", "patch-1")
	wantStatus(t, first, http.StatusOK)
	wantReplayOf(t, env.Do(http.MethodPatch, "/orders/7", `{"qty":2}`, 0, "Idempotency-Key", "patch-1"), first)
	// The path is part of the operation.
	wantProblem(t, env.Do(http.MethodPatch, "/orders/8", `{"qty":2}`, 0, "Idempotency-Key", "patch-1"), problem.KeyReused)
	if n := env.Upstream.CountKey("patch-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// TestMalformedKeys: every malformed key is a 400 problem before any store
// call; the quoted IETF form names the same key as the bare token.
func TestMalformedKeys(t *testing.T) {
	env := harness.Start(t, harness.Options{})
	for _, tc := range []struct {
		name, key string
		// more are further Idempotency-Key field lines, sent as envoysim
		// sends them: one HeaderValue per line, as Envoy does.
		more []string
	}{
		{name: "two field lines", key: "dup-a", more: []string{"dup-b"}},
		{name: "the same key on two field lines", key: "dup-a", more: []string{"dup-a"}},
		{name: "bare list", key: "a,b"},
		{name: "bare list with space", key: "a, b"},
		{name: "list of quoted strings", key: `"a", "b"`},
		{"empty", "", nil},
		{"empty quoted", `""`, nil},
		{"too long", strings.Repeat("k", 256), nil},
		{"too long quoted", `"` + strings.Repeat("k", 256) + `"`, nil},
		{"inner space", "a b", nil},
		{"non-ASCII", "ключ", nil},
		{"control byte", "a\x01b", nil},
		{"unterminated quote", `"abc`, nil},
		{"bad escape", `"a\b"`, nil},
		{"text after quote", `"abc"def`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Straight through the filter: net/http would refuse some of
			// these bytes, and the server must not rely on a proxy that does.
			hs := []envoysim.Header{{Name: "idempotency-key", Value: tc.key}, {Name: "content-type", Value: "application/json"}}
			for _, k := range tc.more {
				hs = append(hs, envoysim.Header{Name: "idempotency-key", Value: k})
			}
			res := env.Exchange(&envoysim.Request{
				Method: http.MethodPost, Path: "/orders", Authority: "api.example",
				Headers: hs,
				Body:    []byte(`{}`),
			})
			wantProblem(t, replyOf(res), problem.KeyInvalid)
		})
	}
	if n := len(env.Upstream.Effects()); n != 0 {
		t.Fatalf("malformed keys reached the upstream %d times", n)
	}
	if n := reservedCount(t, env); n != 0 {
		t.Fatalf("malformed keys created %d records", n)
	}

	// 255 characters is the longest valid key.
	long := strings.Repeat("k", 255)
	wantStatus(t, env.Post("/orders", long, `{}`), http.StatusCreated)
	// "abc" (IETF sf-string) and abc are one key.
	first := env.Post("/orders", `"quoted-1"`, `{"q":1}`)
	wantStatus(t, first, http.StatusCreated)
	wantReplayOf(t, env.Post("/orders", "quoted-1", `{"q":1}`), first)
	if n := env.Upstream.CountKey(`"quoted-1"`) + env.Upstream.CountKey("quoted-1"); n != 1 {
		t.Fatalf("effects for the quoted key = %d, want 1", n)
	}
}

// replyOf turns a filter result into the reply a client would read.
func replyOf(res *envoysim.Result) harness.Reply {
	if res.Response == nil {
		return harness.Reply{Err: errors.New("no response")}
	}
	h := http.Header{}
	for _, kv := range res.Response.Headers {
		h.Add(kv.Name, kv.Value)
	}
	return harness.Reply{Status: res.Response.Status, Header: h, Body: string(res.Response.Body)}
}

// TestRedisDownFailsClosedFast: with Redis killed a protected request gets
// a 503 problem with Retry-After, inside a 150 ms message_timeout (were the
// server slower, the driver would answer 504 as Envoy does); unprotected
// traffic is untouched; once Redis is back, protection resumes without a
// server restart.
func TestRedisDownFailsClosedFast(t *testing.T) {
	var env *harness.Env
	redisDownFailsClosed(t, func(t *testing.T, opts harness.Options) *harness.Env {
		env = harness.Start(t, opts)
		return env
	}, func() { env.Redis.Kill() }, func() { env.Redis.Restart() })
}

// redisDownFailsClosed takes the store down and up again with down and up.
func redisDownFailsClosed(t *testing.T, start backend, down, up func()) {
	// The server's store budget is the production default (100 ms), well
	// inside Envoy's message_timeout, so the answer is the server's own 503
	// problem and not Envoy's 504. The timeout leaves a loaded machine a
	// second, not the 50 ms a 150 ms timeout left, which a -race run under
	// load sometimes used up: this test is about who answers, not how fast.
	cfg := envoysim.RecommendedConfig()
	cfg.MessageTimeout = durationpb.New(time.Second)
	env := start(t, harness.Options{Filter: cfg, StoreTimeout: idem.DefaultStoreTimeout})
	// created makes a first write with a fresh key (prefix-1, prefix-2, ...)
	// until one is answered other than 503, and requires that answer to be
	// 201. On a loaded machine a store call may outlast its 100 ms, and
	// after the outage a connection or topology view from before it may
	// still be in use (and Cluster's keys live on different nodes, so one
	// key's success does not show that the next key's node is back): a 503
	// then is correct, before any effect, and the client retries, as it
	// would. Each attempt has a key of its own: one answered 503 because its
	// reservation's reply came too late has reserved its key all the same,
	// so a retry with that key is rightly answered 409 while the lease runs.
	created := func(prefix string) (key string, r harness.Reply) {
		t.Helper()
		attempts := 0
		testwait.For(t, func() bool {
			attempts++
			key = fmt.Sprintf("%s-%d", prefix, attempts)
			r = env.Post("/orders", key, `{"r":1}`)
			return r.Status != http.StatusServiceUnavailable
		})
		wantStatus(t, r, http.StatusCreated)
		return key, r
	}
	created("before-kill")

	down()
	for i := range 3 { // fresh connections and the pool's broken ones alike
		r := env.Post("/orders", "during-outage", `{}`)
		p := wantProblem(t, r, problem.StoreUnavailable)
		if r.Header.Get("Retry-After") == "" {
			t.Fatalf("attempt %d: 503 without Retry-After: %v", i, p)
		}
	}
	wantStatus(t, env.Do(http.MethodGet, "/orders", "", 0), http.StatusOK)
	if n := env.Upstream.CountKey("during-outage"); n != 0 {
		t.Fatalf("a request passed unprotected while failing closed (%d effects)", n)
	}

	up()
	testwait.For(t, func() bool { return env.Store.Ping(context.Background()) == nil })
	key, first := created("after-restart")
	// A replay answered 503 is retried with its key.
	var again harness.Reply
	testwait.For(t, func() bool {
		again = env.Post("/orders", key, `{"r":1}`)
		return again.Status != http.StatusServiceUnavailable
	})
	wantReplayOf(t, again, first)
	if n := env.Upstream.CountKey(key); n != 1 {
		t.Fatalf("effects after recovery = %d, want 1", n)
	}
}

// TestServerRestartKeepsRecords: the ext_proc server crashes between the
// reservation and the response. Envoy fails the response closed; a new
// server process finds the record in Redis, so the retry is refused rather
// than executed again.
func TestServerRestartKeepsRecords(t *testing.T) {
	env := harness.Start(t, harness.Options{ExpectProcessingErrors: true})
	done := make(chan harness.Reply)
	go func() { done <- env.Post("/orders", "restart-1", `{"s":1}`, "x-upstream-delay", "300ms") }()
	// Crash only once the upstream has the request: a crash right after the
	// reservation, while Envoy still held the request, would leave no
	// effect at all, which is right but not what this test is about.
	testwait.For(t, func() bool { return env.Upstream.ArrivedKey("restart-1") == 1 })
	env.CrashServer()
	r := <-done
	wantStatus(t, r, http.StatusInternalServerError) // Envoy's status_on_error
	env.StartServer()

	// The in-process server saw its streams cut and marked the record
	// unknown on the way out. (A process killed outright cannot; then the
	// lease stands and the answer is 409 request-in-progress: see the
	// daemon package's SIGKILL test.)
	wantProblem(t, env.Post("/orders", "restart-1", `{"s":1}`), problem.OutcomeUnknown)
	if n := env.Upstream.CountKey("restart-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// TestResponseOrigins: what each kind of response does to the record.
func TestResponseOrigins(t *testing.T) {
	t.Run("upstream 5xx is stored", func(t *testing.T) {
		env := harness.Start(t, harness.Options{})
		first := env.Post("/orders", "s500", `{}`, "x-upstream-status", "500")
		wantStatus(t, first, 500)
		wantReplayOf(t, env.Post("/orders", "s500", `{}`, "x-upstream-status", "500"), first)
	})
	for _, status := range []string{"408", "425", "429"} {
		t.Run("upstream "+status+" is released", func(t *testing.T) {
			env := harness.Start(t, harness.Options{})
			r := env.Post("/orders", "retryable", `{}`, "x-upstream-status", status)
			if r.Status == 0 || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first answer %d", r.Status)
			}
			wantStatus(t, env.Post("/orders", "retryable", `{}`), http.StatusCreated)
			if n := env.Upstream.CountKey("retryable"); n != 2 {
				t.Fatalf("effects = %d, want 2: a %s asks the client to retry", n, status)
			}
		})
	}
	t.Run("upstream 4xx is stored", func(t *testing.T) {
		env := harness.Start(t, harness.Options{})
		first := env.Post("/orders", "s400", `{}`, "x-upstream-status", "400")
		wantStatus(t, first, 400)
		wantReplayOf(t, env.Post("/orders", "s400", `{}`, "x-upstream-status", "400"), first)
	})
	for _, b := range localReplyBehaviours {
		t.Run("Envoy timeout is unknown, "+b.name, func(t *testing.T) {
			env := harness.Start(t, harness.Options{RouteTimeout: 100 * time.Millisecond, FilterOptions: b.opts})
			wantStatus(t, env.Post("/orders", "timeout", `{}`, "x-upstream-delay", "300ms"), http.StatusGatewayTimeout)
			// Where Envoy skips the local reply the record turns unknown
			// when the server sees Envoy reset the stream, which may come
			// after the client has its 504.
			testwait.For(t, func() bool { return recordState(t, env, "timeout") == idem.StateUnknown })
			wantProblem(t, env.Post("/orders", "timeout", `{}`), problem.OutcomeUnknown)
			last := env.Results()[0]
			if got := last.Phases(); b.seen != (len(got) == 3 && got[2] == envoysim.PhaseResponseHeaders) {
				t.Fatalf("response headers phase seen = %v, want %v: %v", !b.seen, b.seen, last)
			}
		})
		t.Run("connect failure, "+b.name, func(t *testing.T) {
			env := harness.Start(t, harness.Options{FilterOptions: b.opts})
			env.Upstream.Close()
			wantStatus(t, env.Post("/orders", "down", `{}`), http.StatusServiceUnavailable)
			if b.seen {
				// upstream_reset_before_response_started{remote_connection_failure|…}:
				// never sent, released.
				if n := reservedCount(t, env); n != 0 {
					t.Fatalf("records = %d: a request never sent must leave none", n)
				}
				return
			}
			// 1.34-1.36 never shows the server Envoy's 503: the stream
			// just ends, and the outcome cannot be known.
			testwait.For(t, func() bool { return recordState(t, env, "down") == idem.StateUnknown })
		})
	}
}

// TestBodyModes: the same contract holds in every body mode Envoy offers.
func TestBodyModes(t *testing.T) {
	big := strings.Repeat("x", 100_000)
	for _, tc := range []struct {
		name     string
		reqMode  extprocfilterv3.ProcessingMode_BodySendMode
		respMode extprocfilterv3.ProcessingMode_BodySendMode
		chunk    int
		override bool
	}{
		{"buffered", extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_BUFFERED, 0, true},
		{"streamed in one chunk", extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_STREAMED, 0, true},
		{"streamed in 4 KiB chunks", extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_STREAMED, 4096, true},
		{"streamed in 4 KiB chunks, override not allowed", extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_STREAMED, 4096, false},
		{"streamed in one chunk, override not allowed", extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_STREAMED, 0, false},
		{"buffered partial", extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL, extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL, 0, true},
		{"bodies not sent, override allowed", extprocfilterv3.ProcessingMode_NONE, extprocfilterv3.ProcessingMode_NONE, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := envoysim.RecommendedConfig()
			cfg.ProcessingMode.RequestBodyMode = tc.reqMode
			cfg.ProcessingMode.ResponseBodyMode = tc.respMode
			cfg.AllowModeOverride = tc.override
			env := harness.Start(t, harness.Options{Filter: cfg, FilterOptions: envoysim.Options{ChunkSize: tc.chunk}})
			body := `{"big":"` + big + `"}`
			first := env.Post("/orders", "modes", body)
			wantStatus(t, first, http.StatusCreated)
			wantReplayOf(t, env.Post("/orders", "modes", body), first)
			wantProblem(t, env.Post("/orders", "modes", body+" "), problem.KeyReused)
			if n := env.Upstream.CountKey("modes"); n != 1 {
				t.Fatalf("effects = %d, want 1", n)
			}
			// Where Envoy would forward parts of the request before the
			// reservation, the server asks for the whole body first.
			res := env.Results()[0]
			asked := res.Messages[0].Reply == "mode_override"
			wantAsk := tc.override && tc.reqMode != extprocfilterv3.ProcessingMode_BUFFERED && tc.reqMode != extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL
			if asked != wantAsk {
				t.Fatalf("request headers answered %q: %v", res.Messages[0].Reply, res)
			}
		})
	}
}

// TestRequestBodyLimits: a request body that does not arrive whole is never
// fingerprinted partially.
func TestRequestBodyLimits(t *testing.T) {
	t.Run("buffered partial over the proxy buffer", func(t *testing.T) {
		cfg := envoysim.RecommendedConfig()
		cfg.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL
		// 512-byte chunks: Envoy sends the queue once it holds more than the
		// limit, 1536 bytes of 4096, end_of_stream false.
		env := harness.Start(t, harness.Options{Filter: cfg, FilterOptions: envoysim.Options{BufferLimit: 1024, ChunkSize: 512}})
		wantProblem(t, env.Post("/orders", "partial", strings.Repeat("y", 4096)), problem.BodyIncomplete)
		if n := len(env.Upstream.Effects()); n != 0 {
			t.Fatalf("effects = %d, want 0", n)
		}
		if m := env.Results()[0].Messages[1]; m.BodyLen != 1536 || m.EndOfStream {
			t.Fatalf("partial body message %+v, want 1536 bytes without end_of_stream", m)
		}
	})
	t.Run("buffered over the proxy buffer is Envoy's 413", func(t *testing.T) {
		env := harness.Start(t, harness.Options{FilterOptions: envoysim.Options{BufferLimit: 1024}})
		wantStatus(t, env.Post("/orders", "too-big", strings.Repeat("y", 4096)), http.StatusRequestEntityTooLarge)
		if n := reservedCount(t, env); n != 0 {
			t.Fatalf("records = %d, want 0", n)
		}
	})
	t.Run("streamed over the policy limit", func(t *testing.T) {
		cfg := envoysim.RecommendedConfig()
		cfg.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
		env := harness.Start(t, harness.Options{Filter: cfg, FilterOptions: envoysim.Options{ChunkSize: 64 << 10, BufferLimit: 8 << 20}})
		wantProblem(t, env.Post("/orders", "streamed-big", strings.Repeat("y", 2<<20)), problem.BodyTooLarge)
		if n := env.Upstream.CountKey("streamed-big"); n != 0 {
			t.Fatalf("effects = %d, want 0", n)
		}
	})
}

// TestLargeResponseStoredWithoutBody: a response over max_stored_body (1 MiB)
// completes the record without its body; the replay says so and never
// re-executes.
func TestLargeResponseStoredWithoutBody(t *testing.T) {
	env := harness.Start(t, harness.Options{FilterOptions: envoysim.Options{BufferLimit: 4 << 20}})
	size := "1100000"
	first := env.Post("/orders", "huge", `{}`, "x-upstream-size", size)
	wantStatus(t, first, http.StatusCreated)
	if len(first.Body) != 1100000 {
		t.Fatalf("first answer body %d bytes", len(first.Body))
	}
	r := env.Post("/orders", "huge", `{}`, "x-upstream-size", size)
	wantStatus(t, r, http.StatusCreated)
	if r.Header.Get("Idempotent-Replayed") != "true" || r.Header.Get("Idempotent-Body-Omitted") != "true" || r.Body != "" {
		t.Fatalf("replay of an unstored body: headers %v, %d body bytes", r.Header, len(r.Body))
	}
	if r.Header.Get("Location") != first.Header.Get("Location") {
		t.Fatal("the replay must keep the stored headers")
	}
	if n := env.Upstream.CountKey("huge"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

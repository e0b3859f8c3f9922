package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// fullDuplexConfig is the recommended filter with both bodies in
// FULL_DUPLEX_STREAMED mode, which needs both trailer modes SEND.
func fullDuplexConfig() *extprocfilterv3.ExternalProcessor {
	cfg := envoysim.RecommendedConfig()
	cfg.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	cfg.ProcessingMode.ResponseBodyMode = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	cfg.ProcessingMode.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
	cfg.ProcessingMode.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
	return cfg
}

// TestFullDuplexContract: in FULL_DUPLEX_STREAMED mode Envoy forwards only
// what the server sends back; the contract holds: one execution, a
// byte-identical replay, a conflict for another body, the body reaching
// the upstream whole, in any chunking.
func TestFullDuplexContract(t *testing.T) {
	for _, chunk := range []int{0, 7, 4096} {
		t.Run(chunkName(chunk), func(t *testing.T) {
			env := harness.Start(t, harness.Options{Filter: fullDuplexConfig(), FilterOptions: envoysim.Options{ChunkSize: chunk}})
			body := `{"item":"` + strings.Repeat("b", 10_000) + `"}`
			first := env.Post("/orders", "duplex", body)
			wantStatus(t, first, http.StatusCreated)
			wantReplayOf(t, env.Post("/orders", "duplex", body), first)
			wantProblem(t, env.Post("/orders", "duplex", body+" "), problem.KeyReused)
			effects := env.Upstream.Effects()
			if len(effects) != 1 || effects[0].Body != body {
				t.Fatalf("effects %d; the upstream must get the body whole", len(effects))
			}
			// The headers reply is withheld until the whole body was read
			// and the key reserved: the first reply of the exchange answers
			// the request headers, after every body chunk was sent.
			res := env.Results()[0]
			if res.Messages[0].Phase != envoysim.PhaseRequestHeaders || res.Messages[0].Reply != "continue" {
				t.Fatalf("exchange %v", res)
			}
		})
	}
}

func chunkName(n int) string {
	if n == 0 {
		return "one chunk"
	}
	return "chunks of " + strconv.Itoa(n) + " bytes"
}

// TestFullDuplexConcurrent: 20 attempts at once execute once.
func TestFullDuplexConcurrent(t *testing.T) {
	env := harness.Start(t, harness.Options{Filter: fullDuplexConfig(), FilterOptions: envoysim.Options{ChunkSize: 16}})
	const n = 20
	replies := make([]harness.Reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = env.Post("/orders", "duplex-concurrent", `{"n":1}`, "x-upstream-delay", "200ms")
		})
	}
	wg.Wait()
	created := 0
	for _, r := range replies {
		switch {
		case r.Err != nil:
			t.Fatal(r.Err)
		case r.Status == http.StatusCreated && r.Header.Get("Idempotent-Replayed") == "":
			created++
		case r.Status == http.StatusCreated, r.Status == http.StatusConflict:
		default:
			t.Fatalf("unexpected answer %d %s", r.Status, r.Body)
		}
	}
	if got := env.Upstream.CountKey("duplex-concurrent"); got != 1 || created != 1 {
		t.Fatalf("effects %d, created %d; want 1 and 1", got, created)
	}
}

// TestFullDuplexUnprotected: Envoy ignores mode_override in this mode, so
// every phase of an unprotected request arrives; each body comes back
// unchanged and no store call is made.
func TestFullDuplexUnprotected(t *testing.T) {
	env := harness.Start(t, harness.Options{Filter: fullDuplexConfig(), FilterOptions: envoysim.Options{ChunkSize: 5}})
	body := `{"keyless":true}`
	r := env.Post("/orders", "", body)
	wantStatus(t, r, http.StatusCreated)
	if e := env.Upstream.Effects(); len(e) != 1 || e[0].Body != body || !strings.Contains(r.Body, `"order":1`) {
		t.Fatalf("effects %v, answer %s", e, r.Body)
	}
	if n := reservedCount(t, env); n != 0 {
		t.Fatalf("records = %d, want 0", n)
	}
}

// TestFullDuplexLargeResponse: a response over max_stored_body is not held
// back; it reaches the client whole and the record completes without it.
func TestFullDuplexLargeResponse(t *testing.T) {
	env := harness.Start(t, harness.Options{Filter: fullDuplexConfig(), FilterOptions: envoysim.Options{ChunkSize: 64 << 10}})
	first := env.Post("/orders", "duplex-huge", `{}`, "x-upstream-size", "1100000")
	wantStatus(t, first, http.StatusCreated)
	if len(first.Body) != 1100000 {
		t.Fatalf("first answer %d bytes", len(first.Body))
	}
	r := env.Post("/orders", "duplex-huge", `{}`, "x-upstream-size", "1100000")
	if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Body-Omitted") != "true" {
		t.Fatalf("replay %d %v", r.Status, r.Header)
	}
	if n := env.Upstream.CountKey("duplex-huge"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

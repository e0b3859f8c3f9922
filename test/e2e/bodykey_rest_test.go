package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// A Square-style REST API (Square's CreatePayment: POST /v2/payments with
// the key as the body's idempotency_key member) over plain HTTP through
// envoysim: the key comes from the body, the answers are HTTP problems.
const squarePolicies = `
policies:
  - name: square-payments
    match:
      methods: [POST]
      path: {exact: /v2/payments}
    key: {from: body, pointer: /idempotency_key, required: true}
    fingerprint: {json: true}
  - name: square-refunds
    match:
      methods: [POST]
      path: {exact: /v2/refunds}
    key: {from: body, pointer: /idempotency_key, required: false}
    fingerprint: {json: true}
`

func squareEnv(t *testing.T) *harness.Env {
	t.Helper()
	return harness.Start(t, harness.Options{Policies: policies(t, squarePolicies)})
}

// payments counts the upstream's executions of path.
func payments(env *harness.Env, path string) int {
	return env.Upstream.Count(func(e harness.Effect) bool { return e.Path == path })
}

// TestBodyKeyRetryReplayed: a retry of the same payment (re-serialised, as
// another client library would: members reordered, spaces) is the replay,
// byte for byte; the payment runs once.
func TestBodyKeyRetryReplayed(t *testing.T) {
	env := squareEnv(t)
	first := env.Post("/v2/payments", "", `{"idempotency_key":"4935a656-a929-4792-b97c-8848be85c27c","source_id":"cnon:card-nonce-ok","amount_money":{"amount":100,"currency":"USD"}}`)
	wantStatus(t, first, http.StatusCreated)
	retry := env.Post("/v2/payments", "", `{ "amount_money": {"currency": "USD", "amount": 100}, "source_id": "cnon:card-nonce-ok", "idempotency_key": "4935a656-a929-4792-b97c-8848be85c27c" }`)
	wantReplayOf(t, retry, first)
	if n := payments(env, "/v2/payments"); n != 1 {
		t.Fatalf("payments executed %d times, want 1", n)
	}
	// Another key in the body is another payment.
	wantStatus(t, env.Post("/v2/payments", "", `{"idempotency_key":"second","source_id":"cnon:card-nonce-ok","amount_money":{"amount":100,"currency":"USD"}}`), http.StatusCreated)
	if n := payments(env, "/v2/payments"); n != 2 {
		t.Fatalf("payments executed %d times, want 2", n)
	}
}

// TestBodyKeyChangedBodyRefused: the same key with another amount is 422
// idempotency-key-reused, and nothing runs.
func TestBodyKeyChangedBodyRefused(t *testing.T) {
	env := squareEnv(t)
	wantStatus(t, env.Post("/v2/payments", "", `{"idempotency_key":"pay-1","amount_money":{"amount":100,"currency":"USD"}}`), http.StatusCreated)
	wantProblem(t, env.Post("/v2/payments", "", `{"idempotency_key":"pay-1","amount_money":{"amount":10000,"currency":"USD"}}`), problem.KeyReused)
	if n := payments(env, "/v2/payments"); n != 1 {
		t.Fatalf("payments executed %d times, want 1", n)
	}
}

// TestBodyKeyMissingOrMalformed: where the key is required, a body without
// it is 400 idempotency-key-missing, a key that is not a string or breaks
// the header keys' rules (1 to 255 visible ASCII characters) is 400
// idempotency-key-invalid; each problem names the pointer. A body that
// cannot be read (sent twice, a duplicate member: which one counts is
// ambiguous; not JSON) is 400 request-body-unreadable, saying why. Nothing
// reaches the upstream.
func TestBodyKeyMissingOrMalformed(t *testing.T) {
	env := squareEnv(t)
	for _, tc := range []struct {
		name, body string
		want       problem.Kind
	}{
		{"absent", `{"amount_money":{"amount":100,"currency":"USD"}}`, problem.KeyMissing},
		{"number", `{"idempotency_key":42,"amount_money":{"amount":100,"currency":"USD"}}`, problem.KeyInvalid},
		{"empty", `{"idempotency_key":"","amount_money":{"amount":100,"currency":"USD"}}`, problem.KeyInvalid},
		{"too long", `{"idempotency_key":"` + strings.Repeat("k", 256) + `"}`, problem.KeyInvalid},
		{"control character", `{"idempotency_key":"a\u0007b"}`, problem.KeyInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := wantProblem(t, env.Post("/v2/payments", "", tc.body), tc.want)
			if d, _ := p["detail"].(string); !strings.Contains(d, "/idempotency_key") {
				t.Fatalf("detail %q does not name the pointer", d)
			}
		})
	}
	for _, tc := range []struct{ name, body, why string }{
		{"twice", `{"idempotency_key":"a","idempotency_key":"b"}`, "duplicate member"},
		{"not JSON", "idempotency_key=pay-form&amount=100", "not JSON"}, // a form, sent as application/json
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := wantProblem(t, env.Post("/v2/payments", "", tc.body), problem.BodyUnreadable)
			if d, _ := p["detail"].(string); !strings.Contains(d, tc.why) {
				t.Fatalf("detail %q does not say why", d)
			}
		})
	}
	if n := payments(env, "/v2/payments"); n != 0 {
		t.Fatalf("payments executed %d times, want 0", n)
	}
}

// TestBodyKeyOptional: where the key is optional, a body without one (or
// no body at all) passes unprotected, every time; one with a key is
// protected. A body that cannot be read may hold a key, so it is refused
// (400 request-body-unreadable), never passed unprotected.
func TestBodyKeyOptional(t *testing.T) {
	env := squareEnv(t)
	for range 2 {
		wantStatus(t, env.Post("/v2/refunds", "", `{"payment_id":"p-1","amount_money":{"amount":5,"currency":"USD"}}`), http.StatusCreated)
		wantStatus(t, env.Post("/v2/refunds", "", ""), http.StatusCreated)
		wantProblem(t, env.Post("/v2/refunds", "", "not json"), problem.BodyUnreadable)
	}
	if n := payments(env, "/v2/refunds"); n != 4 {
		t.Fatalf("keyless refunds executed %d times, want 4 (unprotected)", n)
	}
	first := env.Post("/v2/refunds", "", `{"idempotency_key":"refund-1","payment_id":"p-1"}`)
	wantStatus(t, first, http.StatusCreated)
	wantReplayOf(t, env.Post("/v2/refunds", "", `{"payment_id":"p-1","idempotency_key":"refund-1"}`), first)
	if n := payments(env, "/v2/refunds"); n != 5 {
		t.Fatalf("refunds executed %d times, want 5", n)
	}
}

package harness

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/memstore"
)

// TestAgentTransport: headers put on the context reach the upstream, and a
// lost response was delivered whole through the proxy (the upstream ran,
// the exchange finished) while the client sees a timeout; the next request
// under the same context goes through.
func TestAgentTransport(t *testing.T) {
	env := Start(t, Options{Store: Memory(memstore.Options{})})
	client := env.AgentClient()
	loss := NewResponseLoss()
	ctx := LoseResponse(WithHeaders(context.Background(), "Idempotency-Key", "agent-1"), loss)
	post := func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.URL+"/orders", strings.NewReader(`{"a":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		return client.Do(req)
	}
	_, err := post()
	var ue *url.Error
	if !errors.As(err, &ue) || !ue.Timeout() || !errors.Is(err, ErrResponseLost) {
		t.Fatalf("lost response: err = %v, want a timeout wrapping ErrResponseLost", err)
	}
	status, _, body, ok := loss.Lost()
	if !ok || status != http.StatusCreated || !strings.Contains(string(body), `"order":1`) {
		t.Fatalf("Lost() = %d %q %v, want the upstream's 201", status, body, ok)
	}
	if n := len(env.Results()); n != 1 || env.Results()[0].Response == nil {
		t.Fatalf("proxy results %v, want one finished exchange", env.Results())
	}
	resp, err := post()
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d replayed=%q, want the replay", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
	}
	if n := env.Upstream.CountKey("agent-1"); n != 1 {
		t.Fatalf("effects with the context's key = %d, want 1", n)
	}
}

// TestUpstreamHandler: the proxy reaches the handler given instead of the
// counting upstream.
func TestUpstreamHandler(t *testing.T) {
	env := Start(t, Options{Store: Memory(memstore.Options{}), UpstreamHandler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Handler", r.URL.Path)
		w.WriteHeader(http.StatusAccepted)
	})})
	r := env.Post("/mcp", "", `{}`)
	if r.Err != nil || r.Status != http.StatusAccepted || r.Header.Get("X-Handler") != "/mcp" {
		t.Fatalf("reply %d %v %v", r.Status, r.Header, r.Err)
	}
	if n := len(env.Upstream.Effects()); n != 0 {
		t.Fatalf("effects %d, want none from a handler upstream", n)
	}
}

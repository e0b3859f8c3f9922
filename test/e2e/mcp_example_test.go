package e2e

import (
	"context"
	"net/http"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// TestMCPExamplePolicies loads examples/mcp-policies.yaml with the real
// config loader and plays what it promises with the SDK as agent and tool
// server: keys scoped by the agent's verified identity, a payment tool that
// needs a key (header or argument), a messaging tool with derived keys,
// and session traffic that passes.
func TestMCPExamplePolicies(t *testing.T) {
	set, err := config.Load("../../examples/mcp-policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// envoy/envoy-mcp.yaml's filter: the recommended one forwarding
	// jwt_authn's namespace.
	cfg := envoysim.RecommendedConfig()
	cfg.MetadataOptions = &extprocfilterv3.MetadataOptions{ForwardingNamespaces: &extprocfilterv3.MetadataOptions_MetadataNamespaces{
		Untyped: []string{"envoy.filters.http.jwt_authn"},
	}}
	ts := newTools()
	env := harness.Start(t, harness.Options{
		Policies: set, Filter: cfg, UpstreamHandler: ts.handler(false),
		// The test agent names itself in x-test-agent; the proxy turns it
		// into what jwt_authn would have written for its bearer token.
		Decorate: func(r *http.Request, req *envoysim.Request) {
			if sub := r.Header.Get("x-test-agent"); sub != "" {
				payload, _ := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": sub}})
				req.DynamicMetadata = map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": payload}
			}
		},
	})
	as := func(agent string, headers ...string) context.Context {
		return harness.WithHeaders(context.Background(), append([]string{"x-test-agent", agent}, headers...)...)
	}
	a := connect(t, env)
	if _, err := a.ListTools(as("agent-a"), nil); err != nil {
		t.Fatal(err)
	}

	// A payment with its key among the arguments: lost, retried, once.
	pay := map[string]any{"amount": 1200, "currency": "EUR", "idempotency_key": "order-77"}
	loss := harness.NewResponseLoss()
	res, err := a.call(harness.LoseResponse(as("agent-a"), loss), "create_payment", pay)
	wantLost(t, res, err, loss)
	if got := a.result(t, as("agent-a"), "create_payment", pay); got != "pay-1-1200EUR" {
		t.Fatalf("retry got %q", got)
	}
	// The same key from another agent is another agent's operation.
	if got := a.result(t, as("agent-b"), "create_payment", pay); got != "pay-2-1200EUR" {
		t.Fatalf("agent-b got %q, want its own run", got)
	}
	// The key as a header works as well; none at all is refused.
	header := map[string]any{"amount": 5, "currency": "EUR"}
	if got := a.result(t, as("agent-a", "Idempotency-Key", "order-78"), "create_payment", header); got != "pay-3-5EUR" {
		t.Fatalf("header-keyed payment got %q", got)
	}
	if got := a.result(t, as("agent-a", "Idempotency-Key", "order-78"), "create_payment", header); got != "pay-3-5EUR" {
		t.Fatalf("header-keyed retry got %q", got)
	}
	res, err = a.call(as("agent-a"), "create_payment", header)
	wantRPCError(t, res, err, -33070, problem.KeyMissing)
	// No identity: the scope has no principal.
	res, err = a.call(context.Background(), "create_payment", pay)
	wantRPCError(t, res, err, -33074, problem.PrincipalMissing)
	if n := ts.Runs("create_payment"); n != 3 {
		t.Fatalf("create_payment ran %d times, want 3", n)
	}

	// A message without any key: its identical retry is recognised.
	msg := map[string]any{"to": "ops@example.com", "subject": "disk full"}
	loss = harness.NewResponseLoss()
	res, err = a.call(harness.LoseResponse(as("agent-a"), loss), "send_email", msg)
	wantLost(t, res, err, loss)
	if got := a.result(t, as("agent-a"), "send_email", msg); got != "msg-1-to-ops@example.com" {
		t.Fatalf("retry got %q", got)
	}
	if n := ts.Runs("send_email"); n != 1 {
		t.Fatalf("send_email ran %d times, want 1", n)
	}
	// Reads pass, every time.
	for i := range 2 {
		if got := a.result(t, as("agent-a", "Idempotency-Key", "order-77"), "lookup", map[string]any{"query": "q"}); got != "lookup-"+string(rune('1'+i)) {
			t.Fatalf("lookup %d got %q", i, got)
		}
	}
}

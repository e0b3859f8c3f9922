package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// mcpWalkthroughDoc walks an operator from a plain MCP server to a
// protected one; TestBinaryMCPWalkthrough runs what it shows.
const mcpWalkthroughDoc = "../../docs/mcp-walkthrough.md"

// The walkthrough's commands, as the page prints them, run from the
// repository's root.
const (
	walkRedis       = "redis-server --appendonly yes --maxmemory-policy noeviction"
	walkCheck       = "./idem-extproc config check examples/mcp-policies.yaml"
	walkServerFlags = "--config examples/mcp-policies.yaml --redis-url redis://localhost:6379/0 --admin-token-file admin-token"
	walkMetrics     = "curl -s localhost:8081/metrics | grep '^idem_extproc_decisions_total' | grep -v ' 0$'"
	walkAdminEnv    = "export IDEM_ADMIN_ADDR=http://localhost:8081 IDEM_ADMIN_TOKEN_FILE=admin-token"
	walkAdminByKey  = "./idem-extproc admin get --policy mcp-payments --scope agent-a --key order-77"
	walkAdminByID   = "./idem-extproc admin get --id "
)

// walkStep is one message of the walkthrough's "What the agent sees on a
// retry": the body the agent POSTs and, when the page shows it, the answer
// it gets, byte for byte.
type walkStep struct {
	request  string
	response string
	replayed bool
}

var walkSteps = []walkStep{
	{request: `{"jsonrpc":"2.0","id":6,"method":"tools/list"}`},
	{request: `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"send_email","arguments":{"to":"ops@example.com","subject":"disk full"}}}`},
	{
		request:  `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"send_email","arguments":{"to":"ops@example.com","subject":"disk full"},"_meta":{"progressToken":"p-8"}}}`,
		response: `{"jsonrpc":"2.0","id":8,"result":{"content":[{"type":"text","text":"message 1 sent to ops@example.com"}]}}`,
		replayed: true,
	},
	{
		request:  `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"create_payment","arguments":{"amount":1200,"currency":"EUR","idempotency_key":"order-77"}}}`,
		response: `{"jsonrpc":"2.0","id":9,"result":{"content":[{"type":"text","text":"payment 1: 1200 EUR"}]}}`,
	},
	{
		request:  `{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"create_payment","arguments":{"amount":1300,"currency":"EUR","idempotency_key":"order-77"}}}`,
		response: `{"jsonrpc":"2.0","id":10,"error":{"code":-33061,"message":"Idempotency-Key was used for a different request","data":{"type":"https://github.com/idem-extproc/idem-extproc/blob/main/docs/problems.md#idempotency-key-reused","status":422,"detail":"this Idempotency-Key was already used for a request with a different method, path, headers or body"}}}`,
	},
	{
		request:  `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"create_payment","arguments":{"amount":5,"currency":"EUR"}}}`,
		response: `{"jsonrpc":"2.0","id":11,"error":{"code":-33070,"message":"Idempotency-Key header is required","data":{"type":"https://github.com/idem-extproc/idem-extproc/blob/main/docs/problems.md#idempotency-key-missing","status":400,"detail":"this endpoint requires an idempotency key: no idempotency-key header; the body has no member at /params/arguments/idempotency_key"}}}`,
	},
}

// walkTools is the plain MCP server of the walkthrough, written with the
// official Go SDK: two tools with effects, each run counted before it
// answers, as a sent message stays sent whether or not its answer arrives.
// Stateless, answering in JSON, so that the page can show the messages
// without a session's handshake; idem-extproc reads neither.
type walkTools struct {
	mu   sync.Mutex
	runs map[string]int
}

func (w *walkTools) run(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runs[name]++
	return w.runs[name]
}

// Runs returns how many times the tool ran.
func (w *walkTools) Runs(name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runs[name]
}

func (w *walkTools) handler() http.Handler {
	server := mcp.NewServer(&mcp.Implementation{Name: "tools", Version: "1"}, nil)
	type email struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
	}
	mcp.AddTool(server, &mcp.Tool{Name: "send_email"}, func(ctx context.Context, req *mcp.CallToolRequest, in email) (*mcp.CallToolResult, any, error) {
		n := w.run("send_email")
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("message %d sent to %s", n, in.To)}}}, nil, nil
	})
	type payment struct {
		Amount         int    `json:"amount"`
		Currency       string `json:"currency"`
		IdempotencyKey string `json:"idempotency_key,omitempty"`
	}
	mcp.AddTool(server, &mcp.Tool{Name: "create_payment"}, func(ctx context.Context, req *mcp.CallToolRequest, in payment) (*mcp.CallToolResult, any, error) {
		n := w.run("create_payment")
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("payment %d: %d %s", n, in.Amount, in.Currency)}}}, nil, nil
	})
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
}

// TestBinaryMCPWalkthrough runs docs/mcp-walkthrough.md: Redis and the
// built binary started with the page's flags and examples/mcp-policies.yaml,
// an MCP tool server behind envoy/envoy-mcp.yaml's filter settings (the
// recommended filter forwarding jwt_authn's namespace, with the payload
// jwt_authn writes for the agent's token put in the request's metadata),
// then the page's calls, their answers, the metrics and the admin lookups,
// each checked against what the page prints.
func TestBinaryMCPWalkthrough(t *testing.T) {
	b, err := os.ReadFile(mcpWalkthroughDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	shows := func(what string) {
		t.Helper()
		if !strings.Contains(doc, what) {
			t.Errorf("docs/mcp-walkthrough.md does not show\n\t%s", what)
		}
	}
	for _, c := range []string{walkRedis, walkCheck, "./idem-extproc " + walkServerFlags, walkMetrics, walkAdminEnv, walkAdminByKey} {
		shows(c)
	}

	redisArgs, _ := strings.CutPrefix(walkRedis, "redis-server ")
	redis := redistest.Start(t, redistest.Options{Args: strings.Fields(redisArgs)})
	policies, err := filepath.Abs("../../examples/mcp-policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(binary(t), "config", "check", policies).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", walkCheck, err, out)
	}
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	writeFile(t, tokenFile, "walkthrough-token\n")
	local := map[string]string{"examples/mcp-policies.yaml": policies, "redis://localhost:6379/0": redis.URL(), "admin-token": tokenFile}
	var flags []string
	for _, f := range strings.Fields(walkServerFlags) {
		if v, ok := local[f]; ok {
			f = v
		}
		flags = append(flags, f)
	}
	p := start(t, "", "", flags...)

	tools := &walkTools{runs: map[string]int{}}
	filter := envoysim.RecommendedConfig()
	filter.MetadataOptions = &extprocfilterv3.MetadataOptions{ForwardingNamespaces: &extprocfilterv3.MetadataOptions_MetadataNamespaces{
		Untyped: []string{"envoy.filters.http.jwt_authn"},
	}}
	env := harness.Start(t, harness.Options{
		ServerAddr: p.listen, Store: harness.OnRedis(redis), Filter: filter, UpstreamHandler: tools.handler(),
		// jwt_authn's payload_in_metadata for a token whose sub is agent-a.
		Decorate: func(r *http.Request, req *envoysim.Request) {
			payload, err := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": "agent-a"}})
			if err != nil {
				t.Error(err)
			}
			req.DynamicMetadata = map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": payload}
		},
	})

	for i, s := range walkSteps {
		shows(s.request)
		r := env.Do(http.MethodPost, "/mcp", s.request, 0, "Accept", "application/json, text/event-stream")
		if r.Err != nil || r.Status != http.StatusOK {
			t.Fatalf("step %d: %d %v\n%s", i, r.Status, r.Err, r.Body)
		}
		if got := r.Header.Get("Idempotent-Replayed") == "true"; got != s.replayed {
			t.Errorf("step %d: replayed %v, want %v", i, got, s.replayed)
		}
		var id struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal([]byte(s.request), &id); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(r.Body, `{"jsonrpc":"2.0","id":`+string(id.ID)+`,`) {
			t.Errorf("step %d: the answer is not to the call's own id:\n%s", i, r.Body)
		}
		if s.response != "" {
			shows(s.response)
			if got := strings.TrimSpace(r.Body); got != s.response {
				t.Errorf("step %d: the agent gets\n\t%s\nthe page shows\n\t%s", i, got, s.response)
			}
		}
	}
	for tool, want := range map[string]int{"send_email": 1, "create_payment": 1} {
		if got := tools.Runs(tool); got != want {
			t.Errorf("%s ran %d times, want %d", tool, got, want)
		}
	}

	// The metrics, filtered as the page's command filters them.
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "idem_extproc_decisions_total") && !strings.HasSuffix(l, " 0") {
			lines = append(lines, l)
		}
	}
	if block := "```\n" + strings.Join(lines, "\n") + "\n```"; !strings.Contains(doc, block) {
		t.Errorf("the page's metrics differ from the server's:\n%s", block)
	}

	// The record of the retried message, by the key_hash of its decision
	// lines: the id the page prints.
	var keyHash string
	for _, l := range strings.Split(p.stderr.String(), "\n") {
		var line struct {
			Msg      string `json:"msg"`
			Policy   string `json:"policy"`
			Decision string `json:"decision"`
			KeyHash  string `json:"key_hash"`
		}
		if json.Unmarshal([]byte(l), &line) == nil && line.Msg == "decision" && line.Policy == "mcp-messages" && line.Decision == "replayed" {
			keyHash = line.KeyHash
		}
	}
	if keyHash == "" {
		t.Fatalf("no replayed decision line for mcp-messages:\n%s", p.stderr.String())
	}
	shows(walkAdminByID + keyHash)
	admin := func(command string) string {
		t.Helper()
		args := strings.Fields(strings.TrimPrefix(command, "./idem-extproc "))
		cmd := exec.Command(binary(t), args...)
		cmd.Env = append(os.Environ(), "IDEM_ADMIN_ADDR=http://"+p.admin, "IDEM_ADMIN_TOKEN_FILE="+tokenFile)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", command, err, out)
		}
		return string(out)
	}
	if out := admin(walkAdminByKey); !strings.Contains(out, `"state":"completed"`) {
		t.Errorf("%s:\n%s", walkAdminByKey, out)
	}
	if out := admin(walkAdminByID + keyHash); !strings.Contains(out, `"state":"completed"`) || !strings.Contains(out, `"attempts":2`) {
		t.Errorf("%s%s: want a completed record of 2 attempts:\n%s", walkAdminByID, keyHash, out)
	}
	// The page's Redis persists, so the server does not warn that a
	// restart would lose every record.
	if strings.Contains(p.stderr.String(), "may lose records") {
		t.Errorf("the page's redis-server flags leave the server warning:\n%s", p.stderr.String())
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// demoPoliciesV2 replace examples/demo-policies.yaml in
// TestBinaryDemoOwnSetup: a policy by route name with its key in the
// body, and three the demo cannot show: one scoped by JWT metadata, which
// the front does not set, one an earlier policy shadows, and a JSON-RPC
// one demo-orders cannot serve.
const demoPoliciesV2 = `policies:
  - name: orders-v2
    match: {route_names: [orders-write], methods: [POST], path: {prefix: /orders}}
    key: {from: [body], pointer: /idempotency_key, required: true}
    fingerprint: {json: true}
  - name: payments
    match: {hosts: [pay.example.com]}
    scope: {from: metadata, metadata: {namespace: envoy.filters.http.jwt_authn, path: [jwt_payload, sub]}}
  - name: later-orders
    match: {methods: [POST], path: {prefix: /orders/x}}
  - name: mcp
    match: {path: {exact: /mcp}}
    answers: jsonrpc
default_policy: {enabled: false}
`

// TestBinaryDemoOwnSetup starts the binary's demo as README.md has one try
// one's own policies: a copy of examples/demo-policies.yaml, a real Redis
// and an admin token. It runs the commands printed for each policy (curl
// through the front, idem-extproc admin get and purge), then rewrites the
// file and runs what the demo prints for the reloaded policies, then
// writes a broken file and finds the rejection reported and the policies
// in force unchanged.
func TestBinaryDemoOwnSetup(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	dir := t.TempDir()
	policies, token := filepath.Join(dir, "policies.yaml"), filepath.Join(dir, "token")
	example, err := os.ReadFile("../../examples/demo-policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, policies, string(example))
	writeFile(t, token, "demo-admin-token\n")
	// A budget a busy machine's Redis keeps: with the default 100 ms an
	// admin get was once answered 503 at load average 20.
	d := startDemo(t, "--config", policies, "--admin-token-file", token, "--redis-url", redis.URL(), "--store-timeout", "5s")

	first := d.block()
	if heading := strings.Join(first[:3], "\n"); !strings.Contains(heading, "Redis") || !strings.Contains(heading, policies) {
		t.Errorf("the heading does not name the store and the policy file:\n%s", heading)
	}
	if printedLine(first, "# 1. ") != "" {
		t.Error("with --config the demo printed the steps made for the default policy")
	}
	_, section := splitDemoBlock(t, first)
	check, ok := strings.CutPrefix(printedLine(section, "# Every setting of each: "), "# Every setting of each: ")
	words, err := shellWords(check)
	if !ok || err != nil {
		t.Fatalf("the config check command is not printed as one this test runs: %q (%v)", check, err)
	}
	if out, err := exec.Command(words[0], words[1:]...).CombinedOutput(); err != nil || !strings.Contains(string(out), "shop-orders") {
		t.Errorf("%s: %v\n%s", check, err, out)
	}
	got := runPolicyExamples(t, section, demoOrdersHits(d))
	want := map[string]string{"shop-orders": "", "partner-orders": "", "beta-rollout": "", "default": ""}
	if !sameOutcomes(got, want) {
		t.Fatalf("policies printed %q, want %q", got, want)
	}
	// The records are Redis's, not the in-memory store's.
	if n, err := redis.Do(context.Background(), "DBSIZE").Int(); err != nil || n == 0 {
		t.Fatalf("Redis holds %d keys (%v); the demo's records should be there", n, err)
	}

	writeFile(t, policies, demoPoliciesV2)
	second := d.block()
	if printedLine(second, "# "+policies+" changed and was reloaded") == "" {
		t.Fatalf("the reload is not reported:\n%s", strings.Join(second, "\n"))
	}
	got = runPolicyExamples(t, second, demoOrdersHits(d))
	want = map[string]string{
		"orders-v2":    "",
		"payments":     "scope.from: metadata",
		"later-orders": `taken by policy "orders-v2"`,
		"mcp":          "answers: jsonrpc",
	}
	if !sameOutcomes(got, want) {
		t.Fatalf("after the reload, policies printed %q, want %q", got, want)
	}

	broken := strings.Replace(demoPoliciesV2, "fingerprint: {json: true}", "fingerprint: {jsn: true}", 1)
	writeFile(t, policies, broken)
	third := d.block()
	if printedLine(third, "# "+policies+" changed and was rejected") == "" || !strings.Contains(strings.Join(third, "\n"), "jsn") {
		t.Fatalf("the rejected reload is not reported with its mistake:\n%s", strings.Join(third, "\n"))
	}
	// orders-v2 is still in force: its request, printed after the reload
	// and last sent after a purge, is now answered from storage.
	again := sendCurl(t, 0, printedLine(second, "curl "))
	if !again.replayed {
		t.Fatalf("after the rejected reload the request of orders-v2 got %d replayed=%v: the policies in force changed", again.status, again.replayed)
	}

	// The same broken file again is rejected again (the server logs it)
	// but not printed again: the next block is the next change.
	rejections := func() int { return strings.Count(d.stderr.String(), "configuration reload rejected") }
	before := rejections()
	writeFile(t, policies, broken)
	testwait.Until(t, "the broken file read again", func() bool { return rejections() > before })
	writeFile(t, policies, strings.ReplaceAll(demoPoliciesV2, "orders-v2", "orders-v3"))
	if fourth := d.block(); printedLine(fourth, "# "+policies+" changed and was reloaded") == "" || printedLine(fourth, "#   name: orders-v3") == "" {
		t.Fatalf("the block after the fixed file is not its reload:\n%s", strings.Join(fourth, "\n"))
	}
}

// TestBinaryDemoUpstream sends the front's requests to an API of the
// test's own (--upstream), a JSON-RPC one for an answers: jsonrpc policy,
// and runs the printed commands: each reaches that API exactly when it
// should. The demo runs in another directory than the commands, with the
// files named relative to it.
func TestBinaryDemoUpstream(t *testing.T) {
	var mu sync.Mutex
	hits := map[string]int{}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		hits[r.Method+" "+r.URL.Path]++
		n := hits[r.Method+" "+r.URL.Path]
		mu.Unlock()
		if r.URL.Path == "/mcp" {
			var call struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.Unmarshal(body, &call)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(call.ID) + `,"result":{"n":` + strconv.Itoa(n) + `}}`))
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("created " + strconv.Itoa(n)))
	}))
	t.Cleanup(api.Close)
	dir := t.TempDir()
	policies, token := filepath.Join(dir, "policies.yaml"), filepath.Join(dir, "token")
	writeFile(t, policies, `policies:
  - name: tools
    match: {methods: [POST], path: {exact: /mcp}, json: [{pointer: /method, equals: tools/call}]}
    answers: jsonrpc
    fingerprint: {json: true}
`)
	writeFile(t, token, "demo-admin-token\n")
	// Files named relative to the demo's directory: the printed commands,
	// run from the test's, must still find them.
	d := startDemoIn(t, dir, "--config", "policies.yaml", "--admin-token-file", "token", "--upstream", api.URL)
	first := d.block()
	if !strings.Contains(strings.Join(first[:3], "\n"), api.URL) {
		t.Errorf("the heading does not name the upstream:\n%s", strings.Join(first[:3], "\n"))
	}
	_, section := splitDemoBlock(t, first)
	got := runPolicyExamples(t, section, func(method, path string) (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		return hits[method+" "+path], true
	})
	if want := map[string]string{"tools": "", "default": ""}; !sameOutcomes(got, want) {
		t.Fatalf("policies printed %q, want %q", got, want)
	}
}

// TestBinaryDemoRefusesBadFlags: each of the demo's own-setup flags, given
// wrong, stops the demo at start with exit code 2 and a message naming the
// flag, as the server's start does.
func TestBinaryDemoRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream", "http://127.0.0.1:9/api"}, "--upstream: \"http://127.0.0.1:9/api\": want only a scheme, host and port"},
		{[]string{"--upstream", "127.0.0.1:9"}, "--upstream: "},
		{[]string{"--redis-url", "http://127.0.0.1:6379"}, "--redis-url: "},
		{[]string{"--config", missing}, "--config: "},
		{[]string{"--admin-token-file", missing}, "--admin-token-file: "},
		{[]string{"--encryption-keys-file", missing}, "--encryption-keys-file: "},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			out, err := exec.Command(binary(t), append([]string{"demo", "--addr", "127.0.0.1:0"}, c.args...)...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("the message does not name %s:\n%s", c.want, out)
			}
		})
	}
}

package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// policies parses a configuration document for a test.
func policies(t testing.TB, doc string) *policy.Set {
	t.Helper()
	set, err := config.Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// routeByPath names Envoy routes after the first path segment, as a route
// table with one route per resource would.
func routeByPath(r *http.Request) (string, *extprocfilterv3.ExtProcPerRoute) {
	seg, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	return seg + "-route", nil
}

// TestPolicyMatching: policies match by route name, host (exact and
// wildcard), method and path (exact, prefix, regex), first match wins, and
// each policy keeps its own key space.
func TestPolicyMatching(t *testing.T) {
	env := harness.Start(t, harness.Options{Route: routeByPath, Policies: policies(t, `
policies:
  - name: by-route
    match: {route_names: [payments-route]}
    key: {required: true}
  - name: by-host
    match: {hosts: [admin.example.com, "*.tenant.example.com"], methods: [POST]}
    key: {required: true}
  - name: by-regex
    match: {methods: [PUT], path: {regex: '^/items/[0-9]+$'}}
  - name: by-exact
    match: {methods: [DELETE], path: {exact: /carts/current}}
default_policy:
  match: {methods: [POST]}
`)})
	keyless := func(method, path string, headers ...string) int {
		return env.Do(method, path, `{}`, 0, headers...).Status
	}
	// by-route: required key, whatever the method.
	if s := keyless(http.MethodPost, "/payments"); s != http.StatusBadRequest {
		t.Fatalf("payments keyless = %d, want 400", s)
	}
	// by-host, exact and wildcard; Host header as a client sends it.
	for _, host := range []string{"admin.example.com", "eu.tenant.example.com", "eu.tenant.example.com:8443"} {
		if s := keyless(http.MethodPost, "/anything", "Host", host); s != http.StatusBadRequest {
			t.Fatalf("host %s keyless = %d, want 400", host, s)
		}
	}
	if s := keyless(http.MethodPost, "/anything", "Host", "tenant.example.com"); s != http.StatusCreated {
		t.Fatalf("bare domain must not match *.tenant.example.com: %d", s)
	}
	// by-regex protects PUT /items/7 (the default policy would not).
	put := func(path string) harness.Reply {
		return env.Do(http.MethodPut, path, `{"v":1}`, 0, "Idempotency-Key", "put-1")
	}
	first := put("/items/7")
	wantReplayOf(t, put("/items/7"), first)
	if r := put("/items/abc"); r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("/items/abc does not match the regex and is not protected")
	}
	// by-exact protects DELETE /carts/current only.
	del := env.Do(http.MethodDelete, "/carts/current", "", 0, "Idempotency-Key", "del-1")
	wantReplayOf(t, env.Do(http.MethodDelete, "/carts/current", "", 0, "Idempotency-Key", "del-1"), del)
	// The same key under two policies names two operations.
	a := env.Post("/payments", "shared-key", `{}`)
	b := env.Post("/orders", "shared-key", `{}`)
	if a.Status != http.StatusCreated || b.Status != http.StatusCreated || b.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("a policy must not replay another policy's record: %d %d %v", a.Status, b.Status, b.Header)
	}
}

func TestKeyRules(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, `
policies:
  - name: strict
    match: {methods: [POST]}
    key: {required: true, max_length: 8, header: x-operation-id}
`)})
	wantProblem(t, env.Post("/orders", "", `{}`), problem.KeyMissing)
	wantProblem(t, env.Do(http.MethodPost, "/orders", `{}`, 0, "X-Operation-Id", "123456789"), problem.KeyInvalid)
	first := env.Do(http.MethodPost, "/orders", `{}`, 0, "X-Operation-Id", "12345678")
	wantStatus(t, first, http.StatusCreated)
	wantReplayOf(t, env.Do(http.MethodPost, "/orders", `{}`, 0, "X-Operation-Id", "12345678"), first)
	// The Idempotency-Key header means nothing to this policy.
	wantProblem(t, env.Post("/orders", "12345678", `{}`), problem.KeyMissing)
	if n := len(env.Upstream.Effects()); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

func TestPerPolicyLimitsAndTimes(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, `
defaults:
  retention: 2s
  lease: 1s
  retry_after: 3s
  max_stored_body: 100
  max_request_body: 64
`)})
	// Retry-After as configured.
	done := make(chan harness.Reply, 1)
	go func() { done <- env.Post("/orders", "ra", `{}`, "x-upstream-delay", "400ms") }()
	testwait.For(t, func() bool { return recordState(t, env, "ra") != 0 })
	r := env.Post("/orders", "ra", `{}`)
	wantProblem(t, r, problem.InProgress)
	if r.Header.Get("Retry-After") != "3" {
		t.Fatalf("Retry-After %q, want 3", r.Header.Get("Retry-After"))
	}
	<-done
	// max_request_body.
	wantProblem(t, env.Post("/orders", "big-req", strings.Repeat("x", 65)), problem.BodyTooLarge)
	// max_stored_body: the upstream's ~150-byte answer is not kept.
	first := env.Post("/orders", "big-resp", `{}`, "x-upstream-size", "150")
	wantStatus(t, first, http.StatusCreated)
	again := env.Post("/orders", "big-resp", `{}`, "x-upstream-size", "150")
	if again.Header.Get("Idempotent-Body-Omitted") != "true" || again.Body != "" {
		t.Fatalf("replay of an over-limit body: %v %q", again.Header, again.Body)
	}
	// retention: after it the key is free again.
	time.Sleep(2100 * time.Millisecond)
	r = env.Post("/orders", "big-resp", `{"new":"operation"}`)
	if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after retention the key must be new: %d %v", r.Status, r.Header)
	}
}

// TestFailOpenAndClosedPerPolicy: with Redis down, a fail_open policy lets
// requests through unprotected and a fail_closed one answers 503; both
// recover when Redis is back.
func TestFailOpenAndClosedPerPolicy(t *testing.T) {
	env := harness.Start(t, harness.Options{StoreTimeout: 200 * time.Millisecond, Policies: policies(t, `
policies:
  - name: open
    match: {path: {prefix: /open}, methods: [POST]}
    store_failure: fail_open
  - name: closed
    match: {path: {prefix: /closed}, methods: [POST]}
    store_failure: fail_closed
`)})
	env.Redis.Kill()
	for range 2 {
		wantStatus(t, env.Post("/open", "k-open", `{}`), http.StatusCreated)
	}
	if n := env.Upstream.CountKey("k-open"); n != 2 {
		t.Fatalf("fail_open: effects = %d, want 2 (unprotected while Redis is down)", n)
	}
	wantProblem(t, env.Post("/closed", "k-closed", `{}`), problem.StoreUnavailable)
	env.Redis.Restart()
	testwait.For(t, func() bool { return env.Store.Ping(context.Background()) == nil })
	for _, path := range []string{"/open", "/closed"} {
		first := env.Post(path, "after", `{}`)
		wantStatus(t, first, http.StatusCreated)
		wantReplayOf(t, env.Post(path, "after", `{}`), first)
	}
}

// tenantEnv scopes keys by each kind of trusted source.
func tenantEnv(t *testing.T, scope string) *harness.Env {
	cfg := envoysim.RecommendedConfig()
	// The recommended filter asks for the URI SAN; a policy reading the DNS
	// SAN or the subject needs its attribute too.
	cfg.RequestAttributes = append(cfg.RequestAttributes, "connection.dns_san_peer_certificate", "connection.subject_peer_certificate")
	cfg.MetadataOptions = &extprocfilterv3.MetadataOptions{ForwardingNamespaces: &extprocfilterv3.MetadataOptions_MetadataNamespaces{
		Untyped: []string{"envoy.filters.http.jwt_authn"},
	}}
	return harness.Start(t, harness.Options{
		Filter:   cfg,
		Policies: policies(t, "defaults:\n  scope:\n"+scope),
		// The test client names its tenant in x-test-tenant; the proxy
		// turns it into what Envoy would know: an mTLS principal, or a JWT
		// payload written by jwt_authn. A header scope is read directly.
		Decorate: func(r *http.Request, req *envoysim.Request) {
			tenant := r.Header.Get("x-test-tenant")
			if tenant == "" {
				return
			}
			req.PeerCertificate = &envoysim.PeerCertificate{
				URISANs: []string{"spiffe://example.org/tenant/" + tenant},
				DNSSANs: []string{tenant + ".tenants.example.org"},
				Subject: "CN=" + tenant + ",O=Example",
			}
			payload, _ := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": tenant}})
			req.DynamicMetadata = map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": payload}
		},
	})
}

// TestScopeNoneSharesOneKeySpace: with scope.from: none a key names one
// operation whatever host it arrives on (one API behind several names),
// where the default scope (the authority) keeps hosts apart.
func TestScopeNoneSharesOneKeySpace(t *testing.T) {
	for _, tc := range []struct {
		scope  string
		shared bool // the second host's request replays the first's
	}{
		{"none", true},
		{"authority", false},
	} {
		t.Run(tc.scope, func(t *testing.T) {
			env := harness.Start(t, harness.Options{Policies: policies(t, "defaults:\n  scope: {from: "+tc.scope+"}\n")})
			first := env.Post("/orders", "shared-1", `{}`, "Host", "api.example.com")
			wantStatus(t, first, http.StatusCreated)
			other := env.Post("/orders", "shared-1", `{}`, "Host", "api.example.net")
			if tc.shared {
				wantReplayOf(t, other, first)
			} else {
				wantStatus(t, other, http.StatusCreated)
				if other.Header.Get("Idempotent-Replayed") != "" {
					t.Fatal("another authority's record was replayed")
				}
			}
			want := 2
			if tc.shared {
				want = 1
			}
			if n := env.Upstream.CountKey("shared-1"); n != want {
				t.Fatalf("effects %d, want %d", n, want)
			}
		})
	}
}

// TestTenantsAreIsolated: two tenants using the same key get two
// independent records; neither can receive, block or overwrite the other's.
func TestTenantsAreIsolated(t *testing.T) {
	for name, scope := range map[string]string{
		"header":            "    from: header\n    header: x-test-tenant\n",
		"metadata":          "    from: metadata\n    metadata: {namespace: envoy.filters.http.jwt_authn, path: [jwt_payload, sub]}\n",
		"principal":         "    from: principal\n",
		"principal dns_san": "    from: principal\n    peer_identity: dns_san\n",
		"principal subject": "    from: principal\n    peer_identity: subject\n",
	} {
		t.Run(name, func(t *testing.T) {
			env := tenantEnv(t, scope)
			as := func(tenant, body string, extra ...string) harness.Reply {
				return env.Post("/orders", "same-key", body, append([]string{"x-test-tenant", tenant}, extra...)...)
			}
			// A's first attempt is still running: B is not blocked by it.
			aDone := make(chan harness.Reply, 1)
			go func() { aDone <- as("alice", `{"owner":"alice"}`, "x-upstream-delay", "400ms") }()
			testwait.For(t, func() bool { return reservedCount(t, env) == 1 })
			b := as("bob", `{"owner":"bob"}`)
			wantStatus(t, b, http.StatusCreated)
			a := <-aDone
			wantStatus(t, a, http.StatusCreated)
			// Each replays its own answer, never the other's.
			wantReplayOf(t, as("alice", `{"owner":"alice"}`), a)
			wantReplayOf(t, as("bob", `{"owner":"bob"}`), b)
			if a.Body == b.Body {
				t.Fatal("the two tenants got the same answer")
			}
			// B reusing the key with A's body is a new operation for B's
			// record, which says mismatch: it never sees A's record.
			wantProblem(t, as("bob", `{"owner":"alice"}`), problem.KeyReused)
			if n := env.Upstream.CountKey("same-key"); n != 2 {
				t.Fatalf("effects = %d, want one per tenant", n)
			}
			// No principal: 401, and no record is touched.
			before := reservedCount(t, env)
			wantProblem(t, env.Post("/orders", "same-key", `{}`), problem.PrincipalMissing)
			if reservedCount(t, env) != before {
				t.Fatal("a request without a principal created a record")
			}
		})
	}
}

func TestFingerprintSettings(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, `
defaults:
  fingerprint:
    headers: [content-type, x-api-version]
    json: true
`)})
	first := env.Post("/orders", "fp", `{"amount":100,"item":"book"}`, "X-Api-Version", "2")
	wantStatus(t, first, http.StatusCreated)
	// Re-serialised by the client: same operation.
	wantReplayOf(t, env.Post("/orders", "fp", "{\n  \"item\": \"book\",\n  \"amount\": 100\n}", "X-Api-Version", "2"), first)
	// A chosen header differs: another operation.
	wantProblem(t, env.Post("/orders", "fp", `{"amount":100,"item":"book"}`, "X-Api-Version", "3"), problem.KeyReused)
	// A number differs: another operation.
	wantProblem(t, env.Post("/orders", "fp", `{"amount":1000,"item":"book"}`, "X-Api-Version", "2"), problem.KeyReused)
	// A header outside the chosen set does not matter.
	wantReplayOf(t, env.Post("/orders", "fp", `{"item":"book","amount":100}`, "X-Api-Version", "2", "X-Trace", "t2"), first)
}

func TestResponseRulesPerPolicy(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, `
policies:
  - name: strict
    match: {path: {prefix: /strict}}
    responses:
      - {status: 5xx, action: unknown}
      - {status: 409, action: release}
    on_stream_reset: release
  - name: lenient
    match: {path: {prefix: /lenient}}
    responses:
      - {status: 500-503, action: release}
`)})
	wantStatus(t, env.Post("/strict", "r500", `{}`, "x-upstream-status", "500"), 500)
	wantProblem(t, env.Post("/strict", "r500", `{}`), problem.OutcomeUnknown)
	wantStatus(t, env.Post("/strict", "r409", `{}`, "x-upstream-status", "409"), 409)
	wantStatus(t, env.Post("/strict", "r409", `{}`), http.StatusCreated)
	wantStatus(t, env.Post("/lenient", "r503", `{}`, "x-upstream-status", "503"), 503)
	wantStatus(t, env.Post("/lenient", "r503", `{}`), http.StatusCreated)
	// The defaults still cover what the policy leaves out.
	wantStatus(t, env.Post("/lenient", "r201", `{}`), http.StatusCreated)
	if r := env.Post("/lenient", "r201", `{}`); r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("a 201 must still be stored")
	}
	// on_stream_reset: release lets the retry run.
	if err := env.Abandon("/strict", "reset", `{}`); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, func() bool {
		return env.Upstream.CountKey("reset") == 1 && reservedCountFor(t, env, "strict", "reset") == 0
	})
	wantStatus(t, env.Post("/strict", "reset", `{}`), http.StatusCreated)
}

func reservedCountFor(t *testing.T, env *harness.Env, pol, key string) int {
	t.Helper()
	_, err := env.Store.Get(context.Background(), idem.RecordIDFor(pol, strings.TrimPrefix(env.URL, "http://"), key))
	if err != nil {
		return 0
	}
	return 1
}

// TestLeaseExpiryPolicy: an attempt that vanished (its server crashed: the
// record is reserved and never renewed) is unknown by default, and run
// again under on_lease_expiry: reexecute.
func TestLeaseExpiryPolicy(t *testing.T) {
	for _, tc := range []struct {
		expiry  string
		want    int
		effects int
	}{
		{"unknown", http.StatusConflict, 0},
		{"reexecute", http.StatusCreated, 1},
	} {
		t.Run(tc.expiry, func(t *testing.T) {
			env := harness.Start(t, harness.Options{Policies: policies(t, "defaults:\n  lease: 200ms\n  on_lease_expiry: "+tc.expiry+"\n")})
			// A crashed server's reservation: reserved, then nothing.
			authority := strings.TrimPrefix(env.URL, "http://")
			crashed := idem.Reservation{
				ID: idem.RecordIDFor("default", authority, "vanished"), Token: idem.NewToken(),
				Fingerprint: fingerprintOf(`{}`, "/orders"), Lease: 200 * time.Millisecond, Retention: time.Hour,
			}
			if _, err := env.Store.Reserve(context.Background(), crashed); err != nil {
				t.Fatal(err)
			}
			time.Sleep(400 * time.Millisecond)
			r := env.Post("/orders", "vanished", `{}`)
			if r.Status != tc.want {
				t.Fatalf("after the lease: %d %s, want %d", r.Status, r.Body, tc.want)
			}
			if tc.want == http.StatusConflict {
				wantProblem(t, r, problem.OutcomeUnknown)
			}
			if n := env.Upstream.CountKey("vanished"); n != tc.effects {
				t.Fatalf("effects = %d, want %d", n, tc.effects)
			}
		})
	}
}

// TestStoredHeadersDeny: denied headers are neither stored nor replayed.
func TestStoredHeadersDeny(t *testing.T) {
	env := harness.Start(t, harness.Options{Policies: policies(t, "defaults:\n  stored_headers: {deny: [set-cookie, x-multi]}\n")})
	first := env.Post("/orders", "cookie", `{}`, "x-upstream-set-cookie", "session=abc")
	if first.Header.Get("Set-Cookie") != "session=abc" {
		t.Fatal("the first answer passes the upstream's cookie")
	}
	again := env.Post("/orders", "cookie", `{}`, "x-upstream-set-cookie", "session=abc")
	if again.Header.Get("Idempotent-Replayed") != "true" || again.Header.Get("Set-Cookie") != "" || again.Header.Get("X-Multi") != "" {
		t.Fatalf("replay headers %v", again.Header)
	}
	if again.Header.Get("Location") != first.Header.Get("Location") {
		t.Fatal("other headers are replayed")
	}
}

// fingerprintOf is the fingerprint the server computes for a POST the
// harness sends with a JSON body.
func fingerprintOf(body, path string) idem.Fingerprint {
	return fingerprint.Compute(fingerprint.Request{
		Method:  http.MethodPost,
		Path:    path,
		Headers: []idem.Header{{Name: "content-type", Value: "application/json"}},
		Body:    []byte(body),
	}, []string{"content-type"})
}

// TestResponseRulesByOrigin: a rule may single out Envoy's own replies,
// told apart by the response.code_details and response.flags attributes.
func TestResponseRulesByOrigin(t *testing.T) {
	for _, b := range localReplyBehaviours {
		t.Run(b.name, func(t *testing.T) {
			env := harness.Start(t, harness.Options{RouteTimeout: 100 * time.Millisecond, FilterOptions: b.opts, Policies: policies(t, `
defaults:
  responses:
    - {status: 504, origin: envoy_maybe_sent, action: release}
`)})
			// Envoy's own 504 (route timeout): released by the rule, so the
			// retry runs, where the server sees it (1.37+); on 1.34-1.36 it
			// never does, and the stream's end leaves the outcome unknown.
			wantStatus(t, env.Post("/orders", "envoy-504", `{}`, "x-upstream-delay", "300ms"), http.StatusGatewayTimeout)
			if b.seen {
				wantStatus(t, env.Post("/orders", "envoy-504", `{}`), http.StatusCreated)
			} else {
				testwait.For(t, func() bool { return recordState(t, env, "envoy-504") == idem.StateUnknown })
				wantProblem(t, env.Post("/orders", "envoy-504", `{}`), problem.OutcomeUnknown)
			}
			// The upstream's own 504 is stored either way.
			first := env.Post("/orders", "app-504", `{}`, "x-upstream-status", "504")
			wantStatus(t, first, http.StatusGatewayTimeout)
			wantReplayOf(t, env.Post("/orders", "app-504", `{}`), first)
		})
	}
}

package e2e

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// localReplyBehaviours are the two ways Envoy treats its own local replies:
// 1.37+ passes them through ext_proc's response phases (and closes the gRPC
// stream as soon as no later phase needs the server); 1.34-1.36 skips them
// (runtime skip_ext_proc_on_local_reply), so the server only sees the
// stream end.
var localReplyBehaviours = []struct {
	name string
	opts envoysim.Options
	// seen: the server sees the local reply's response headers.
	seen bool
}{
	{"1.37+ pass through", envoysim.Options{CloseStreamEarly: true}, true},
	{"1.34-1.36 skip", envoysim.Options{SkipLocalReplies: true}, false},
}

// exchange sends one protected POST straight through the filter to up.
func exchange(env *harness.Env, key string, up envoysim.Upstream) *envoysim.Result {
	req := &envoysim.Request{
		Method: http.MethodPost, Path: "/orders", Authority: strings.TrimPrefix(env.URL, "http://"),
		Headers: []envoysim.Header{{Name: "idempotency-key", Value: key}, {Name: "content-type", Value: "application/json"}},
		Body:    []byte(`{}`),
	}
	res := env.Filter.Do(context.Background(), req, up)
	env.Proxy.Observe(res)
	return res
}

func failWith(f *envoysim.UpstreamFailure) envoysim.Upstream {
	return func(context.Context, *envoysim.Request) (*envoysim.Response, error) { return nil, f }
}

// TestEnvoyLocalRepliesByOrigin runs every local reply envoysim models,
// with Envoy's real details and flags, on both local-reply behaviours:
// a reply that proves the request never reached the upstream releases the
// key where the server sees it; a reply after the request may have been
// sent, or one the server never sees, leaves the outcome unknown.
func TestEnvoyLocalRepliesByOrigin(t *testing.T) {
	for _, b := range localReplyBehaviours {
		t.Run(b.name, func(t *testing.T) {
			env := harness.Start(t, harness.Options{FilterOptions: b.opts})
			for _, tc := range []struct {
				name    string
				fail    *envoysim.UpstreamFailure
				notSent bool
			}{
				{"connect refused", envoysim.ConnectFailure, true},
				{"connect timeout", envoysim.ConnectTimeout, true},
				{"circuit breaker overflow", envoysim.UpstreamOverflow, true},
				{"no healthy upstream", envoysim.NoHealthyUpstream, true},
				{"rate limit", envoysim.RateLimited, true},
				{"local rate limit", envoysim.LocalRateLimited, true},
				{"RBAC", envoysim.RBACDenied("deny writes"), true},
				{"ext_authz", envoysim.ExtAuthzDenied, true},
				{"fault abort", envoysim.FaultAbort(503), true},
				{"route timeout", envoysim.UpstreamTimeout, false},
				{"reset after sending", envoysim.UpstreamReset, false},
				{"connection termination", envoysim.ConnectionTermination, false},
			} {
				t.Run(tc.name, func(t *testing.T) {
					key := strings.ReplaceAll(tc.name, " ", "-")
					res := exchange(env, key, failWith(tc.fail))
					if res.Response == nil || res.Response.Status != tc.fail.Status {
						t.Fatalf("the client got %v, want Envoy's %d", res, tc.fail.Status)
					}
					if tc.fail.Filter != "" && res.UpstreamCalled {
						t.Fatalf("a %s reply reached the router", tc.fail.Filter)
					}
					if got := res.Phases(); b.seen != (len(got) > 0 && got[len(got)-1] == envoysim.PhaseResponseHeaders) {
						t.Fatalf("response phase seen = %v, want %v: %v", !b.seen, b.seen, res)
					}
					if tc.notSent && b.seen {
						if retry := exchange(env, key, env.Proxy.Upstream); retry.Response.Status != http.StatusCreated {
							t.Fatalf("retry after %q got %v, want the operation to run", tc.fail.Details, retry)
						}
						return
					}
					// Unknown from the response headers, or, when Envoy
					// skipped them, from the stream's end, which may come
					// after the client has its answer.
					testwait.For(t, func() bool { return recordState(t, env, key) == idem.StateUnknown })
					retry := exchange(env, key, env.Proxy.Upstream)
					if retry.Response.Status != http.StatusConflict || !strings.Contains(string(retry.Response.Body), problem.OutcomeUnknown.Slug) {
						t.Fatalf("retry after %q got %v, want 409 %s", tc.fail.Details, retry, problem.OutcomeUnknown.Slug)
					}
				})
			}
		})
	}
}

// missingCount returns idem_extproc_missing_attribute_total for a policy
// and attribute.
func missingCount(t *testing.T, m *observe.Metrics, policyName, attr string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "idem_extproc_missing_attribute_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["policy"] == policyName && labels["attribute"] == attr {
				return s.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestMissingAttributesAreLoud: a filter that does not send what a policy
// needs is logged once per policy and counted on every request.
func TestMissingAttributesAreLoud(t *testing.T) {
	t.Run("response.code_details", func(t *testing.T) {
		var logs harness.LogBuffer
		m := observe.NewMetrics()
		cfg := envoysim.RecommendedConfig()
		cfg.ResponseAttributes = nil
		env := harness.Start(t, harness.Options{Filter: cfg, Metrics: m, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		// Envoy's own 504 cannot be told from the upstream's without the
		// details: it is stored (docs/design.md §4), but never silently.
		for _, key := range []string{"t1", "t2"} {
			if r := exchange(env, key, failWith(envoysim.UpstreamTimeout)); r.Response.Status != http.StatusGatewayTimeout {
				t.Fatalf("got %v", r)
			}
		}
		if n := missingCount(t, m, "default", envoyorigin.AttrCodeDetails); n != 2 {
			t.Fatalf("missing_attribute_total = %v, want 2", n)
		}
		// One warning per attribute, each once for the policy.
		lines := logLines(t, &logs, extproc.MissingAttributeMessage)
		if len(lines) != 2 || lines[0]["attribute"] != envoyorigin.AttrCodeDetails || lines[1]["attribute"] != envoyorigin.AttrAttemptCount {
			t.Fatalf("want one warning naming %s and one naming %s, got %v", envoyorigin.AttrCodeDetails, envoyorigin.AttrAttemptCount, lines)
		}
	})
	t.Run("upstream.request_attempt_count", func(t *testing.T) {
		// Without the attempt count a connection failure could follow a
		// retry whose first attempt reached the upstream: it is kept as
		// outcome unknown, never released, and counted.
		m := observe.NewMetrics()
		cfg := envoysim.RecommendedConfig()
		cfg.ResponseAttributes = []string{envoyorigin.AttrCodeDetails, envoyorigin.AttrFlags}
		env := harness.Start(t, harness.Options{Filter: cfg, Metrics: m, FilterOptions: envoysim.Options{CloseStreamEarly: true}})
		if r := exchange(env, "no-count", failWith(envoysim.ConnectFailure)); r.Response.Status != http.StatusServiceUnavailable {
			t.Fatalf("got %v", r)
		}
		if n := missingCount(t, m, "default", envoyorigin.AttrAttemptCount); n != 1 {
			t.Fatalf("missing_attribute_total = %v, want 1", n)
		}
		if st := recordState(t, env, "no-count"); st != idem.StateUnknown {
			t.Fatalf("record %v after a connection failure without the attempt count, want unknown", st)
		}
		// The upstream's own 429, which a single attempt's would release.
		tooMany := func(context.Context, *envoysim.Request) (*envoysim.Response, error) {
			return &envoysim.Response{Status: http.StatusTooManyRequests}, nil
		}
		if r := exchange(env, "no-count-429", tooMany); r.Response.Status != http.StatusTooManyRequests {
			t.Fatalf("got %v", r)
		}
		testwait.For(t, func() bool { return recordState(t, env, "no-count-429") == idem.StateUnknown })
	})
	t.Run("principal", func(t *testing.T) {
		m := observe.NewMetrics()
		cfg := envoysim.RecommendedConfig()
		cfg.RequestAttributes = []string{"xds.route_name"} // no peer certificate attribute
		env := harness.Start(t, harness.Options{Filter: cfg, Metrics: m,
			Policies: policies(t, "defaults:\n  scope: {from: principal}\n"),
			Decorate: func(_ *http.Request, req *envoysim.Request) {
				req.PeerCertificate = &envoysim.PeerCertificate{URISANs: []string{"spiffe://example.org/ns/a/sa/b"}}
			}})
		wantProblem(t, env.Post("/orders", "p1", `{}`), problem.PrincipalMissing)
		if n := missingCount(t, m, "default", envoyorigin.AttrURISanPeer); n != 1 {
			t.Fatalf("missing_attribute_total = %v, want 1", n)
		}
	})
	t.Run("xds.route_name", func(t *testing.T) {
		m := observe.NewMetrics()
		cfg := envoysim.RecommendedConfig()
		cfg.RequestAttributes = nil
		env := harness.Start(t, harness.Options{Filter: cfg, Metrics: m, Route: routeByPath,
			Policies: policies(t, "policies:\n  - name: orders\n    match: {route_names: [orders]}\n")})
		env.Post("/orders", "r1", `{}`)
		if n := missingCount(t, m, "orders", envoyorigin.AttrRouteName); n != 1 {
			t.Fatalf("missing_attribute_total = %v, want 1", n)
		}
	})
}

// TestReplaySurvivesEnvoysHeaderRules: a stored response with more headers
// than Envoy accepts in one mutation (an upstream cluster that raised its
// header limits) is still replayed with idempotent-replayed: the server
// leaves out what Envoy would refuse instead of losing the whole mutation.
// An empty body's replay loses content-type and content-length in Envoy.
func TestReplaySurvivesEnvoysHeaderRules(t *testing.T) {
	m := observe.NewMetrics()
	env := harness.Start(t, harness.Options{Metrics: m})
	many := func(context.Context, *envoysim.Request) (*envoysim.Response, error) {
		hs := []envoysim.Header{{Name: "content-type", Value: "application/json"}}
		for i := range 150 {
			hs = append(hs, envoysim.Header{Name: "x-h-" + strconv.Itoa(i), Value: "v"})
		}
		return &envoysim.Response{Status: http.StatusCreated, Headers: hs, Body: []byte(`{"order":1}`)}, nil
	}
	if r := exchange(env, "many-headers", many); r.Response.Status != http.StatusCreated {
		t.Fatalf("first attempt %v", r)
	}
	replay := exchange(env, "many-headers", env.Proxy.Upstream)
	if v, _ := envoysim.Get(replay.Response.Headers, "idempotent-replayed"); v != "true" || replay.ProcessingError != nil {
		t.Fatalf("the replay lost its marker: %v %v", replay, replay.ProcessingError)
	}
	if string(replay.Response.Body) != `{"order":1}` {
		t.Fatalf("replayed body %q", replay.Response.Body)
	}
	if n := droppedHeaders(t, m); n == 0 {
		t.Fatal("the dropped headers were not counted")
	}

	empty := func(context.Context, *envoysim.Request) (*envoysim.Response, error) {
		return &envoysim.Response{Status: http.StatusNoContent, Headers: []envoysim.Header{{Name: "content-type", Value: "application/json"}}}, nil
	}
	exchange(env, "no-body", empty)
	replay = exchange(env, "no-body", env.Proxy.Upstream)
	if _, ok := envoysim.Get(replay.Response.Headers, "content-type"); ok || replay.Response.Status != http.StatusNoContent {
		t.Fatalf("an empty replay keeps no content-type in Envoy: %v", replay.Response.Headers)
	}
}

func droppedHeaders(t *testing.T, m *observe.Metrics) float64 {
	t.Helper()
	return counterTotal(t, m, "idem_extproc_replay_headers_dropped_total")
}

// TestRouterRetriesNeverReleaseASentAttempt: the first attempt reaches the
// upstream, which runs the operation and then resets the stream; the router
// retries, and the request ends in a way that looks like a first attempt
// that never left (router.cc: the retry circuit breaker's refusal, a last
// reset retry_on does not cover, a retry that finds no host), or with the
// retry limit flag. The key must never be released: the operation ran, so
// a retry gets outcome-unknown and the upstream runs once.
func TestRouterRetriesNeverReleaseASentAttempt(t *testing.T) {
	onlyResets := func(f *envoysim.UpstreamFailure, _ *envoysim.Response) bool { return f == envoysim.UpstreamReset }
	refused := func() (*envoysim.Response, error) { return nil, envoysim.ConnectFailure }
	// The upstream's own 429 on the retry: the default rules release a 429
	// of a single attempt, never one after a retry.
	tooMany := func() (*envoysim.Response, error) {
		return &envoysim.Response{Status: http.StatusTooManyRequests, Body: []byte("slow down")}, nil
	}
	for _, tc := range []struct {
		name   string
		policy *envoysim.RetryPolicy
		later  func() (*envoysim.Response, error)
		status int
	}{
		{"retry circuit breaker refuses", &envoysim.RetryPolicy{NumRetries: 3, OverflowAfter: 2}, refused, 503},
		{"last reset not retriable", &envoysim.RetryPolicy{NumRetries: 3, RetryOn: onlyResets}, refused, 503},
		{"retry finds no host", &envoysim.RetryPolicy{NumRetries: 3, NoHostAt: 2}, refused, 503},
		{"retries exhausted", &envoysim.RetryPolicy{NumRetries: 2}, refused, 503},
		{"the upstream's 429 on the retry", &envoysim.RetryPolicy{NumRetries: 3, RetryOn: onlyResets}, tooMany, 429},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := harness.Start(t, harness.Options{FilterOptions: envoysim.Options{CloseStreamEarly: true}})
			key := strings.ReplaceAll(tc.name, " ", "-")
			runs := 0
			up := func(ctx context.Context, r *envoysim.Request) (*envoysim.Response, error) {
				if r.Attempt > 1 {
					return tc.later()
				}
				// The operation runs; its answer is lost to a reset.
				runs++
				if _, err := env.Proxy.Upstream(ctx, r); err != nil {
					t.Errorf("upstream: %v", err)
				}
				return nil, envoysim.UpstreamReset
			}
			req := &envoysim.Request{
				Method: http.MethodPost, Path: "/orders", Authority: strings.TrimPrefix(env.URL, "http://"),
				Headers: []envoysim.Header{{Name: "idempotency-key", Value: key}, {Name: "content-type", Value: "application/json"}},
				Body:    []byte(`{}`), Retry: tc.policy,
			}
			res := env.Filter.Do(context.Background(), req, up)
			if res.Response == nil || res.Response.Status != tc.status || res.UpstreamAttempts < 2 {
				t.Fatalf("the client got %v after %d attempts, want %d after a retry", res, res.UpstreamAttempts, tc.status)
			}
			testwait.For(t, func() bool { return recordState(t, env, key) == idem.StateUnknown })
			retry := exchange(env, key, func(ctx context.Context, r *envoysim.Request) (*envoysim.Response, error) {
				runs++
				return env.Proxy.Upstream(ctx, r)
			})
			if retry.Response.Status != http.StatusConflict || !strings.Contains(string(retry.Response.Body), problem.OutcomeUnknown.Slug) {
				t.Fatalf("retry got %v, want 409 %s", retry, problem.OutcomeUnknown.Slug)
			}
			if runs != 1 {
				t.Fatalf("the operation ran %d times, want once", runs)
			}
		})
	}
}

// TestEmptyDetailsAreNotTheUpstream: a filter after ext_proc (a Wasm or Go
// filter) refuses the request with sendLocalReply and empty details. Only
// the router writes via_upstream, so the refusal is not stored as the
// operation's answer to be replayed for the whole retention: the outcome
// is unknown, which an operator can resolve.
func TestEmptyDetailsAreNotTheUpstream(t *testing.T) {
	env := harness.Start(t, harness.Options{FilterOptions: envoysim.Options{CloseStreamEarly: true}})
	refusal := &envoysim.UpstreamFailure{Status: http.StatusForbidden, Body: "denied by a Wasm filter", Filter: "wasm"}
	if r := exchange(env, "wasm-denied", failWith(refusal)); r.Response.Status != http.StatusForbidden {
		t.Fatalf("got %v", r)
	}
	if st := recordState(t, env, "wasm-denied"); st != idem.StateUnknown {
		t.Fatalf("record %v after a filter's refusal with empty details, want unknown (never stored as the upstream's answer)", st)
	}
}

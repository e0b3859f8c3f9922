package daemon_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// TestDecisionLogsNameTheMetricsDecision: the "decision" log line of a
// replay says "replayed", as decisions_total does, not the record's state
// ("completed").
func TestDecisionLogsNameTheMetricsDecision(t *testing.T) {
	r := run(t)
	for range 2 {
		if rep := r.env.Post("/orders", "replay-log-1", `{}`); rep.Status >= 300 {
			t.Fatalf("POST = %d %s", rep.Status, rep.Body)
		}
	}
	var decisions []string
	for _, line := range strings.Split(strings.TrimSpace(r.logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "decision" {
			decisions = append(decisions, m["decision"].(string))
		}
	}
	if strings.Join(decisions, ",") != "reserved,replayed" {
		t.Fatalf("decision log lines say %q, want reserved then replayed", decisions)
	}
}

// TestHelpSaysWhatTheFlagsDo: --help tells what docs/flags.md's flag table
// tells for the flags whose help fell short of it.
func TestHelpSaysWhatTheFlagsDo(t *testing.T) {
	var usage strings.Builder
	_, _ = daemon.ParseConfig([]string{"-h"}, func(string) string { return "" }, &usage)
	help := map[string]string{}
	var name string
	for _, line := range strings.Split(usage.String(), "\n") {
		if f, ok := strings.CutPrefix(strings.TrimSpace(line), "-"); ok && !strings.HasPrefix(line, "    ") {
			name = strings.Fields(f)[0]
			continue
		}
		help[name] += strings.TrimSpace(line) + " "
	}
	for flag, wants := range map[string][]string{
		"admin-listen":     {"/healthz", "/readyz", "/metrics", "admin API", "empty: none"},
		"store-timeout":    {"each store call", "store failure", "message_timeout"},
		"max-message-size": {"at least 1048576"},
	} {
		for _, want := range wants {
			if !strings.Contains(help[flag], want) {
				t.Errorf("--%s help %q does not say %q", flag, help[flag], want)
			}
		}
	}
}

// TestBodyOmittedWhenTheBodyNeverArrived: when the client goes away after
// the response headers, before the body (Envoy then resets the side
// stream), the record completes without its body, and the replay says so
// with Idempotent-Body-Omitted, as README and docs/problems.md describe.
func TestBodyOmittedWhenTheBodyNeverArrived(t *testing.T) {
	r := run(t)
	res := r.env.Exchange(&envoysim.Request{Method: http.MethodPost, Path: "/orders",
		Authority: strings.TrimPrefix(r.env.URL, "http://"),
		Headers:   []envoysim.Header{{Name: "idempotency-key", Value: "gone-1"}, {Name: "content-type", Value: "application/json"}},
		Body:      []byte(`{}`), ResetAfter: envoysim.PhaseResponseHeaders})
	if res.Response != nil {
		t.Fatalf("the client should have gone: %+v", res.Response)
	}
	// The record is settled after the stream ends, off the request's path:
	// retry once it is, not before (a retry before it is told 409).
	id := idem.RecordIDFor("default", strings.TrimPrefix(r.env.URL, "http://"), "gone-1")
	testwait.Until(t, "the record completed", func() bool {
		rec, err := r.env.Store.Get(context.Background(), id)
		return err == nil && rec.State == idem.StateCompleted
	})
	rep := r.env.Post("/orders", "gone-1", `{}`)
	if rep.Status != http.StatusCreated || rep.Header.Get("Idempotent-Replayed") != "true" ||
		rep.Header.Get("Idempotent-Body-Omitted") != "true" || rep.Body != "" {
		t.Fatalf("retry = %d %v %q, want the replay of a 201 without its body", rep.Status, rep.Header, rep.Body)
	}
	if n := r.env.Upstream.CountKey("gone-1"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

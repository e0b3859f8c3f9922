package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/idemclient"
)

// TestRun: the example reports a fresh answer, a replay, and the
// outcome-unknown stop in words a caller can act on.
func TestRun(t *testing.T) {
	var calls int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		switch r.Header.Get(idemclient.KeyHeader) {
		case `"unknown"`:
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(409)
			_, _ = w.Write([]byte(`{"type":"` + idemclient.ProblemType("outcome-unknown") + `","status":409}`))
		case `"again"`:
			w.Header().Set(idemclient.ReplayedHeader, "true")
			w.WriteHeader(201)
		default:
			w.WriteHeader(201)
		}
	}))
	defer srv.Close()
	var out, errs bytes.Buffer
	if err := run(context.Background(), []string{"-url", srv.URL}, &out, &errs); err != nil || !strings.Contains(out.String(), "201 after 1 attempt(s)\n") {
		t.Fatalf("fresh: %v, %q", err, out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"-url", srv.URL, "-key", "again"}, &out, &errs); err != nil || !strings.Contains(out.String(), "replayed") {
		t.Fatalf("replay: %v, %q", err, out.String())
	}
	err := run(context.Background(), []string{"-url", srv.URL, "-key", "unknown"}, &out, &errs)
	if !errors.Is(err, idemclient.ErrOutcomeUnknown) || calls != 3 {
		t.Fatalf("unknown: %v after %d calls", err, calls)
	}
}

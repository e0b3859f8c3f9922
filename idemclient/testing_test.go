package idemclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// fakeClock is the transport's clock in tests: sleeping advances it at
// once, so waits are asserted exactly and no test depends on speed.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	slept  []time.Duration
	ceils  []time.Duration
	jitter func(ceil time.Duration) time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	c.now = c.now.Add(d)
	return ctx.Err()
}

func (c *fakeClock) Jitter(ceil time.Duration) time.Duration {
	c.mu.Lock()
	c.ceils = append(c.ceils, ceil)
	j := c.jitter
	c.mu.Unlock()
	if j != nil {
		return j(ceil)
	}
	return ceil
}

func (c *fakeClock) Slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.slept...)
}

// newTestTransport is New(o) on a fake clock.
func newTestTransport(o Options) (*Transport, *fakeClock) {
	t := New(o)
	c := newFakeClock()
	t.now, t.sleep, t.jitter = c.Now, c.Sleep, c.Jitter
	return t, c
}

// seen is one request as the test server received it.
type seen struct {
	Key, RequestID, Attempt, Body string
}

// script is a test server answering the nth request with answers[n]
// (the last one repeats) and recording every request.
type script struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []seen
}

type answer func(w http.ResponseWriter, r *http.Request)

func newScript(t *testing.T, answers ...answer) *script {
	t.Helper()
	s := &script{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.got)
		s.got = append(s.got, seen{r.Header.Get(KeyHeader), r.Header.Get(RequestIDHeader), r.Header.Get(AttemptHeader), string(body)})
		s.mu.Unlock()
		answers[min(n, len(answers)-1)](w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *script) Seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.got...)
}

func status(code int, headers ...string) answer {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"status":%d}`, code)
	}
}

// prob answers an idem-extproc problem of kind k (slug is its type's tail
// unless typ overrides the whole type URI).
func prob(k problem.Kind, headers ...string) answer {
	return probType(k.Status, problem.TypeBase+k.Slug, headers...)
}

func probType(code int, typ string, headers ...string) answer {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.Header().Set("Content-Type", problem.ContentType)
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"type":%q,"title":"t","status":%d,"detail":"d"}`, typ, code)
	}
}

// post builds a POST with key (none when "") and a resendable body.
func post(t *testing.T, ctx context.Context, url, key, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// malformedProblem answers a problem content type with a body that is not
// a problem document.
func malformedProblem(code int) answer {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", problem.ContentType+"; charset=utf-8")
		w.WriteHeader(code)
		fmt.Fprint(w, "<html>busy</html>")
	}
}

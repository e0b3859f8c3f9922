package idemclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// attemptContexts is a base transport that records each attempt's request
// context, so a test can see when the transport releases it.
type attemptContexts struct {
	base http.RoundTripper
	mu   sync.Mutex
	ctxs []context.Context
}

func (a *attemptContexts) RoundTrip(r *http.Request) (*http.Response, error) {
	a.mu.Lock()
	a.ctxs = append(a.ctxs, r.Context())
	a.mu.Unlock()
	return a.base.RoundTrip(r)
}

func (a *attemptContexts) last(t *testing.T) context.Context {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.ctxs) == 0 {
		t.Fatal("no attempt was sent")
	}
	return a.ctxs[len(a.ctxs)-1]
}

// TestAttemptTimeoutSparesTheBody: a server that sends its headers at once
// and then streams the body slower than AttemptTimeout. The write
// succeeded: its answer must reach the caller whole, in one attempt; the
// attempt timeout bounds only the wait for the headers.
//
// The pause between the two halves lasts until the server sees the
// connection closed under it (which is what a timeout covering the body
// did) or for twenty times AttemptTimeout, whichever comes first: the test
// cannot fail on a slow machine, only on a connection cut.
func TestAttemptTimeoutSparesTheBody(t *testing.T) {
	const attemptTO = 50 * time.Millisecond
	more, cut := make(chan struct{}), make(chan struct{})
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		requests.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "first half, ")
		_ = http.NewResponseController(w).Flush()
		select {
		case <-more:
		case <-r.Context().Done():
			close(cut)
			return
		}
		_, _ = io.WriteString(w, "second half")
	}))
	t.Cleanup(srv.Close)
	c := NewClient(Options{AttemptTimeout: attemptTO, Base: freshConns(t)})

	resp, err := c.Do(post(t, context.Background(), srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("first half, "))
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatalf("first half: %v", err)
	}
	select {
	case <-cut:
	case <-time.After(20 * attemptTO):
	}
	close(more)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(first)+string(rest) != "first half, second half" {
		t.Fatalf("body %q + %q, err %v; want the whole body", first, rest, err)
	}
	if resp.StatusCode != http.StatusCreated || Attempts(resp) != 1 || requests.Load() != 1 {
		t.Fatalf("status %d, attempt %d, %d requests", resp.StatusCode, Attempts(resp), requests.Load())
	}
}

// TestAttemptTimeoutCutsStalledHeaders: a server that reads the request
// and never answers is still cut by AttemptTimeout, and the error says it
// was a timeout (context.DeadlineExceeded).
func TestAttemptTimeoutCutsStalledHeaders(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	tr, _ := newTestTransport(Options{AttemptTimeout: 50 * time.Millisecond, Base: freshConns(t)})
	_, err := (&http.Client{Transport: tr}).Do(post(t, context.Background(), srv.URL, "", "b"))
	var e *Error
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &e) || e.Attempts != 1 {
		t.Fatalf("err %v; want an *Error after one attempt that is a timeout", err)
	}
}

// TestAttemptContextReleasedAtEOF: the attempt's context (and its timer) is
// released as soon as the caller has read the body to its end, even before
// Close, and by Close alone; a body-less answer releases it at once.
func TestAttemptContextReleasedAtEOF(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/empty" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	}))
	t.Cleanup(srv.Close)
	base := &attemptContexts{base: http.DefaultTransport}
	tr, _ := newTestTransport(Options{AttemptTimeout: time.Hour, Base: base})

	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "created" {
		t.Fatalf("body %q, %v", b, err)
	}
	if base.last(t).Err() == nil {
		t.Fatal("the attempt's context is still held after the body was read to its end")
	}
	_ = resp.Body.Close()

	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL, "k2", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if base.last(t).Err() != nil {
		t.Fatal("the attempt's context ended before the body was read")
	}
	_ = resp.Body.Close()
	if base.last(t).Err() == nil {
		t.Fatal("the attempt's context is still held after Close")
	}

	resp, err = tr.RoundTrip(post(t, context.Background(), srv.URL+"/empty", "k3", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusNoContent || base.last(t).Err() == nil {
		t.Fatalf("status %d: the attempt's context is still held for a body-less answer", resp.StatusCode)
	}
	_ = resp.Body.Close()
}

// fakeTimers replaces the attempt timer: each timer is recorded, fires
// only when the test says so, and reports whether it was stopped.
type fakeTimers struct {
	mu     sync.Mutex
	timers []*fakeTimer
	// expireAtStart lists timers (by order of creation, from 0) that
	// expire as soon as they are made.
	expireAtStart map[int]bool
}

type fakeTimer struct {
	d                time.Duration
	f                func()
	stopped, expired bool
}

func (ft *fakeTimers) afterFunc(d time.Duration, f func()) func() bool {
	ft.mu.Lock()
	tm := &fakeTimer{d: d, f: f, expired: ft.expireAtStart[len(ft.timers)]}
	ft.timers = append(ft.timers, tm)
	ft.mu.Unlock()
	if tm.expired {
		f() // unlocked, as time.AfterFunc's f runs
	}
	return func() bool {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		active := !tm.stopped && !tm.expired
		tm.stopped = true
		return active
	}
}

// fire expires the last timer as time.AfterFunc would: unless stopped.
func (ft *fakeTimers) fire() {
	ft.mu.Lock()
	tm := ft.timers[len(ft.timers)-1]
	run := !tm.stopped && !tm.expired
	tm.expired = true
	ft.mu.Unlock()
	if run {
		tm.f()
	}
}

func (ft *fakeTimers) snapshot() []fakeTimer {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var out []fakeTimer
	for _, tm := range ft.timers {
		out = append(out, *tm)
	}
	return out
}

// TestAttemptTimerStoppedAtHeaders: every attempt's timer is stopped as
// soon as its headers are in (not left to fire later), the returned one's
// before the caller reads a byte of the body; so is the timer bounding the
// drain of the answer retried past.
func TestAttemptTimerStoppedAtHeaders(t *testing.T) {
	s := newScript(t, status(503), status(201))
	tr, _ := newTestTransport(Options{AttemptTimeout: time.Minute})
	ft := &fakeTimers{}
	tr.afterFunc = ft.afterFunc
	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	timers := ft.snapshot()
	if len(timers) != 3 {
		t.Fatalf("%d timers; want the first attempt's, its drain's, the second attempt's", len(timers))
	}
	for i, tm := range timers {
		if tm.d != time.Minute || !tm.stopped || tm.expired {
			t.Fatalf("timer %d: %+v; want AttemptTimeout, stopped", i, tm)
		}
	}
	if body := readAll(t, resp); body != `{"status":201}` {
		t.Fatalf("body %q", body)
	}
}

// closeRecorder records whether a response body was closed.
type closeRecorder struct {
	io.ReadCloser
	closed atomic.Bool
}

func (c *closeRecorder) Close() error {
	c.closed.Store(true)
	return c.ReadCloser.Close()
}

// TestAttemptTimeoutRacingHeaders: when the timer fires just as the base
// transport returns the headers, the attempt's context is already cancelled
// and its body cut, so the attempt is a timeout: the response is closed, a
// keyed request is retried with its key, a keyless one ends with an error
// that matches context.DeadlineExceeded.
func TestAttemptTimeoutRacingHeaders(t *testing.T) {
	s := newScript(t, status(201))
	ft := &fakeTimers{}
	var bodies []*closeRecorder
	var calls atomic.Int32
	base := freshConns(t)
	tr, _ := newTestTransport(Options{AttemptTimeout: time.Minute, Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(r)
		if calls.Add(1) == 1 && err == nil {
			cr := &closeRecorder{ReadCloser: resp.Body}
			bodies = append(bodies, cr)
			resp.Body = cr
			ft.fire()
		}
		return resp, err
	})})
	tr.afterFunc = ft.afterFunc

	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 201 || Attempts(resp) != 2 || len(s.Seen()) != 2 || !bodies[0].closed.Load() {
		t.Fatalf("status %d, attempt %d, %d requests, first body closed %v", resp.StatusCode, Attempts(resp), len(s.Seen()), bodies[0].closed.Load())
	}

	calls.Store(0)
	_, err = tr.RoundTrip(post(t, context.Background(), s.srv.URL, "", "b"))
	var e *Error
	var te *attemptTimeoutError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &e) || e.Attempts != 1 || !errors.As(err, &te) || !bodies[1].closed.Load() {
		t.Fatalf("keyless: err %v; want an *Error after one attempt, a timeout", err)
	}
}

// TestRetriedAnswerDrainBounded: the body of an answer the chain retries
// past is no one's; the transport drains it only so its connection can be
// reused, and for at most AttemptTimeout. A server that sends a 503's
// headers and then stalls its body does not hold the chain: the drain is
// cut and the retry goes out. The drain's timer is the second one made
// (after the first attempt's); it expires at once here, so the test does
// not wait on the clock.
func TestRetriedAnswerDrainBounded(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if n.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "partial")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done() // until the client cuts the connection
	}))
	t.Cleanup(srv.Close)
	ft := &fakeTimers{expireAtStart: map[int]bool{1: true}}
	tr, _ := newTestTransport(Options{AttemptTimeout: time.Minute, Base: freshConns(t)})
	tr.afterFunc = ft.afterFunc
	resp, err := tr.RoundTrip(post(t, context.Background(), srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != http.StatusCreated || Attempts(resp) != 2 || n.Load() != 2 {
		t.Fatalf("status %d, attempt %d, %d requests", resp.StatusCode, Attempts(resp), n.Load())
	}
	if timers := ft.snapshot(); len(timers) != 3 || timers[1].d != time.Minute || !timers[2].stopped {
		t.Fatalf("timers %+v; want the first attempt's, the drain's (AttemptTimeout), the second attempt's (stopped)", timers)
	}
}

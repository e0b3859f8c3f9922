package idemclient

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// TestOneKeyManyAttempts: every attempt of one operation carries the same
// key in the quoted IETF form (the caller gave it bare), its own request id
// and its number, and the body again.
func TestOneKeyManyAttempts(t *testing.T) {
	s := newScript(t, status(503), status(503), status(201))
	tr, _ := newTestTransport(Options{})
	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "order-42", `{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || Attempts(resp) != 3 || Key(resp.Request) != "order-42" || Replayed(resp) {
		t.Fatalf("status %d, attempts %d, key %q, replayed %v", resp.StatusCode, Attempts(resp), Key(resp.Request), Replayed(resp))
	}
	readAll(t, resp)
	got := s.Seen()
	if len(got) != 3 {
		t.Fatalf("%d attempts, want 3", len(got))
	}
	ids := map[string]bool{}
	for i, g := range got {
		if g.Key != `"order-42"` || g.Attempt != strconv.Itoa(i+1) || g.Body != `{"a":1}` {
			t.Fatalf("attempt %d sent %+v", i+1, g)
		}
		if _, err := uuid.Parse(g.RequestID); err != nil || ids[g.RequestID] {
			t.Fatalf("attempt %d request id %q: not a fresh UUID", i+1, g.RequestID)
		}
		ids[g.RequestID] = true
	}
}

// TestCallerRequestID: a caller's own X-Request-Id names the first attempt
// and, suffixed, the later ones.
func TestCallerRequestID(t *testing.T) {
	s := newScript(t, status(503), status(200))
	tr, _ := newTestTransport(Options{})
	req := post(t, context.Background(), s.srv.URL, "k", "")
	req.Header.Set(RequestIDHeader, "rid")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := s.Seen(); got[0].RequestID != "rid" || got[1].RequestID != "rid-2" {
		t.Fatalf("request ids %q, %q", got[0].RequestID, got[1].RequestID)
	}
}

// TestWhichAnswersAreRetried holds every rule of the contract about
// answers: what is retried and what stops the chain, with which error.
func TestWhichAnswersAreRetried(t *testing.T) {
	cases := []struct {
		name     string
		first    answer
		attempts int
		err      error // nil: the answer is returned
		status   int
	}{
		{"503", status(503), 2, nil, 201},
		{"503 Retry-After", status(503, "Retry-After", "1"), 2, nil, 201},
		{"store unavailable", prob(problem.StoreUnavailable, "Retry-After", "1"), 2, nil, 201},
		{"request in progress", prob(problem.InProgress, "Retry-After", "1"), 2, nil, 201},
		{"capacity exceeded", prob(problem.CapacityExceeded, "Retry-After", "1"), 2, nil, 201},
		{"capacity exceeded without Retry-After", prob(problem.CapacityExceeded), 2, nil, 201},
		{"outcome unknown", prob(problem.OutcomeUnknown), 1, ErrOutcomeUnknown, 0},
		{"key reused", prob(problem.KeyReused), 1, ErrKeyReused, 0},
		{"key missing", prob(problem.KeyMissing), 1, ErrKeyMissing, 0},
		{"body too large", prob(problem.BodyTooLarge), 1, ErrProblem, 0},
		{"unknown type on 409", probType(409, "https://example.com/other"), 1, ErrUnknownProblem, 0},
		{"unknown type on 503", probType(503, "https://example.com/overload"), 1, ErrUnknownProblem, 0},
		{"unknown slug of ours", probType(409, problem.TypeBase+"something-new"), 1, ErrUnknownProblem, 0},
		{"problem without type is about:blank", probType(409, ""), 1, nil, 409},
		{"about:blank 503 is a 503", probType(503, "about:blank"), 2, nil, 201},
		{"about:blank 409 is a 409", probType(409, "about:blank"), 1, nil, 409},
		{"malformed problem body", malformedProblem(409), 1, ErrUnknownProblem, 0},
		{"malformed problem on 503", malformedProblem(503), 1, ErrUnknownProblem, 0},
		{"500", status(500), 1, nil, 500},
		{"502", status(502), 1, nil, 502},
		{"429", status(429, "Retry-After", "1"), 1, nil, 429},
		{"replayed 503", status(503, ReplayedHeader, "true"), 1, nil, 503},
		{"201", status(201), 1, nil, 201},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newScript(t, c.first, status(201))
			tr, _ := newTestTransport(Options{})
			resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "k", "b"))
			if n := len(s.Seen()); n != c.attempts {
				t.Fatalf("%d attempts, want %d", n, c.attempts)
			}
			if c.err != nil {
				var pe *ProblemError
				if !errors.Is(err, c.err) || !errors.As(err, &pe) || resp != nil {
					t.Fatalf("err = %v, resp %v; want %v", err, resp, c.err)
				}
				if pe.Key != "k" || pe.Attempt != 1 || pe.RequestID == "" || pe.Status == 0 || len(pe.Body) == 0 {
					t.Fatalf("problem error lacks its trace: %+v", pe)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			readAll(t, resp)
		})
	}
}

// TestRetryAfterIsAFloor: the wait before the next attempt is at least the
// answer's Retry-After, in either of its forms.
func TestRetryAfterIsAFloor(t *testing.T) {
	for _, form := range []string{"seconds", "date"} {
		t.Run(form, func(t *testing.T) {
			tr, clock := newTestTransport(Options{})
			clock.jitter = func(time.Duration) time.Duration { return 0 }
			ra := "3"
			if form == "date" {
				ra = clock.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat)
			}
			s := newScript(t, prob(problem.InProgress, "Retry-After", ra), status(201))
			resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "k", "b"))
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			slept := clock.Slept()
			// An HTTP-date has whole seconds: up to one less than asked.
			if len(slept) != 1 || slept[0] < 2*time.Second || slept[0] > 3*time.Second {
				t.Fatalf("slept %v, want one wait of Retry-After (3s)", slept)
			}
		})
	}
}

// TestRetryAfterBeyondMax: an answer asking for a longer wait than
// MaxRetryAfter is returned as it is, without waiting.
func TestRetryAfterBeyondMax(t *testing.T) {
	s := newScript(t, status(503, "Retry-After", "3600"), status(201))
	tr, clock := newTestTransport(Options{MaxRetryAfter: time.Minute})
	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 503 || len(s.Seen()) != 1 || len(clock.Slept()) != 0 {
		t.Fatalf("status %d after %d attempts, slept %v", resp.StatusCode, len(s.Seen()), clock.Slept())
	}
}

// TestBackoffCeilings: the jitter's range doubles from BaseDelay and stops
// at MaxDelay; attempts stop at MaxAttempts, and the last answer is
// returned whole.
func TestBackoffCeilings(t *testing.T) {
	s := newScript(t, prob(problem.StoreUnavailable))
	tr, clock := newTestTransport(Options{MaxAttempts: 6, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second})
	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 503 || Attempts(resp) != 6 || len(body) < 20 {
		t.Fatalf("last answer %d %q after %d attempts", resp.StatusCode, body, Attempts(resp))
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second}
	if len(s.Seen()) != 6 || len(clock.ceils) != len(want) {
		t.Fatalf("%d attempts, ceilings %v", len(s.Seen()), clock.ceils)
	}
	for i := range want {
		if clock.ceils[i] != want[i] {
			t.Fatalf("ceilings %v, want %v", clock.ceils, want)
		}
	}
}

// TestFullJitterBounds: the real jitter stays within [0, ceil] and spreads
// over the whole range (both halves are hit; 2000 draws all in one half
// has probability 2^-1999).
func TestFullJitterBounds(t *testing.T) {
	const ceil = time.Second
	var low, high bool
	for range 2000 {
		d := fullJitter(ceil)
		if d < 0 || d > ceil {
			t.Fatalf("jitter %v outside [0, %v]", d, ceil)
		}
		low, high = low || d < ceil/2, high || d >= ceil/2
	}
	if !low || !high {
		t.Fatalf("jitter did not spread: low %v high %v", low, high)
	}
	if fullJitter(0) != 0 {
		t.Fatal("jitter of 0 must be 0")
	}
}

// TestDeadlineBoundsTheChain: no wait is begun that would end at or after
// the request's deadline, so no attempt starts after it; the chain returns
// the last answer instead.
func TestDeadlineBoundsTheChain(t *testing.T) {
	s := newScript(t, status(503))
	var starts []time.Time
	tr, clock := newTestTransport(Options{MaxAttempts: 10, BaseDelay: 20 * time.Minute, MaxDelay: 24 * time.Hour})
	deadline := clock.Now().Add(time.Hour)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	tr.base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		starts = append(starts, clock.Now())
		return http.DefaultTransport.RoundTrip(r)
	})
	resp, err := tr.RoundTrip(post(t, ctx, s.srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	// Waits of 20m then 40m: the second would end at the deadline.
	if len(starts) != 2 || resp.StatusCode != 503 {
		t.Fatalf("%d attempts (%v), status %d", len(starts), starts, resp.StatusCode)
	}
	var total time.Duration
	for _, d := range clock.Slept() {
		total += d
	}
	for _, st := range starts {
		if !st.Before(deadline) {
			t.Fatalf("attempt started at %v, after the deadline %v", st, deadline)
		}
	}
	if !clock.Now().Before(deadline) || total != 20*time.Minute {
		t.Fatalf("slept %v, until %v; deadline %v", clock.Slept(), clock.Now(), deadline)
	}
}

// TestDeadlinePassedSendsNothing: a request whose context has ended is not
// sent at all.
func TestDeadlinePassedSendsNothing(t *testing.T) {
	s := newScript(t, status(201))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	tr, _ := newTestTransport(Options{Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls++ // the base must not even be asked
		return http.DefaultTransport.RoundTrip(r)
	})})
	_, err := tr.RoundTrip(post(t, ctx, s.srv.URL, "k", "b"))
	if !errors.Is(err, context.Canceled) || calls != 0 || len(s.Seen()) != 0 {
		t.Fatalf("err %v after %d attempts", err, calls)
	}
}

// TestContextEndsDuringWait: a chain whose context ends while it waits
// returns the context's error and sends nothing more.
func TestContextEndsDuringWait(t *testing.T) {
	s := newScript(t, status(503))
	ctx, cancel := context.WithCancel(context.Background())
	tr, _ := newTestTransport(Options{})
	tr.sleep = func(context.Context, time.Duration) error { cancel(); return context.Canceled }
	_, err := tr.RoundTrip(post(t, ctx, s.srv.URL, "k", "b"))
	var e *Error
	if !errors.Is(err, context.Canceled) || !errors.As(err, &e) || e.Attempts != 1 || len(s.Seen()) != 1 {
		t.Fatalf("err %v after %d attempts", err, len(s.Seen()))
	}
}

// TestNoRetryWithoutGetBody: a keyed request whose body cannot be made
// again is sent once.
func TestNoRetryWithoutGetBody(t *testing.T) {
	s := newScript(t, status(503), status(201))
	req := post(t, context.Background(), s.srv.URL, "k", "b")
	req.GetBody = nil
	tr, _ := newTestTransport(Options{})
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 503 || len(s.Seen()) != 1 {
		t.Fatalf("status %d after %d attempts", resp.StatusCode, len(s.Seen()))
	}
}

// TestKeylessNotRetriedOn503: without a key, a 503 is returned as it is.
func TestKeylessNotRetriedOn503(t *testing.T) {
	s := newScript(t, status(503), status(201))
	tr, _ := newTestTransport(Options{})
	resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 503 || len(s.Seen()) != 1 || s.Seen()[0].Key != "" {
		t.Fatalf("status %d after %d attempts", resp.StatusCode, len(s.Seen()))
	}
}

// TestInvalidKeyNotSent: a key the server would refuse stops the request
// before it is sent.
func TestInvalidKeyNotSent(t *testing.T) {
	s := newScript(t, status(201))
	tr, _ := newTestTransport(Options{})
	for _, k := range []string{"has space", `"unterminated`, string(make([]byte, 256))} {
		req := post(t, context.Background(), s.srv.URL, "", "b")
		req.Header.Set(KeyHeader, k)
		if _, err := tr.RoundTrip(req); !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("key %q: err %v", k, err)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL, nil)
	if err := SetKey(req, "has space"); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("SetKey: %v", err)
	}
	if len(s.Seen()) != 0 {
		t.Fatal("an invalid key was sent")
	}
}

// TestQuotedKeyForms: a caller's quoted key is kept, escapes included, and
// SetKey quotes.
func TestQuotedKeyForms(t *testing.T) {
	s := newScript(t, status(201))
	tr, _ := newTestTransport(Options{})
	req := post(t, context.Background(), s.srv.URL, `"a\"b"`, "b")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	req2 := post(t, context.Background(), s.srv.URL, "", "b")
	if err := SetKey(req2, `x\y`); err != nil {
		t.Fatal(err)
	}
	resp, err = tr.RoundTrip(req2)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := s.Seen(); got[0].Key != `"a\"b"` || got[1].Key != `"x\\y"` || Key(resp.Request) != `x\y` {
		t.Fatalf("keys sent %q %q", got[0].Key, got[1].Key)
	}
}

// TestKeyMethodsMakeOneKeyPerCall: with KeyMethods, a keyless POST gets a
// fresh UUIDv7 that all its attempts share; the next call gets another.
func TestKeyMethodsMakeOneKeyPerCall(t *testing.T) {
	s := newScript(t, status(503), status(201), status(201))
	tr, _ := newTestTransport(Options{KeyMethods: []string{"post"}})
	for range 2 {
		resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "", "b"))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	got := s.Seen()
	if len(got) != 3 || got[0].Key != got[1].Key || got[1].Key == got[2].Key {
		t.Fatalf("keys %+v", got)
	}
	u, err := uuid.Parse(got[0].Key[1 : len(got[0].Key)-1])
	if err != nil || u.Version() != 7 {
		t.Fatalf("generated key %q is not a UUIDv7: %v", got[0].Key, err)
	}
	req, _ := NewRequest(context.Background(), http.MethodPost, s.srv.URL, []byte("x"))
	if req.GetBody == nil || Key(req) == "" {
		t.Fatal("NewRequest must give a key and a resendable body")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestZeroTransport: a Transport built without New works, with the
// defaults, real clock included.
func TestZeroTransport(t *testing.T) {
	s := newScript(t, status(503), status(201))
	c := &http.Client{Transport: &Transport{}}
	resp, err := c.Do(post(t, context.Background(), s.srv.URL, "k", "b"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 201 || Attempts(resp) != 2 {
		t.Fatalf("status %d after %d attempts", resp.StatusCode, Attempts(resp))
	}
}

// TestCustomKeyHeader: with a policy that reads the key from another
// header, the transport sends it there, taking it from SetKey's header.
func TestCustomKeyHeader(t *testing.T) {
	var got []http.Header
	srv := newScript(t, status(503), status(201))
	tr, _ := newTestTransport(Options{KeyHeader: "x-operation-key", Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = append(got, r.Header.Clone())
		return http.DefaultTransport.RoundTrip(r)
	})})
	req := post(t, context.Background(), srv.srv.URL, "", "b")
	if err := SetKey(req, "op"); err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if len(got) != 2 {
		t.Fatalf("%d attempts, want 2 (the key makes the 503 retryable)", len(got))
	}
	for _, h := range got {
		if h.Get("X-Operation-Key") != `"op"` || h.Get(KeyHeader) != "" {
			t.Fatalf("headers %v", h)
		}
	}
}

// TestRetryAfterForms: delay-seconds, an HTTP-date, and values out of
// range or malformed.
func TestRetryAfterForms(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"3":                             3 * time.Second,
		" 3 ":                           3 * time.Second,
		"0":                             0,
		"-1":                            0,
		"soon":                          0,
		"99999999999999999999":          24 * time.Hour,
		"Thu, 01 Jan 2026 00:00:05 GMT": 5 * time.Second,
		"Wed, 31 Dec 2025 23:59:00 GMT": 0,
		"Fri, 01 Jan 2100 00:00:00 GMT": 24 * time.Hour,
	} {
		h := http.Header{}
		h.Set("Retry-After", v)
		if got := retryAfter(h, now); got != want {
			t.Errorf("Retry-After %q = %v, want %v", v, got, want)
		}
	}
}

// TestReplayMarks: Replayed and BodyOmitted read their own header, true in
// any case, and nothing else.
func TestReplayMarks(t *testing.T) {
	for _, tc := range []struct {
		replayed, bodyOmitted string // header values, "" for none
		want                  [2]bool
	}{
		{"", "", [2]bool{false, false}},
		{"true", "", [2]bool{true, false}},
		{"TRUE", "True", [2]bool{true, true}},
		{"true", "false", [2]bool{true, false}},
		{"", "true", [2]bool{false, true}},
	} {
		resp := &http.Response{Header: http.Header{}}
		for name, v := range map[string]string{ReplayedHeader: tc.replayed, BodyOmittedHeader: tc.bodyOmitted} {
			if v != "" {
				resp.Header.Set(name, v)
			}
		}
		if got := [2]bool{Replayed(resp), BodyOmitted(resp)}; got != tc.want {
			t.Errorf("%v: Replayed, BodyOmitted = %v, want %v", resp.Header, got, tc.want)
		}
	}
	if Replayed(nil) || BodyOmitted(nil) {
		t.Error("a nil response is marked")
	}
}

package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Upstream is an HTTP application with a visible side effect: every request
// it accepts is appended to its effect log, the way a real API would create
// an order. Tests count effects to prove that no operation ran twice.
//
// Requests steer it with headers (which the proxy passes through):
// x-upstream-delay (a Go duration to wait before the effect),
// x-upstream-status (the status to answer, default 201 for writes, 200
// else), x-upstream-size (pad the body to this many bytes),
// x-upstream-set-cookie (answer with this Set-Cookie).
type Upstream struct {
	srv *httptest.Server

	mu      sync.Mutex
	effects []Effect
	arrived map[string]int
}

// Effect is one request the upstream executed.
type Effect struct {
	Seq       int
	Method    string
	Path      string
	Authority string
	// Key is the Idempotency-Key header as received.
	Key  string
	Body string
	// Status and ResponseBody are what the upstream answered.
	Status       int
	ResponseBody string
}

// NewUpstream starts the upstream on a loopback port.
func NewUpstream() *Upstream {
	u := &Upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	return u
}

// ServeHandler starts an upstream that serves h instead of the counting
// application: its effect log stays empty and ArrivedKey counts nothing.
func ServeHandler(h http.Handler) *Upstream {
	return &Upstream{srv: httptest.NewServer(h)}
}

// URL returns the upstream's base URL.
func (u *Upstream) URL() string { return u.srv.URL }

// Close stops the upstream.
func (u *Upstream) Close() { u.srv.Close() }

// Effects returns a copy of the effect log.
func (u *Upstream) Effects() []Effect {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Effect(nil), u.effects...)
}

// ArrivedKey returns how many requests with the given Idempotency-Key
// have reached the upstream, whether or not their effect has happened yet.
// A test that abandons a request once it is here knows the effect will
// follow (the upstream works on when its client leaves); abandoned any
// earlier, on the proxy's side, it may never run.
func (u *Upstream) ArrivedKey(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.arrived[key]
}

// Count returns how many effects match f (all when f is nil).
func (u *Upstream) Count(f func(Effect) bool) int {
	n := 0
	for _, e := range u.Effects() {
		if f == nil || f(e) {
			n++
		}
	}
	return n
}

// CountKey returns how many effects carried the given Idempotency-Key.
func (u *Upstream) CountKey(key string) int {
	return u.Count(func(e Effect) bool { return e.Key == key })
}

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	if u.arrived == nil {
		u.arrived = map[string]int{}
	}
	u.arrived[r.Header.Get("Idempotency-Key")]++
	u.mu.Unlock()
	if d, err := time.ParseDuration(r.Header.Get("x-upstream-delay")); err == nil {
		// The application keeps working when its client leaves: the effect
		// happens anyway, which is exactly the case the service must cover.
		time.Sleep(d)
	}
	status := http.StatusOK
	if r.Method == http.MethodPost {
		status = http.StatusCreated
	}
	if s, err := strconv.Atoi(r.Header.Get("x-upstream-status")); err == nil {
		status = s
	}
	u.mu.Lock()
	seq := len(u.effects) + 1
	resp, _ := json.Marshal(map[string]any{"order": seq, "method": r.Method, "body": string(body)})
	if n, err := strconv.Atoi(r.Header.Get("x-upstream-size")); err == nil && n > len(resp) {
		resp = append(resp, strings.Repeat(" ", n-len(resp))...)
	}
	u.effects = append(u.effects, Effect{
		Seq: seq, Method: r.Method, Path: r.URL.RequestURI(), Authority: r.Host,
		Key: r.Header.Get("Idempotency-Key"), Body: string(body),
		Status: status, ResponseBody: string(resp),
	})
	u.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", seq))
	w.Header().Add("X-Effect", strconv.Itoa(seq))
	w.Header().Add("X-Multi", "first")
	w.Header().Add("X-Multi", "second")
	if c := r.Header.Get("x-upstream-set-cookie"); c != "" {
		w.Header().Set("Set-Cookie", c)
	}
	w.WriteHeader(status)
	_, _ = w.Write(resp)
}

package harness

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// AgentClient returns an HTTP client for a client library that builds its
// own requests, such as the MCP Go SDK's StreamableClientTransport
// (HTTPClient: env.AgentClient(), Endpoint: env.URL+"/mcp"). It reaches the
// proxy through the Env's own connection pool; see AgentTransport for what
// a test can make it do per request.
func (e *Env) AgentClient() *http.Client {
	return &http.Client{Transport: &AgentTransport{Base: e.Client.Transport}}
}

// AgentTransport sends requests through Base (http.DefaultTransport when
// nil), and lets a test shape each one through the request's context, since
// a client library passes its caller's context to the request it builds:
// WithHeaders adds headers (an Idempotency-Key, say), and LoseResponse
// makes the response go missing after it was delivered whole.
type AgentTransport struct {
	Base http.RoundTripper
}

type agentKey int

const (
	headersKey agentKey = iota
	lossKey
)

// WithHeaders returns ctx carrying headers (name, value pairs) that an
// AgentTransport adds to every request made under it.
func WithHeaders(ctx context.Context, headers ...string) context.Context {
	prev, _ := ctx.Value(headersKey).([]string)
	return context.WithValue(ctx, headersKey, append(append([]string(nil), prev...), headers...))
}

// ResponseLoss makes the first response of a request made under its context
// (LoseResponse) vanish on the way back to the client: the transport reads
// that response to its end, so the proxy, the ext_proc server and the
// upstream have all finished with it, then drops it and reports a timeout,
// as a client whose deadline passed while the answer was in the network
// would. Later requests under the same context go through untouched.
type ResponseLoss struct {
	used atomic.Bool

	mu     sync.Mutex
	status int
	header http.Header
	body   []byte
	done   chan struct{}
}

// NewResponseLoss returns a loss not yet used.
func NewResponseLoss() *ResponseLoss { return &ResponseLoss{done: make(chan struct{})} }

// LoseResponse returns ctx under which an AgentTransport loses one response
// as l says.
func LoseResponse(ctx context.Context, l *ResponseLoss) context.Context {
	return context.WithValue(ctx, lossKey, l)
}

// Lost returns the response that was dropped, once it was; ok is false
// before.
func (l *ResponseLoss) Lost() (status int, header http.Header, body []byte, ok bool) {
	select {
	case <-l.done:
	default:
		return 0, nil, nil, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.status, l.header, l.body, true
}

// ErrResponseLost is what a client sees for a lost response: a timeout
// (net.Error's Timeout is true, and http.Client wraps it in a *url.Error
// whose Timeout is true too).
var ErrResponseLost error = lostError{}

type lostError struct{}

func (lostError) Error() string   { return "harness: response lost on the way back (client timeout)" }
func (lostError) Timeout() bool   { return true }
func (lostError) Temporary() bool { return true }

// RoundTrip implements http.RoundTripper.
func (a *AgentTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := a.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if hs, _ := req.Context().Value(headersKey).([]string); len(hs) > 0 {
		req = req.Clone(req.Context()) // a RoundTripper must not modify its request
		for i := 0; i+1 < len(hs); i += 2 {
			req.Header.Add(hs[i], hs[i+1])
		}
	}
	loss, _ := req.Context().Value(lossKey).(*ResponseLoss)
	if loss == nil || !loss.used.CompareAndSwap(false, true) {
		return base.RoundTrip(req)
	}
	resp, err := base.RoundTrip(req)
	if err != nil {
		return nil, errors.Join(err, ErrResponseLost)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	loss.mu.Lock()
	loss.status, loss.header, loss.body = resp.StatusCode, resp.Header, body
	loss.mu.Unlock()
	close(loss.done)
	if err != nil {
		return nil, errors.Join(err, ErrResponseLost)
	}
	return nil, ErrResponseLost
}

// Package harness assembles end-to-end test environments: a real
// redis-server (or the in-memory store), the idem-extproc ext_proc server on
// a loopback port, an Envoy-faithful proxy in front (package envoysim) and
// a counting upstream behind it. Tests then speak plain HTTP to the proxy.
package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/server"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/ports"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// Options configures an Env. The zero value gives a real redis-server, the
// default policy and the recommended filter configuration.
type Options struct {
	// Store picks the store (NewRedis, OnRedis, RedisAt, Memory, Given);
	// a redis-server of the test's own when nil. Env.Store is that store,
	// bare.
	Store StoreOption
	// WrapStore, when set, wraps the store the server uses (to instrument
	// it, say); Env.Store stays the bare store.
	WrapStore func(idem.Store) idem.Store
	// Policies replaces the default policy set.
	Policies *policy.Set
	// Filter replaces envoysim.RecommendedConfig().
	Filter        *extprocfilterv3.ExternalProcessor
	FilterOptions envoysim.Options
	// StoreTimeout is the server's per-call store budget. It defaults to a
	// generous TestStoreTimeout, and the filter's message_timeout to
	// TestMessageTimeout, so that a loaded CI machine running the race
	// detector does not turn a correctness test into a latency test. Tests
	// about deadlines set both explicitly.
	StoreTimeout time.Duration
	// MaxBufferedBytes bounds the body bytes all streams buffer together
	// (extproc.Config); no bound when zero.
	MaxBufferedBytes int64
	// UpstreamHandler, when set, is the application behind the proxy
	// instead of the counting one (an MCP SDK tool server, say); Env.Upstream
	// then serves it and its effect log stays empty: the handler counts its
	// own effects.
	UpstreamHandler http.Handler
	// UpstreamURL, when set, points the proxy at another upstream (a
	// JSON-RPC server, say) instead of Env.Upstream, which then sees
	// nothing.
	UpstreamURL string
	// ResponseDelay and RouteTimeout shape the proxy (see envoysim.Proxy).
	ResponseDelay time.Duration
	RouteTimeout  time.Duration
	// Route and Decorate shape each request as Envoy's routing and earlier
	// filters would (see envoysim.Proxy).
	Route    func(r *http.Request) (string, *extprocfilterv3.ExtProcPerRoute)
	Decorate func(r *http.Request, req *envoysim.Request)
	// ServerAddr points the proxy at an ext_proc server already running
	// (the built binary, say) instead of starting one in process.
	ServerAddr string
	// Sealer encrypts responses for policies with Encrypt.
	Sealer idem.Sealer
	// Metrics, when set, instrument the store and observe every decision,
	// as in the daemon (server.New).
	Metrics *observe.Metrics
	// TracerProvider makes the server's spans (and, with Metrics, the
	// store's).
	TracerProvider trace.TracerProvider
	// Now is the server's clock for key grace periods; time.Now when nil.
	Now func() time.Time
	// Logger receives the server's logs; none when nil.
	Logger *slog.Logger
	// ExpectProcessingErrors allows exchanges in which Envoy would have
	// seen an ext_proc failure (a crashed server, a timeout). Otherwise any
	// such failure, a spurious reply above all, fails the test at cleanup.
	ExpectProcessingErrors bool
}

// The harness's default deadlines (see Options.StoreTimeout).
const (
	TestStoreTimeout   = 3 * time.Second
	TestMessageTimeout = 5 * time.Second
)

// Env is a running environment.
type Env struct {
	t        testing.TB
	opts     Options
	Redis    *redistest.Server
	Store    idem.Store
	Upstream *Upstream
	Filter   *envoysim.Filter
	Proxy    *envoysim.Proxy
	// URL is the proxy's base URL: send HTTP requests here.
	URL    string
	Client *http.Client

	mu         sync.Mutex
	serverAddr string
	grpcServer *grpc.Server
	results    []*envoysim.Result
}

// Start builds an Env and tears it down at cleanup.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	if opts.StoreTimeout == 0 {
		opts.StoreTimeout = TestStoreTimeout
	}
	e := &Env{t: t, opts: opts}
	e.Store, e.Redis = opts.storeOption()(t, opts.StoreTimeout)
	if opts.ServerAddr != "" {
		e.serverAddr = opts.ServerAddr
	} else {
		e.startServer()
	}
	e.startFilter()
	e.startProxy()
	return e
}

// startServer serves ext_proc in process on a loopback port, held for
// the whole test (ports.Hold): while CrashServer has it down, connections
// to it are refused, and no other test's port picker or outgoing
// connection gets it, as one once did, failing the restart.
func (e *Env) startServer() {
	e.serverAddr = ports.Hold(e.t)
	lis, err := net.Listen("tcp", e.serverAddr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.serve(lis)
	e.t.Cleanup(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.grpcServer.Stop()
	})
}

// startFilter connects the Envoy-faithful filter to the server.
func (e *Env) startFilter() {
	// Reconnect within tens of milliseconds after CrashServer/StartServer,
	// as Envoy's cluster would once its health check passes, instead of
	// grpc-go's default one-second backoff. A connection attempt (the TCP
	// dial and the HTTP/2 handshake with the server) may take up to 10 s:
	// a stopped server refuses at once, and with 1 s a burst on a machine
	// loaded 6 times over its 2 vCPUs, under the race detector, saw dials
	// to loopback time out and fail requests as if the server were down.
	cc, err := grpc.NewClient(e.serverAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: 10 * time.Second,
		}))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = cc.Close() })
	cfg := e.opts.Filter
	if cfg == nil {
		cfg = envoysim.RecommendedConfig()
	}
	if cfg.GetMessageTimeout() == nil {
		cfg = proto.Clone(cfg).(*extprocfilterv3.ExternalProcessor)
		cfg.MessageTimeout = durationpb.New(TestMessageTimeout)
	}
	e.Filter = envoysim.NewFilter(cc, cfg, e.opts.FilterOptions)
}

// startProxy puts the proxy in front of the filter and the upstream behind
// it, and at cleanup fails the test on any exchange in which Envoy would
// have seen an ext_proc failure, unless the options expect some.
func (e *Env) startProxy() {
	t, opts := e.t, e.opts
	if opts.UpstreamHandler != nil {
		e.Upstream = ServeHandler(opts.UpstreamHandler)
	} else {
		e.Upstream = NewUpstream()
	}
	t.Cleanup(e.Upstream.Close)
	base, _ := url.Parse(e.Upstream.URL())
	if opts.UpstreamURL != "" {
		base, _ = url.Parse(opts.UpstreamURL)
	}
	e.Proxy = &envoysim.Proxy{
		Filter:        e.Filter,
		Upstream:      envoysim.HTTPUpstream(http.DefaultClient, base, opts.RouteTimeout),
		ResponseDelay: opts.ResponseDelay,
		Route:         opts.Route,
		Decorate:      opts.Decorate,
		Observe: func(r *envoysim.Result) {
			e.mu.Lock()
			e.results = append(e.results, r)
			e.mu.Unlock()
		},
	}
	front := httptest.NewServer(e.Proxy)
	t.Cleanup(front.Close)
	if !opts.ExpectProcessingErrors {
		t.Cleanup(func() {
			for _, r := range e.Results() {
				if r.ProcessingError != nil {
					t.Errorf("Envoy would have seen an ext_proc failure: %v", r)
				}
			}
		})
	}
	e.URL = front.URL
	e.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	t.Cleanup(e.Client.CloseIdleConnections)
}

func (e *Env) serve(lis net.Listener) {
	st := e.Store
	if e.opts.WrapStore != nil {
		st = e.opts.WrapStore(st)
	}
	gs, _, _ := server.New(server.Config{
		Config: extproc.Config{
			Store:            st,
			Policies:         e.policies(),
			StoreTimeout:     e.opts.StoreTimeout,
			Logger:           e.opts.Logger,
			TracerProvider:   e.opts.TracerProvider,
			Sealer:           e.opts.Sealer,
			Now:              e.opts.Now,
			MaxBufferedBytes: e.opts.MaxBufferedBytes,
		},
		Metrics: e.opts.Metrics,
	})
	e.mu.Lock()
	e.grpcServer = gs
	e.mu.Unlock()
	go func() { _ = gs.Serve(lis) }()
}

func (e *Env) policies() func() *policy.Set {
	set := e.opts.Policies
	if set == nil {
		set = policy.DefaultSet()
	}
	return func() *policy.Set { return set }
}

// ServerAddr is the ext_proc server's address.
func (e *Env) ServerAddr() string { return e.serverAddr }

// CrashServer stops the ext_proc server at once, cutting every open
// stream, as a crashed process would. Its port stays held (startServer).
func (e *Env) CrashServer() {
	e.mu.Lock()
	gs := e.grpcServer
	e.mu.Unlock()
	gs.Stop()
}

// StartServer starts a fresh ext_proc server on the same address, sharing
// the store (for Redis: a new process would see the same records).
func (e *Env) StartServer() {
	e.t.Helper()
	var lis net.Listener
	var err error
	for range 50 {
		if lis, err = net.Listen("tcp", e.serverAddr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		e.t.Fatalf("restart ext_proc server on %s: %v", e.serverAddr, err)
	}
	e.serve(lis)
}

// Exchange sends one request straight through the Envoy-faithful filter
// and the upstream, with no HTTP client in front: for bytes a Go HTTP
// client refuses to send but Envoy could still pass on.
func (e *Env) Exchange(req *envoysim.Request) *envoysim.Result {
	res := e.Filter.Do(context.Background(), req, e.Proxy.Upstream)
	e.Proxy.Observe(res)
	return res
}

// Results returns the exchanges the proxy has run so far.
func (e *Env) Results() []*envoysim.Result {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*envoysim.Result(nil), e.results...)
}

// Reply is a response read whole.
type Reply struct {
	Status int
	Header http.Header
	Body   string
	Err    error
}

// Do sends an HTTP request to the proxy with optional headers (name, value
// pairs) and a client timeout (0: none).
func (e *Env) Do(method, path, body string, timeout time.Duration, headers ...string) Reply {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return e.do(ctx, method, path, body, headers...)
}

// Abandon sends a POST with key and leaves once the upstream has it, the
// way a client that times out after its write was let through does: the
// proxy resets the ext_proc stream after the reservation. Leaving when the
// upstream has the request, rather than on a short client timeout, keeps a
// slow machine from leaving before the reservation, or before the upstream
// will execute the request. The upstream holds it for 2 s and then
// executes it all the same. It fails if the request was answered first.
func (e *Env) Abandon(path, key, body string, headers ...string) error {
	return e.AbandonWhen(path, key, body, nil, headers...)
}

// AbandonWhen is Abandon, leaving only once ready (when not nil) also
// reports true, for a test that must see the record while its attempt is
// still in flight.
func (e *Env) AbandonWhen(path, key, body string, ready func() bool, headers ...string) error {
	before := e.Upstream.ArrivedKey(key)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan Reply, 1)
	headers = append(headers, "Idempotency-Key", key, "x-upstream-delay", "2s")
	go func() { done <- e.do(ctx, http.MethodPost, path, body, headers...) }()
	deadline := time.Now().Add(30 * time.Second)
	for e.Upstream.ArrivedKey(key) == before || (ready != nil && !ready()) {
		select {
		case r := <-done:
			return fmt.Errorf("harness: %s was answered (%d, %v) before it reached the upstream", key, r.Status, r.Err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("harness: %s never reached the upstream", key)
		}
	}
	cancel()
	if r := <-done; r.Err == nil {
		return fmt.Errorf("harness: %s was answered %d before the client left", key, r.Status)
	}
	return nil
}

// DoContext is Do bound to ctx instead of a timeout: the client gives up
// when ctx ends, at a moment the test chooses by an event.
func (e *Env) DoContext(ctx context.Context, method, path, body string, headers ...string) Reply {
	return e.do(ctx, method, path, body, headers...)
}

func (e *Env) do(ctx context.Context, method, path, body string, headers ...string) Reply {
	req, err := http.NewRequestWithContext(ctx, method, e.URL+path, bytes.NewReader([]byte(body)))
	if err != nil {
		return Reply{Err: err}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if http.CanonicalHeaderKey(headers[i]) == "Host" {
			req.Host = headers[i+1] // net/http sends Host from here only
			continue
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := e.Client.Do(req)
	if err != nil {
		return Reply{Err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err}
}

// Post sends a POST with an Idempotency-Key (none when key is "").
func (e *Env) Post(path, key, body string, headers ...string) Reply {
	if key != "" {
		headers = append(headers, "Idempotency-Key", key)
	}
	return e.Do(http.MethodPost, path, body, 0, headers...)
}

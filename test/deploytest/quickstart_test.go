package deploytest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvcv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/demoorders"
	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// quickstartHost is where docker-compose.yml publishes Envoy.
const quickstartHost = "localhost:8080"

// quickstartStep is one curl command of docs/deployment.md's "Try it with
// Docker" and the answer it must get.
type quickstartStep struct {
	method, path, key, body string
	wantStatus              int
	wantProblem             string // problem type slug, if any
	wantReplayed            bool
}

// curl renders the step as the docs print it.
func (s quickstartStep) curl() string {
	var b strings.Builder
	fmt.Fprintf(&b, "curl -si")
	if s.method != http.MethodGet {
		fmt.Fprintf(&b, " -X %s", s.method)
	}
	fmt.Fprintf(&b, " '%s%s'", quickstartHost, s.path)
	if s.key != "" {
		fmt.Fprintf(&b, " -H 'Idempotency-Key: %s'", s.key)
	}
	if s.body != "" {
		fmt.Fprintf(&b, " -H 'Content-Type: application/json' -d '%s'", s.body)
	}
	return b.String()
}

var (
	stepCreate   = quickstartStep{method: "POST", path: "/orders", key: "order-1", body: `{"item":"book","qty":1}`, wantStatus: 201}
	stepReplay   = quickstartStep{method: "POST", path: "/orders", key: "order-1", body: `{"item":"book","qty":1}`, wantStatus: 201, wantReplayed: true}
	stepCount    = quickstartStep{method: "GET", path: "/orders/count", wantStatus: 200}
	stepMismatch = quickstartStep{method: "POST", path: "/orders", key: "order-1", body: `{"item":"book","qty":2}`, wantStatus: 422, wantProblem: problem.KeyReused.Slug}
	stepSlow     = quickstartStep{method: "POST", path: "/orders?delay=3s", key: "order-2", body: `{"item":"pen","qty":1}`, wantStatus: 201}
	stepInFlight = quickstartStep{method: "POST", path: "/orders?delay=3s", key: "order-2", body: `{"item":"pen","qty":1}`, wantStatus: 409, wantProblem: problem.InProgress.Slug}
)

// TestQuickstartCommandsAreDocumented keeps the docs' curl commands the
// ones TestQuickstartScenario runs: docs/deployment.md's "Try it with
// Docker" shows them all, and so must any other page that shows one.
func TestQuickstartCommandsAreDocumented(t *testing.T) {
	steps := []quickstartStep{stepCreate, stepReplay, stepCount, stepMismatch, stepSlow, stepInFlight}
	for _, page := range []string{filepath.Join("docs", "deployment.md"), "README.md"} {
		doc := string(readFile(t, filepath.Join(repoRoot, page)))
		if page == "README.md" && !strings.Contains(doc, "curl -si -X POST '"+quickstartHost+"/orders") {
			continue // the README points to the page instead
		}
		for _, s := range steps {
			if !strings.Contains(doc, s.curl()) {
				t.Errorf("%s lacks the command\n\t%s", page, s.curl())
			}
		}
	}
}

// TestQuickstartScenario runs the quickstart's curl commands against what
// docker-compose.yml starts, assembled in-process: envoy/envoy.yaml's
// ext_proc filter and routes in the Envoy-faithful driver (package
// envoysim), the ext_proc server on a real Redis, and the demo upstream.
// The one liberty: message_timeout is raised, as in every end-to-end test
// here, so that a loaded CI machine under -race tests behaviour, not
// latency. It checks the replay, the 422 and the 409 the docs promise,
// with the upstream's order counter showing what really ran.
func TestQuickstartScenario(t *testing.T) {
	cfg, err := checkEnvoyConfig(readFile(t, filepath.Join(repoRoot, "envoy", "envoy.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	hcm := cfg.hcms[0]
	filterCfg := proto.Clone(hcm.extProc).(*extprocfilterv3.ExternalProcessor)
	filterCfg.MessageTimeout = durationpb.New(harness.TestMessageTimeout)

	// Redis and the ext_proc server, as the compose services run them.
	rs := redistest.Start(t, redistest.Options{})
	srv := extproc.New(extproc.Config{
		Store:        redistest.OpenStore(t, rs.URL(), harness.TestStoreTimeout),
		StoreTimeout: harness.TestStoreTimeout,
	})
	gs := grpc.NewServer()
	extprocsvcv3.RegisterExternalProcessorServer(gs, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })

	// The demo upstream; arrivals tells when a POST reached it.
	orders := &demoorders.Server{}
	var arrivals atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			arrivals.Add(1)
		}
		orders.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	base, _ := url.Parse(up.URL)

	rc := hcm.hcm.GetRouteConfig()
	proxy := &envoysim.Proxy{
		Filter:   envoysim.NewFilter(cc, filterCfg, envoysim.Options{}),
		Upstream: envoysim.HTTPUpstream(http.DefaultClient, base, routeTimeout(rc)),
		Route: func(r *http.Request) (string, *extprocfilterv3.ExtProcPerRoute) {
			name, per, err := matchRoute(rc, r)
			if err != nil {
				t.Errorf("route %s %s: %v", r.Method, r.URL, err)
			}
			return name, per
		},
	}
	var getStreams, processingErrors atomic.Int32
	proxy.Observe = func(res *envoysim.Result) {
		if res.ProcessingError != nil {
			processingErrors.Add(1)
		}
		if res.StreamOpened && res.UpstreamRequest != nil && res.UpstreamRequest.Method == http.MethodGet {
			getStreams.Add(1)
		}
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)

	do := func(s quickstartStep) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(s.method, front.URL+s.path, strings.NewReader(s.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = quickstartHost
		if s.key != "" {
			req.Header.Set("Idempotency-Key", s.key)
		}
		if s.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", s.curl(), err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != s.wantStatus {
			t.Errorf("%s: status %d, want %d\n%s", s.curl(), resp.StatusCode, s.wantStatus, b)
		}
		if got := resp.Header.Get(idem.ReplayedHeader) == "true"; got != s.wantReplayed {
			t.Errorf("%s: replayed %v, want %v", s.curl(), got, s.wantReplayed)
		}
		if s.wantProblem != "" && (resp.Header.Get("Content-Type") != problem.ContentType || !strings.Contains(string(b), problem.TypeBase+s.wantProblem)) {
			t.Errorf("%s: want a %s problem, got %s %s", s.curl(), s.wantProblem, resp.Header.Get("Content-Type"), b)
		}
		return resp, string(b)
	}
	count := func(want int) {
		t.Helper()
		if _, body := do(stepCount); strings.TrimSpace(body) != fmt.Sprintf(`{"orders_created":%d}`, want) {
			t.Errorf("%s: %s, want %d orders", stepCount.curl(), body, want)
		}
	}

	// 1. Create, then replay: one order, the same answer twice.
	_, first := do(stepCreate)
	_, again := do(stepReplay)
	if first != again {
		t.Errorf("the replay differs from the first answer:\n%s\n%s", first, again)
	}
	count(1)
	// 2. The same key for a different body: 422, nothing created.
	do(stepMismatch)
	count(1)
	// 3. A retry while the first attempt is still running: 409.
	done := make(chan struct{})
	go func() {
		defer close(done)
		do(stepSlow)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for arrivals.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	do(stepInFlight)
	<-done
	count(2)
	if n := int(arrivals.Load()); n != 2 {
		t.Errorf("the upstream saw %d POSTs, want 2", n)
	}
	// The read-only route has the filter disabled: no stream at all.
	if n := getStreams.Load(); n != 0 {
		t.Errorf("%d GETs opened an ext_proc stream", n)
	}
	if n := processingErrors.Load(); n != 0 {
		t.Errorf("Envoy would have seen %d ext_proc failures", n)
	}
}

// routeTimeout is the write route's timeout in rc.
func routeTimeout(rc *routev3.RouteConfiguration) time.Duration {
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if d := r.GetRoute().GetTimeout(); d != nil && r.GetName() != "" {
				return d.AsDuration()
			}
		}
	}
	return 0
}

// matchRoute picks the route Envoy would for r (routeFor) and returns its
// name and ExtProcPerRoute.
func matchRoute(rc *routev3.RouteConfiguration, r *http.Request) (string, *extprocfilterv3.ExtProcPerRoute, error) {
	rt, err := routeFor(rc, r)
	if err != nil {
		return "", nil, err
	}
	per, err := extProcPerRoute(rt.GetTypedPerFilterConfig())
	return rt.GetName(), per, err
}

// routeFor picks the route Envoy would for r among the matchers our files
// use (prefix and path, :method and header string matchers), in order. An
// absent header matches no string matcher, as in Envoy.
func routeFor(rc *routev3.RouteConfiguration, r *http.Request) (*routev3.Route, error) {
	for _, vh := range rc.GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			m := rt.GetMatch()
			if m.GetPrefix() == "" && m.GetPath() == "" {
				return nil, fmt.Errorf("route %s: only prefix and path matches are simulated", rt.GetName())
			}
			if (m.GetPrefix() != "" && !strings.HasPrefix(r.URL.Path, m.GetPrefix())) || (m.GetPath() != "" && r.URL.Path != m.GetPath()) {
				continue
			}
			ok := true
			for _, h := range m.GetHeaders() {
				vs, present := r.Header[http.CanonicalHeaderKey(h.GetName())]
				v := ""
				if present {
					v = vs[0]
				}
				if h.GetName() == ":method" {
					v, present = r.Method, true
				}
				hit, err := headerMatches(h, v)
				if err != nil {
					return nil, err
				}
				ok = ok && present && hit
			}
			if ok {
				return rt, nil
			}
		}
	}
	return nil, fmt.Errorf("no route matches %s %s", r.Method, r.URL.Path)
}

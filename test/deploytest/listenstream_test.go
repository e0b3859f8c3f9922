package deploytest

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	extprocsvcv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// listenRequest is a POST to /mcp as an MCP client of revision version
// sends it, its Mcp-Method header saying method ("" for none) and its
// body a subscriptions/listen ("Opening a Stream" in modelcontextprotocol,
// docs/specification/2026-07-28/basic/patterns/subscriptions.mdx).
func listenRequest(t *testing.T, version, method string) *http.Request {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"_meta":{` +
		`"io.modelcontextprotocol/protocolVersion":"` + version + `"},"notifications":{"toolsListChanged":true}}}`
	r, err := http.NewRequest(http.MethodPost, "http://mcp.example/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set(policy.MCPVersionHeader, version)
	if method != "" {
		r.Header.Set(policy.MCPMethodHeader, method)
	}
	return r
}

// routeTimeouts are the timers Envoy gives a stream on route r of hcm: the
// route's timeout (15 s when unset, 0 none) and idle_timeout, else the
// connection manager's stream_idle_timeout (envoysim.RouteTimeouts).
func routeTimeouts(hcm *hcmv3.HttpConnectionManager, r *routev3.Route) envoysim.RouteTimeouts {
	t := envoysim.RouteTimeouts{Timeout: envoysim.DefaultRouteTimeout, IdleTimeout: 5 * time.Minute}
	if d := r.GetRoute().GetTimeout(); d != nil {
		t.Timeout = d.AsDuration()
	}
	if d := hcm.GetStreamIdleTimeout(); d != nil {
		t.IdleTimeout = d.AsDuration()
	}
	if d := r.GetRoute().GetIdleTimeout(); d != nil {
		t.IdleTimeout = d.AsDuration()
	}
	return t
}

// mcpServer runs the real ext_proc server with examples/mcp-policies.yaml
// over an in-memory store, and returns a client connection to it.
func mcpServer(t *testing.T) *grpc.ClientConn {
	t.Helper()
	set, err := config.Load(filepath.Join(repoRoot, "examples", "mcp-policies.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	store := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = store.Close() })
	srv := extproc.New(extproc.Config{Store: store, Policies: func() *policy.Set { return set }, StoreTimeout: harness.TestStoreTimeout})
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
	return cc
}

// TestMCPListenOutlivesTheTimeouts plays a subscriptions/listen through
// envoy/envoy-mcp.yaml as the deploy tests read it (its filter, its
// routes, their timeouts) and the real server with
// examples/mcp-policies.yaml: an answer that stays open for two hours,
// a keep-alive comment every 30 s (streamable-http.mdx, "Receiving
// Messages"), reaches the agent event by event, long past the message
// route's 10 s timeout and every ext_proc message timeout, on Envoy 1.36
// and on 1.37+ (which closes the ext_proc stream early). The same stream
// without the Mcp-Method header falls to the message route, whose timeout
// ends it.
func TestMCPListenOutlivesTheTimeouts(t *testing.T) {
	cfg, err := checkEnvoyConfig(readFile(t, filepath.Join(repoRoot, "envoy", "envoy-mcp.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	hcm := cfg.hcms[0]
	filterCfg := proto.Clone(hcm.extProc).(*extprocv3.ExternalProcessor)
	filterCfg.MessageTimeout = durationpb.New(harness.TestMessageTimeout)
	cc := mcpServer(t)
	const events, gap = 240, 30 * time.Second
	keepAlive := func(context.Context, *envoysim.Request) (*envoysim.StreamedAnswer, error) {
		a := &envoysim.StreamedAnswer{Status: 200, Headers: []envoysim.Header{{Name: "content-type", Value: "text/event-stream"}}}
		for i := range events {
			a.Events = append(a.Events, envoysim.Event{After: gap, Data: fmt.Appendf(nil, ": keep-alive %d\n\n", i)})
		}
		return a, nil
	}
	payload, _ := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": "agent-a"}})
	for _, early := range []bool{false, true} {
		for _, method := range []string{policy.SubscriptionsListen, ""} {
			t.Run(fmt.Sprintf("close early %v, Mcp-Method %q", early, method), func(t *testing.T) {
				hr := listenRequest(t, policy.MCPValidatedFrom, method)
				r, err := routeFor(hcm.hcm.GetRouteConfig(), hr)
				if err != nil {
					t.Fatal(err)
				}
				per, err := extProcPerRoute(r.GetTypedPerFilterConfig())
				if err != nil {
					t.Fatal(err)
				}
				body := `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"` +
					policy.MCPValidatedFrom + `"},"notifications":{"toolsListChanged":true}}}`
				req := &envoysim.Request{Method: hr.Method, Path: hr.URL.Path, Authority: hr.Host, RouteName: r.GetName(),
					PerRoute: per, Headers: fromRequest(hr), Body: []byte(body),
					DynamicMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": payload}}
				f := envoysim.NewFilter(cc, filterCfg, envoysim.Options{CloseStreamEarly: early})
				timers := routeTimeouts(hcm.hcm, r)
				res := f.DoStream(t.Context(), req, timers, keepAlive)
				if res.ProcessingError != nil || res.Response == nil {
					t.Fatalf("route %s: %s", r.GetName(), res)
				}
				if method == "" {
					// The message route: its timeout ends the stream.
					if res.End != envoysim.StreamRouteTimeout || res.At != timers.Timeout || timers.Timeout <= 0 {
						t.Fatalf("route %s: %v at %v, want its %v route timeout to end it", r.GetName(), res.End, res.At, timers.Timeout)
					}
					return
				}
				if res.Response.Status != 200 || res.End != envoysim.StreamOpen || res.At != events*gap || len(res.Delivered) != events {
					t.Fatalf("route %s: %v at %v with %d of %d events delivered, want the stream open after %v",
						r.GetName(), res.End, res.At, len(res.Delivered), events, events*gap)
				}
				for i, d := range res.Delivered {
					if d.At != time.Duration(i+1)*gap {
						t.Fatalf("route %s: event %d reached the agent at %v, want %v: held back", r.GetName(), i, d.At, time.Duration(i+1)*gap)
					}
				}
				if got, want := fmt.Sprint(res.Phases()), fmt.Sprint([]envoysim.Phase{envoysim.PhaseRequestHeaders, envoysim.PhaseRequestBody}); got != want {
					t.Errorf("route %s: phases %s, want %s: the answer must not reach the server", r.GetName(), got, want)
				}
			})
		}
	}
}

// fromRequest lists r's headers as Envoy's filter chain sees them.
func fromRequest(r *http.Request) []envoysim.Header {
	var out []envoysim.Header
	for _, name := range slices.Sorted(maps.Keys(r.Header)) {
		for _, v := range r.Header[name] {
			out = append(out, envoysim.Header{Name: strings.ToLower(name), Value: v})
		}
	}
	return out
}

// TestMCPListenRouteKeepsTheBodyCheck: a protected tools/call whose
// headers call it a subscriptions/listen reaches the listen route, whose
// answer the server never sees; the server, deciding at the body, refuses
// it as a server of that revision would (HTTP 400, -32020), and the tool
// never runs.
func TestMCPListenRouteKeepsTheBodyCheck(t *testing.T) {
	cfg, err := checkEnvoyConfig(readFile(t, filepath.Join(repoRoot, "envoy", "envoy-mcp.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	hcm := cfg.hcms[0]
	filterCfg := proto.Clone(hcm.extProc).(*extprocv3.ExternalProcessor)
	filterCfg.MessageTimeout = durationpb.New(harness.TestMessageTimeout)
	hr := listenRequest(t, policy.MCPValidatedFrom, policy.SubscriptionsListen)
	r, err := routeFor(hcm.hcm.GetRouteConfig(), hr)
	if err != nil {
		t.Fatal(err)
	}
	per, err := extProcPerRoute(r.GetTypedPerFilterConfig())
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": "agent-a"}})
	req := &envoysim.Request{Method: hr.Method, Path: hr.URL.Path, Authority: hr.Host, RouteName: r.GetName(), PerRoute: per,
		Headers: fromRequest(hr), DynamicMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": payload},
		Body: []byte(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"create_payment",` +
			`"arguments":{"amount":1,"idempotency_key":"k-1"},"_meta":{"io.modelcontextprotocol/protocolVersion":"` + policy.MCPValidatedFrom + `"}}}`)}
	ran := false
	tool := func(context.Context, *envoysim.Request) (*envoysim.StreamedAnswer, error) {
		ran = true
		return &envoysim.StreamedAnswer{Status: 200, Ends: true}, nil
	}
	res := envoysim.NewFilter(mcpServer(t), filterCfg, envoysim.Options{}).DoStream(t.Context(), req, routeTimeouts(hcm.hcm, r), tool)
	if ran || res.Response == nil || res.Response.Status != http.StatusBadRequest || !strings.Contains(string(res.Response.Body), "-32020") {
		t.Fatalf("route %s: the tool ran %v; answer %s, want 400 with -32020", r.GetName(), ran, res)
	}
}

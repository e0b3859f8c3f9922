package extproc_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/region"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
)

// homeFront is region eu's server, whose map homes the authority
// us.example in us, with sendHome as given, behind an Envoy-faithful filter
// whose routes send x-idem-home: us to us's upstream and strip the header
// from clients unless internal.
func homeFront(t *testing.T, sendHome, internal bool) (*envoysim.Filter, map[string]idem.Store) {
	t.Helper()
	stores := map[string]region.Store{}
	bare := map[string]idem.Store{}
	for _, name := range []string{"eu", "us"} {
		st := memstore.New(memstore.Options{})
		stores[name], bare[name] = region.Store{Store: st, Budget: 100 * time.Millisecond}, st
	}
	r, err := region.NewRouter("eu", stores, 2500*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := policy.Default()
	p.Homes = &policy.Homes{Epoch: 1, Default: "eu", Rules: []policy.HomeRule{{Scopes: []string{"us.example"}, Region: "us"}}}
	set := &policy.Set{Policies: []*policy.Policy{p}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	var sendTo []string
	if sendHome {
		sendTo = []string{"us"}
	}
	extprocv3.RegisterExternalProcessorServer(gs, extproc.New(extproc.Config{Store: bare["eu"], Homes: r, SendHome: sendTo,
		MaxMessageTimeout: 2500 * time.Millisecond, Policies: func() *policy.Set { return set }}))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	cfg := envoysim.RecommendedConfig()
	cfg.MaxMessageTimeout = nil
	f := envoysim.NewFilter(cc, cfg, envoysim.Options{InternalClient: internal, InternalOnlyHeaders: []string{extproc.HomeHeader},
		Routes: []envoysim.Route{
			{Name: "home-us", Header: extproc.HomeHeader, Value: "us", Upstream: answer("us")},
			{Name: "orders", Upstream: answer("eu")},
		}})
	return f, bare
}

func answer(region string) envoysim.Upstream {
	return func(context.Context, *envoysim.Request) (*envoysim.Response, error) {
		return &envoysim.Response{Status: 201, Body: []byte(region)}, nil
	}
}

func write(authority, key string, hs ...envoysim.Header) *envoysim.Request {
	return &envoysim.Request{Method: "POST", Path: "/orders", Authority: authority, Body: []byte(`{"n":1}`),
		Headers: append([]envoysim.Header{{Name: "idempotency-key", Value: key}, {Name: "content-type", Value: "application/json"}}, hs...)}
}

// TestSendHomeThroughEnvoy: with SendHome, a first write entering eu whose
// scope is homed in us is sent to us's route at its request headers (the
// header set and the route cache cleared in one reply, every later phase
// skipped), and eu's server asks no store; a scope homed in eu is decided
// here. A client that sends the header itself never chooses the route (the
// proxy strips it); a request that arrives marked for another region than
// the one this server's map names is refused, never run.
func TestSendHomeThroughEnvoy(t *testing.T) {
	ctx := context.Background()
	f, stores := homeFront(t, true, false)
	res := f.Do(ctx, write("us.example", "k1"), answer("unrouted"))
	if res.Response == nil || string(res.Response.Body) != "us" || res.UpstreamRequest.RouteName != "home-us" {
		t.Fatalf("homed in us: %+v (%v); want us's route", res.Response, res)
	}
	if got, _ := envoysim.Get(res.UpstreamRequest.Headers, extproc.HomeHeader); got != "us" {
		t.Errorf("us receives %s %q, want us: the mark its server honours", extproc.HomeHeader, got)
	}
	if ph := res.Phases(); len(ph) != 1 || ph[0] != envoysim.PhaseRequestHeaders {
		t.Errorf("phases %v, want the request headers only", ph)
	}
	for name, st := range stores {
		if _, err := st.Get(ctx, idem.RecordIDFor(policy.Default().RecordNamespace(), "us.example", "k1")); err == nil {
			t.Errorf("%s's store holds a record of a request sent home", name)
		}
	}

	res = f.Do(ctx, write("eu.example", "k2", envoysim.Header{Name: extproc.HomeHeader, Value: "us"}), answer("unrouted"))
	if res.Response == nil || string(res.Response.Body) != "eu" {
		t.Fatalf("homed in eu, a forged header: %+v; want eu's route, decided here", res.Response)
	}
	if _, err := stores["eu"].Get(ctx, idem.RecordIDFor(policy.Default().RecordNamespace(), "eu.example", "k2")); err != nil {
		t.Errorf("a write homed here has no record here: %v", err)
	}

	// Marked by another region's server, which thought eu the home of a
	// scope eu's map homes in us: refused, at most one hop.
	marked, _ := homeFront(t, true, true)
	res = marked.Do(ctx, write("us.example", "k3", envoysim.Header{Name: extproc.HomeHeader, Value: "eu"}), answer("unrouted"))
	if res.Response == nil || res.Response.Status != 503 || !strings.Contains(string(res.Response.Body), "idempotency-homes-disagree") || res.UpstreamCalled {
		t.Fatalf("marked for eu, homed in us: %+v, upstream called %v; want 503 idempotency-homes-disagree", res.Response, res.UpstreamCalled)
	}
}

// TestWithoutSendHomeNothingMoves: without the option a write homed in
// another region takes the path it always took: decided here, its record
// in the home's store across regions, the local route.
func TestWithoutSendHomeNothingMoves(t *testing.T) {
	ctx := context.Background()
	f, stores := homeFront(t, false, false)
	res := f.Do(ctx, write("us.example", "k1"), answer("unrouted"))
	if res.Response == nil || string(res.Response.Body) != "eu" {
		t.Fatalf("%+v; want the local route", res.Response)
	}
	if _, err := stores["us"].Get(ctx, idem.RecordIDFor(policy.Default().RecordNamespace(), "us.example", "k1")); err != nil {
		t.Errorf("the record is not in the home's store: %v", err)
	}
}

package envoysim

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// homeRoutes is a route table with a route per home region, matched on
// x-home, before the local one (the shipped envoy/envoy-regions.yaml's
// shape); each upstream answers its route's name.
func homeRoutes() []Route {
	return []Route{
		{Name: "home-us", Header: "x-home", Value: "us", Upstream: echoUpstream(200, "us")},
		{Name: "local", Upstream: echoUpstream(200, "local")},
	}
}

// markHome is a CommonResponse that sets x-home: us, with clear_route_cache
// as given; without a header mutation when bare.
func markHome(clear, bare bool) *extprocv3.CommonResponse {
	cr := &extprocv3.CommonResponse{ClearRouteCache: clear}
	if !bare {
		cr.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "x-home", RawValue: []byte("us")}}}}
	}
	return cr
}

// replyAt answers the message of phase with cr and every other CONTINUE.
func replyAt(phase Phase, cr *extprocv3.CommonResponse) func(extprocv3.ExternalProcessor_ProcessServer) error {
	return func(st extprocv3.ExternalProcessor_ProcessServer) error {
		for {
			m, err := st.Recv()
			if err != nil {
				return nil
			}
			resp := cont(m)
			switch {
			case phase == PhaseRequestHeaders && m.GetRequestHeaders() != nil:
				resp.GetRequestHeaders().Response = cr
			case phase == PhaseRequestBody && m.GetRequestBody() != nil:
				resp.GetRequestBody().Response = cr
			case phase == PhaseResponseHeaders && m.GetResponseHeaders() != nil:
				resp.GetResponseHeaders().Response = cr
			}
			if err := st.Send(resp); err != nil {
				return err
			}
		}
	}
}

// TestRouteCacheClearedReselectsTheRoute: a request-direction reply with a
// header mutation clears the route cache as route_cache_action says
// (processor_state.cc DecodingProcessorState::clearRouteCache), and the
// router then selects the route again from the mutated headers
// (conn_manager_impl.cc ActiveStream::refreshCachedRoute; router.cc
// Filter::decodeHeaders). xds.route_name was sent with the route selected
// first.
func TestRouteCacheClearedReselectsTheRoute(t *testing.T) {
	for _, c := range []struct {
		name     string
		phase    Phase
		cr       *extprocv3.CommonResponse
		action   extprocfilterv3.ExternalProcessor_RouteCacheAction
		disable  bool
		wantBody string
	}{
		{"headers, clear_route_cache", PhaseRequestHeaders, markHome(true, false), 0, false, "us"},
		{"body, clear_route_cache", PhaseRequestBody, markHome(true, false), 0, false, "us"},
		{"mutation without clear_route_cache keeps the route", PhaseRequestHeaders, markHome(false, false), 0, false, "local"},
		{"clear_route_cache without a mutation is ignored", PhaseRequestHeaders, markHome(true, true), 0, false, "local"},
		{"CLEAR clears on any mutation", PhaseRequestHeaders, markHome(false, false), extprocfilterv3.ExternalProcessor_CLEAR, false, "us"},
		{"RETAIN never clears", PhaseRequestHeaders, markHome(true, false), extprocfilterv3.ExternalProcessor_RETAIN, false, "local"},
		{"disable_clear_route_cache is RETAIN", PhaseRequestHeaders, markHome(true, false), 0, true, "local"},
		{"the response direction never clears", PhaseResponseHeaders, markHome(true, false), 0, false, "local"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := RecommendedConfig()
			cfg.RouteCacheAction, cfg.DisableClearRouteCache = c.action, c.disable
			s := &scripted{script: replyAt(c.phase, c.cr)}
			f := start(t, s, cfg, Options{Routes: homeRoutes()})
			res := f.Do(context.Background(), post(`{"a":1}`), echoUpstream(500, "unrouted"))
			if res.Response == nil || string(res.Response.Body) != c.wantBody {
				t.Fatalf("response %+v; want the body of %q (%v)", res.Response, c.wantBody, res)
			}
			if c.wantBody == "us" && res.UpstreamRequest.RouteName != "home-us" {
				t.Errorf("upstream request's route %q, want home-us", res.UpstreamRequest.RouteName)
			}
			a := s.received()[0].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
			if got := a["xds.route_name"].GetStringValue(); got != "local" {
				t.Errorf("xds.route_name %q, want the route selected before the filter: local", got)
			}
		})
	}
}

// TestInternalOnlyHeadersNeverRouteAClient: a header the route
// configuration lists in internal_only_headers is removed from a client not
// counted internal before the route is selected and before the filter sees
// the request (conn_manager_utility.cc mutateRequestHeaders →
// cleanInternalHeaders); an internal client keeps it. No matching route is
// 404 route_not_found (router.cc Filter::decodeHeaders).
func TestInternalOnlyHeadersNeverRouteAClient(t *testing.T) {
	forged := post(`{"a":1}`)
	forged.Headers = append(forged.Headers, Header{"x-home", "us"})
	for _, internal := range []bool{false, true} {
		s := &scripted{script: continueAll(nil)}
		f := start(t, s, nil, Options{Routes: homeRoutes(), InternalOnlyHeaders: []string{"x-home"}, InternalClient: internal})
		res := f.Do(context.Background(), forged, echoUpstream(500, "unrouted"))
		want := "local"
		if internal {
			want = "us"
		}
		if res.Response == nil || string(res.Response.Body) != want {
			t.Fatalf("internal client %v: response %+v, want %q", internal, res.Response, want)
		}
		seen := false
		for _, h := range s.received()[0].GetRequestHeaders().GetHeaders().GetHeaders() {
			seen = seen || h.GetKey() == "x-home"
		}
		if seen != internal {
			t.Errorf("internal client %v: the server saw x-home %v", internal, seen)
		}
	}

	s := &scripted{script: continueAll(nil)}
	f := start(t, s, nil, Options{Routes: []Route{{Name: "only-us", Header: "x-home", Value: "us"}}})
	res := f.Do(context.Background(), post(`{"a":1}`), echoUpstream(200, "ok"))
	if res.Response == nil || res.Response.Status != 404 || res.Response.Details != "route_not_found" || res.UpstreamCalled {
		t.Fatalf("no route: %+v, upstream called %v; want 404 route_not_found", res.Response, res.UpstreamCalled)
	}
}

package envoysim

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Routing: the connection manager's route table, the route it caches for a
// request, and the ext_proc filter clearing that cache so that the router
// re-selects the route from the headers the server mutated (FIDELITY.md,
// "Routing").

// Route is one route of a route configuration (Options.Routes), matched as
// the connection manager matches a route against the request's headers: in
// order, the first that matches wins. Only an exact header match is
// modelled.
type Route struct {
	// Name is the route's name: the xds.route_name attribute, and the
	// upstream request's RouteName.
	Name string
	// Header and Value: the route matches a request whose first value of
	// Header is Value; an empty Header matches every request.
	Header, Value string
	// Upstream is the route's cluster; nil for the Upstream given to
	// Filter.Do.
	Upstream Upstream
}

// RouteNotFound is the router's reply when no route matches (router.cc
// Filter::decodeHeaders: "no route match", 404 with an empty body, flag
// NoRouteFound, details route_not_found).
var RouteNotFound = &UpstreamFailure{Status: 404, Details: "route_not_found", Flags: FlagNoRouteFound}

// routing is one request's route cache: the route the connection manager
// selected, and whether a filter cleared it since.
type routing struct {
	route   *Route
	cleared bool
}

// selectRoute is the connection manager's route selection for headers
// (conn_manager_impl.cc ActiveStream::refreshCachedRoute:
// snapped_route_config_->route(cb, *request_headers_, …)): the first route
// that matches, nil for none.
func selectRoute(routes []Route, headers []Header) *Route {
	for i := range routes {
		r := &routes[i]
		if r.Header == "" {
			return r
		}
		if v, ok := Get(headers, r.Header); ok && v == r.Value {
			return r
		}
	}
	return nil
}

// cleanInternalOnly removes the route configuration's internal_only_headers
// from a client the connection manager does not count as internal, before
// any filter or route selection sees the request
// (conn_manager_utility.cc ConnectionManagerUtility::mutateRequestHeaders →
// cleanInternalHeaders(request_headers, edge_request,
// route_config.internalOnlyHeaders())).
func cleanInternalOnly(hs []Header, opts Options) []Header {
	if opts.InternalClient {
		return hs
	}
	for _, name := range opts.InternalOnlyHeaders {
		hs = remove(hs, name)
	}
	return hs
}

// startRouting selects the request's route once the connection manager
// built its headers, before the filters run: the route's name is what the
// filter sends as xds.route_name. Without Options.Routes the request keeps
// the route its caller named.
func (x *exchange) startRouting() {
	if len(x.f.opts.Routes) == 0 {
		return
	}
	x.routing.route = selectRoute(x.f.opts.Routes, x.reqHeaders)
	req := *x.req
	req.RouteName = ""
	if x.routing.route != nil {
		req.RouteName = x.routing.route.Name
	}
	x.req = &req
}

// clearRouteCache is DecodingProcessorState::clearRouteCache
// (processor_state.cc), called after a request-direction reply's header
// mutation was applied (handleHeadersResponse, handleBodyResponse): without
// a header_mutation in the reply nothing is cleared (a clear_route_cache
// flag alone is ignored, counted clear_route_cache_ignored); otherwise
// route_cache_action decides: DEFAULT clears when the reply sets
// clear_route_cache, CLEAR always, RETAIN never. disable_clear_route_cache
// is RETAIN (ext_proc.cc FilterConfig::FilterConfig). The response
// direction's replies never clear: the route was used by then.
func (x *exchange) clearRouteCache(phase Phase, cr *extprocv3.CommonResponse) {
	if phase != PhaseRequestHeaders && phase != PhaseRequestBody || cr.GetHeaderMutation() == nil {
		return
	}
	action := x.f.cfg.GetRouteCacheAction()
	if x.f.cfg.GetDisableClearRouteCache() {
		action = extprocfilterv3.ExternalProcessor_RETAIN
	}
	switch action {
	case extprocfilterv3.ExternalProcessor_CLEAR:
		x.routing.cleared = true
	case extprocfilterv3.ExternalProcessor_DEFAULT:
		x.routing.cleared = x.routing.cleared || cr.GetClearRouteCache()
	}
}

// routed is the route the router reads at decodeHeaders (router.cc
// Filter::decodeHeaders: route_ = callbacks_->route()), which runs after
// the filters before it let the request go: the cached one, or, once a
// filter cleared the cache, the one selected again from the request's
// headers as they are now (conn_manager_impl.cc ActiveStream::route →
// refreshCachedRoute). ok is false when routes are modelled and none
// matches: the router answers RouteNotFound.
func (x *exchange) routed(headers []Header, up Upstream, upReq *Request) (Upstream, bool) {
	if len(x.f.opts.Routes) == 0 {
		return up, true
	}
	if x.routing.cleared {
		x.routing.route, x.routing.cleared = selectRoute(x.f.opts.Routes, headers), false
	}
	r := x.routing.route
	if r == nil {
		return nil, false
	}
	upReq.RouteName = r.Name
	if r.Upstream != nil {
		return r.Upstream, true
	}
	return up, true
}

package extproc

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// HomeHeader is the request header a server sets to send a request to its
// scope's home region (attempt.SendHome): the proxy's routes match its
// value, a region's name, to that region's cluster, and the home region's
// server reads it as the mark of a request that was sent once and is never
// sent again. The proxy must remove it from clients (a route
// configuration's internal_only_headers) and keep it on the listener other
// regions send to: docs/regions.md, envoy/envoy-regions.yaml.
const HomeHeader = "x-idem-home"

// homeReply lets the request go on to its home region's route: HomeHeader
// set, and clear_route_cache in the same reply, which Envoy honours only in
// a reply that carries a header mutation (processor_state.cc
// DecodingProcessorState::clearRouteCache); the router then selects the
// route again from the mutated headers (router.cc Filter::decodeHeaders,
// conn_manager_impl.cc ActiveStream::refreshCachedRoute). Nothing more of
// the request concerns this server: at the headers every later phase is
// skipped; a BUFFERED body's reply still holds the headers, so it may set
// them too (processor_state.cc handleBodyResponse). A trailers reply
// carries no clear_route_cache: nil, and the request is refused
// (problem.HomeOutOfReach), nothing having been reserved.
func homeReply(ph phase, home string) *extprocv3.ProcessingResponse {
	cr := &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{
		SetHeaders: []*corev3.HeaderValueOption{setHeader(HomeHeader, home, false)}}}
	switch ph {
	case phaseRequestHeaders:
		resp := continueWith(ph, skipEverything)
		resp.GetRequestHeaders().Response = cr
		return resp
	case phaseRequestBody:
		resp := continueWith(ph, nil)
		resp.GetRequestBody().Response = cr
		return resp
	}
	return nil
}

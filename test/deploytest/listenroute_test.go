package deploytest

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/proto"

	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// requestOnlyModes is the processing mode of a route whose request is
// decided as on any protected route (headers, then the whole body) and
// whose answer goes by unprocessed, as it comes: MCP 2026-07-28's
// subscriptions/listen, answered by an event stream that stays open
// (modelcontextprotocol, docs/specification/2026-07-28/basic/transports/
// streamable-http.mdx, "Receiving Messages"). Envoy then sends the server
// nothing of the answer (processor_state.h noExternalProcess), and the
// server, having passed the request, ends its stream.
var requestOnlyModes = &extprocv3.ProcessingMode{
	RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
	RequestBodyMode:     extprocv3.ProcessingMode_BUFFERED,
	RequestTrailerMode:  extprocv3.ProcessingMode_SKIP,
	ResponseHeaderMode:  extprocv3.ProcessingMode_SKIP,
	ResponseBodyMode:    extprocv3.ProcessingMode_NONE,
	ResponseTrailerMode: extprocv3.ProcessingMode_SKIP,
}

// requestOnlyOverrides reports whether o only sets requestOnlyModes.
func requestOnlyOverrides(o *extprocv3.ExtProcOverrides) bool {
	return proto.Equal(o, &extprocv3.ExtProcOverrides{ProcessingMode: requestOnlyModes})
}

// checkRequestOnlyRoute reports whether r leaves its answer unprocessed
// (requestOnlyModes), and if so checks that only a subscriptions/listen
// request of a revision whose servers check Mcp-Method against the body
// reaches it: the server still decides it at its body, and a protected
// call whose headers name the method is refused there as a header
// mismatch (-32020, "Server Validation"). A call the server protected on
// such a route would never see its answer stored.
func checkRequestOnlyRoute(r *routev3.Route, methods []string) (bool, error) {
	pr, err := extProcPerRoute(r.GetTypedPerFilterConfig())
	if err != nil || pr.GetOverrides() == nil || !requestOnlyOverrides(pr.GetOverrides()) {
		return false, err
	}
	var errs []error
	if !slices.Equal(methods, []string{"POST"}) {
		errs = append(errs, fmt.Errorf("leaves its answer unprocessed but matches %v, not POST alone", methods))
	}
	exact := false
	for _, h := range r.GetMatch().GetHeaders() {
		sm := h.GetStringMatch()
		exact = exact || h.GetName() == policy.MCPMethodHeader && sm.GetExact() == policy.SubscriptionsListen &&
			!sm.GetIgnoreCase() && !h.GetInvertMatch()
	}
	if !exact {
		errs = append(errs, fmt.Errorf("leaves its answer unprocessed but does not match %s exactly %q", policy.MCPMethodHeader, policy.SubscriptionsListen))
	}
	for v, match := range map[string]bool{policy.MCPValidatedFrom: true, "2027-01-15": true, "2025-11-25": false, "2026-07-27": false, "": false} {
		if got, err := headerMatchesIn(r, policy.MCPVersionHeader, v); err != nil || got != match {
			errs = append(errs, fmt.Errorf("leaves its answer unprocessed: with %s %q it matches %v, want %v (%v)",
				policy.MCPVersionHeader, v, got, match, err))
		}
	}
	return true, errors.Join(errs...)
}

// headerMatchesIn evaluates r's matchers on one header holding v ("" for
// absent); a header r has no matcher for matches.
func headerMatchesIn(r *routev3.Route, name, v string) (bool, error) {
	ok, found := true, false
	for _, h := range r.GetMatch().GetHeaders() {
		if h.GetName() != name {
			continue
		}
		found = true
		hit, err := headerMatches(h, v)
		if err != nil {
			return false, err
		}
		ok = ok && hit && v != "" // Envoy's string matchers never match an absent header
	}
	return ok && found, nil
}

// TestMCPListenRoute: the shipped MCP configuration gives
// subscriptions/listen a route of its own, ahead of the message route,
// with no route timeout and its answer unprocessed.
func TestMCPListenRoute(t *testing.T) {
	cfg, err := checkEnvoyConfig(readFile(t, filepath.Join(repoRoot, "envoy", "envoy-mcp.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	rc := cfg.hcms[0].hcm.GetRouteConfig()
	r, err := routeFor(rc, listenRequest(t, policy.MCPValidatedFrom, policy.SubscriptionsListen))
	if err != nil {
		t.Fatal(err)
	}
	if requestOnly, err := checkRequestOnlyRoute(r, []string{"POST"}); !requestOnly || err != nil {
		t.Fatalf("subscriptions/listen reaches route %s, which does not leave its answer alone: %v", r.GetName(), err)
	}
	if to := r.GetRoute().GetTimeout(); to == nil || to.AsDuration() != 0 {
		t.Errorf("route %s: timeout %v, want 0s: a route timeout ends the subscription", r.GetName(), to.AsDuration())
	}
	call, err := routeFor(rc, listenRequest(t, policy.MCPValidatedFrom, "tools/call"))
	if err != nil || call.GetName() == r.GetName() {
		t.Errorf("a tools/call reaches route %s too (%v)", call.GetName(), err)
	}
}

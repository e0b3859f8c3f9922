package extproc

import (
	"context"
	"testing"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
)

// TestSendHomeReplyPerPhase: a SendHome verdict is the home header and
// clear_route_cache in one reply, at the request headers (every later phase
// skipped) and at a BUFFERED body (whose reply may still set headers); a
// trailers reply carries no clear_route_cache, so a request decided there
// is refused with a 503, never let through unprotected.
func TestSendHomeReplyPerPhase(t *testing.T) {
	for _, ph := range []phase{phaseRequestHeaders, phaseRequestBody} {
		p := &processor{phase: ph}
		resp := p.render(context.Background(), attempt.Verdict{Kind: attempt.SendHome, Home: "us"})
		cr := resp.GetRequestHeaders().GetResponse()
		if ph == phaseRequestBody {
			cr = resp.GetRequestBody().GetResponse()
		}
		set := cr.GetHeaderMutation().GetSetHeaders()
		if !cr.GetClearRouteCache() || len(set) != 1 || set[0].GetHeader().GetKey() != HomeHeader || string(set[0].GetHeader().GetRawValue()) != "us" {
			t.Fatalf("phase %v: reply %v; want %s: us with clear_route_cache", ph, resp, HomeHeader)
		}
		if p.stage != stagePassThrough {
			t.Errorf("phase %v: stage %v, want pass-through", ph, p.stage)
		}
		if ph == phaseRequestHeaders && resp.GetModeOverride().GetResponseHeaderMode() != procmodev3.ProcessingMode_SKIP {
			t.Errorf("headers reply: mode override %v, want every later phase skipped", resp.GetModeOverride())
		}
	}
	p := &processor{phase: phaseRequestTrailers}
	if ir := p.render(context.Background(), attempt.Verdict{Kind: attempt.SendHome, Home: "us"}).GetImmediateResponse(); ir == nil || ir.GetStatus().GetCode() != 503 {
		t.Fatalf("trailers: %v, want an immediate 503", ir)
	}
}

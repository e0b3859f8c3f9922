package envoysim

import (
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/proto"
)

func (x *exchange) overrideAllowed() bool {
	c := x.f.cfg
	full := extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	return c.GetAllowModeOverride() && !c.GetSendBodyWithoutWaitingForHeaderResponse() &&
		c.GetProcessingMode().GetRequestBodyMode() != full && c.GetProcessingMode().GetResponseBodyMode() != full
}

// applyOverride merges an override into the filter-level mode as
// effectiveModeOverride does, checks allowed_override_modes, and applies it
// to both directions. It reports whether the override took effect.
func (x *exchange) applyOverride(o *extprocfilterv3.ProcessingMode) bool {
	base := x.f.cfg.GetProcessingMode()
	m := proto.Clone(base).(*extprocfilterv3.ProcessingMode)
	if m == nil {
		m = &extprocfilterv3.ProcessingMode{}
	}
	if o.GetRequestHeaderMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.RequestHeaderMode = o.GetRequestHeaderMode()
	}
	if o.GetResponseHeaderMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.ResponseHeaderMode = o.GetResponseHeaderMode()
	}
	if o.GetRequestTrailerMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.RequestTrailerMode = o.GetRequestTrailerMode()
	}
	if o.GetResponseTrailerMode() != extprocfilterv3.ProcessingMode_DEFAULT {
		m.ResponseTrailerMode = o.GetResponseTrailerMode()
	}
	m.RequestBodyMode = o.GetRequestBodyMode()
	m.ResponseBodyMode = o.GetResponseBodyMode()
	if allowed := x.f.cfg.GetAllowedOverrideModes(); len(allowed) > 0 {
		ok := false
		for _, a := range allowed {
			ok = ok || (a.GetResponseHeaderMode() == m.GetResponseHeaderMode() &&
				a.GetRequestBodyMode() == m.GetRequestBodyMode() && a.GetResponseBodyMode() == m.GetResponseBodyMode() &&
				a.GetRequestTrailerMode() == m.GetRequestTrailerMode() && a.GetResponseTrailerMode() == m.GetResponseTrailerMode())
		}
		if !ok {
			return false
		}
	}
	x.mode = m
	return true
}

package extproc

import (
	"context"
	"log/slog"
	"net/textproto"
	"strings"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// refuse answers a request the policy refuses before any store call (key
// missing or invalid, no principal, body too large). A shadow policy only
// counts what it would have refused, and lets the request on.
func (p *processor) refuse(ctx context.Context, req *extprocv3.ProcessingRequest, prob *problem.Problem) *extprocv3.ProcessingResponse {
	if p.att.Policy.Enforcement == policy.EnforcementShadow {
		p.shadowDecided(ctx, idem.ShadowWouldReject, slog.String("problem", prob.Slug))
		return p.passThrough(req)
	}
	return p.reject(ctx, prob)
}

// decideShadow answers from a shadow policy's decision
// (attempt.DecideShadow): the request goes on whatever it is; a first
// attempt holds its reservation as an enforced one does.
func (p *processor) decideShadow(ctx context.Context, req *extprocv3.ProcessingRequest, fp idem.Fingerprint) *extprocv3.ProcessingResponse {
	d, err := p.att.DecideShadow(ctx, fp)
	if err != nil {
		p.shadowDecided(ctx, d, slog.String("error", err.Error()))
		return p.passThrough(req)
	}
	p.shadowDecided(ctx, d)
	if d == idem.ShadowWouldReserve {
		return p.proceed(req)
	}
	return p.passThrough(req)
}

// shadowDecided records a shadow policy's decision: counted, logged, on
// the span, and, when the policy names a shadow header, told to the client
// on the response ("would-replay"). gRPC answers carry no such header.
func (p *processor) shadowDecided(ctx context.Context, d idem.ShadowDecision, attrs ...slog.Attr) {
	p.Decided(idem.DecisionShadowed)
	p.srv.obs.ShadowDecided(p.att.Policy.Name, d)
	if p.span != nil {
		p.span.SetAttributes(attribute.String("idem.shadow_decision", string(d)))
	}
	level := slog.LevelInfo
	if d == idem.ShadowStoreError {
		level = slog.LevelWarn
	}
	p.LogAt(ctx, level, "shadow decision", append(attrs, slog.String("shadow_decision", string(d)))...)
	if p.att.Policy.ShadowHeader != "" && !p.rpc.call {
		p.respAdd = append(p.respAdd, setHeader(p.att.Policy.ShadowHeader, strings.ReplaceAll(string(d), "_", "-"), false))
	}
}

// graceWithoutKey lets a request without a required key on during the
// policy's grace period (key.warn_until): counted, and with a Warning
// header that says from when the key is required. The header has RFC 7234
// §5.5's form (code 299, a persistent warning); RFC 9111 retired the
// field, but clients, logs and tools still show it, and a header of its
// own would need every client taught about it. A shadow policy, which refuses nothing anyway, measures what
// enforcement would do now: pass it, so it is only a keyless request.
func (p *processor) graceWithoutKey(ctx context.Context, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	p.Decided(idem.DecisionBypassed)
	if p.att.Policy.Enforcement == policy.EnforcementShadow {
		return p.passThrough(req)
	}
	p.srv.obs.KeyWarned(p.att.Policy.Name)
	p.LogAt(ctx, slog.LevelInfo, "key missing; passed in its grace period", slog.Time("warn_until", p.att.Policy.KeyWarnUntil))
	if !p.rpc.call {
		p.respAdd = append(p.respAdd, setHeader("warning", GraceWarning(p.att.Policy.KeyHeader, p.att.Policy.KeyWarnUntil), true))
	}
	return p.passThrough(req)
}

// GraceWarning is the Warning header value sent during a required key's
// grace period.
func GraceWarning(keyHeader string, until time.Time) string {
	return `299 idem-extproc "` + textproto.CanonicalMIMEHeaderKey(keyHeader) + ` will be required from ` +
		until.UTC().Format(time.RFC3339) + `; requests without it will then be refused with 400"`
}

// withAddedHeaders adds respAdd to a response headers reply.
func (p *processor) withAddedHeaders(resp *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	hr := resp.GetResponseHeaders()
	if len(p.respAdd) == 0 || hr == nil {
		return resp
	}
	if hr.Response == nil {
		hr.Response = &extprocv3.CommonResponse{}
	}
	if hr.Response.HeaderMutation == nil {
		hr.Response.HeaderMutation = &extprocv3.HeaderMutation{}
	}
	hr.Response.HeaderMutation.SetHeaders = append(hr.Response.HeaderMutation.SetHeaders, p.respAdd...)
	p.respAdd = nil
	return resp
}

package extproc

import (
	"context"
	"log/slog"
	"sync"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// MissingAttributeMessage is the log message of a missing attribute, logged
// once per policy and attribute at warn.
const MissingAttributeMessage = "Envoy did not send an attribute the policy needs (logged once per policy)"

// missingOnce remembers which (policy, attribute) pairs were logged, so a
// filter configured without an attribute is one warning per policy, not
// one per request; the counter counts every request.
type missingOnce struct{ seen sync.Map }

// missingAttribute counts a request whose policy needed an attribute that
// never arrived, and logs it the first time for the policy.
func (p *processor) missingAttribute(ctx context.Context, policyName, name, why string) {
	p.srv.obs.MissingAttribute(policyName, name)
	if _, loaded := p.srv.missing.seen.LoadOrStore(policyName+"\x00"+name, true); loaded {
		return
	}
	p.LogAt(ctx, slog.LevelWarn, MissingAttributeMessage,
		slog.String("policy", policyName), slog.String("attribute", name),
		slog.String("fix", "add "+name+" to the ext_proc filter's "+envoyorigin.MissingAttributes[name]),
		slog.String("consequence", why))
}

// routeNameMissing reports, for each policy that matches on route names, a
// request that came without xds.route_name: such a policy can never match.
func (p *processor) routeNameMissing(ctx context.Context) {
	for _, pol := range p.policies.Policies {
		if len(pol.Match.RouteNames) > 0 {
			p.missingAttribute(ctx, pol.Name, envoyorigin.AttrRouteName, "the policy matches on route names and protects nothing")
		}
	}
}

// PrincipalAttribute names the attribute a principal scope reads.
func PrincipalAttribute(id policy.PeerIdentity) string {
	switch id {
	case policy.PeerDNSSAN:
		return envoyorigin.AttrDNSSanPeer
	case policy.PeerSubject:
		return envoyorigin.AttrSubjectPeer
	}
	return envoyorigin.AttrURISanPeer
}

// responseOrigin classifies a response from its attributes. Without
// response.code_details a response of Envoy's own (a 504 route timeout, a
// 503 reset) looks like the upstream's and would be stored and replayed;
// without upstream.request_attempt_count a router failure after a retry
// looks like a first attempt that never left, and is kept as maybe-sent
// instead of released. Both absences are reported. retried says whether an
// earlier upstream attempt may have been sent (Signals.MayHaveRetried).
func (p *processor) responseOrigin(ctx context.Context, attrs *structpb.Struct) (origin idem.Origin, retried bool) {
	fields := attrs.GetFields()
	dv, hasDetails := fields[envoyorigin.AttrCodeDetails]
	// Envoy sends a CEL uint as a number (matching_utils.cc
	// evaluateAttributes); any other kind is not a count.
	_, hasAttempts := fields[envoyorigin.AttrAttemptCount].GetKind().(*structpb.Value_NumberValue)
	// grpc-go's filter (gRFC A93) makes no local replies of Envoy's kind and
	// no router retries: there is nothing for the attributes to tell apart.
	if p.att.Held() && !p.rpc.proxyless {
		if !hasDetails {
			p.missingAttribute(ctx, p.att.Policy.Name, envoyorigin.AttrCodeDetails,
				"Envoy's own error replies cannot be told from the upstream's and are stored as its answer")
		}
		if !hasAttempts {
			p.missingAttribute(ctx, p.att.Policy.Name, envoyorigin.AttrAttemptCount,
				"a response after a router retry cannot be told from a first attempt's; what would be released (a connection failure, an overflow, the upstream's 408/425/429) is kept as outcome unknown instead")
		}
	}
	s := envoyorigin.Signals{
		Details: valueString(dv), HasDetails: hasDetails,
		Flags:    attrUint(attrs, envoyorigin.AttrFlags),
		Attempts: attrUint(attrs, envoyorigin.AttrAttemptCount), HasAttempts: hasAttempts,
	}
	// grpc-go's client makes one attempt per call (gRFC A93 has no router).
	return envoyorigin.Classify(s), s.MayHaveRetried() && !p.rpc.proxyless
}

// hasAttr reports whether Envoy sent the attribute at all (an unnamed
// route's xds.route_name is present and empty, context.cc XDSLookupValues).
func hasAttr(a *structpb.Struct, name string) bool {
	_, ok := a.GetFields()[name]
	return ok
}

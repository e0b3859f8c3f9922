package extproc

import (
	"context"
	"log/slog"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Envoy's facts: what a message says beside its phase's payload, and what
// the server reads of them (the request's target, its scope, who made a
// response), with the attributes a policy needs and did not get reported.

// envoyFacts are what a message carries beside its payload.
type envoyFacts struct {
	// attrs are the attributes Envoy was asked to send (attributes).
	attrs *structpb.Struct
	// metadata is the forwarded dynamic metadata.
	metadata *corev3.Metadata
	protocol *extprocv3.ProtocolConfiguration
	flow     *extprocv3.ProcessingRequest_FlowControlInit
}

// envoyFactsOf reads a message's facts. The attributes are in
// ProcessingRequest.attributes (current), or in the deprecated
// HttpHeaders.attributes (older versions).
func envoyFactsOf(req *extprocv3.ProcessingRequest) envoyFacts {
	f := envoyFacts{metadata: req.GetMetadataContext(), protocol: req.GetProtocolConfig(), flow: req.GetFlowControlInit()}
	if a := req.GetAttributes()[attributesKey]; a != nil {
		f.attrs = a
		return f
	}
	var hh *extprocv3.HttpHeaders
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		hh = r.RequestHeaders
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		hh = r.ResponseHeaders
	}
	//lint:ignore SA1019 older Envoys sent attributes here; still read for them.
	f.attrs = hh.GetAttributes()[attributesKey]
	return f
}

// target is what the request headers say of the request and its caller.
type target struct {
	method, path, authority, requestID string
	// proxyless: grpc-go's filter sent the call (rpcState.proxyless);
	// call: the request is a gRPC call.
	proxyless, call bool
}

// targetHeaders are the request headers requestTarget keeps, in one copy.
var targetHeaders = [...]string{":method", ":path", ":authority", "x-request-id"}

// requestTarget reads the request's method, path, authority and
// x-request-id, and learns what kind of client sent it. Envoy sends
// pseudo-headers; grpc-go sends none, and the request_attributes
// request.method, request.path and request.host carry them instead (a gRPC
// call is always a POST).
func requestTarget(hs *corev3.HeaderMap, attrs *structpb.Struct, reqBodyMode procmodev3.ProcessingMode_BodySendMode) target {
	var v [len(targetHeaders)]string
	found := copyHeaders(hs, targetHeaders[:], v[:])
	t := target{method: v[0], path: v[1], authority: v[2], requestID: v[3]}
	t.proxyless = found&0b11 == 0 // neither :method nor :path
	if t.proxyless {
		t.method, t.path, t.authority = attrString(attrs, "request.method"), attrString(attrs, "request.path"), attrString(attrs, "request.host")
		if t.method == "" {
			t.method = "POST"
		}
	}
	ct, _ := headerBytes(hs, "content-type")
	t.call = t.proxyless || isGRPCContentType(string(ct)) || reqBodyMode == procmodev3.ProcessingMode_GRPC
	return t
}

func isGRPCContentType(ct string) bool {
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
}

// scopeOf reads the owner of the request's key space where pol says
// (attempt.Admit judges it); "" when the request carries none.
func (s *Server) scopeOf(ctx context.Context, a *attempt.Attempt, pol *policy.Policy, authority string, hs *corev3.HeaderMap, f *envoyFacts) string {
	switch sc := pol.Scope; sc.Source {
	case policy.ScopeAuthority:
		return authority
	case policy.ScopeHeader:
		scope, _ := findHeader(hs, sc.Header)
		return scope
	case policy.ScopeMetadata:
		return metadataString(f.metadata, sc.Namespace, sc.Path)
	case policy.ScopePrincipal:
		name := PrincipalAttribute(sc.PeerIdentity)
		if !hasAttr(f.attrs, name) {
			s.missingAttribute(ctx, a, pol.Name, name, "every request of the policy is refused 401 principal-missing")
		}
		return attrString(f.attrs, name)
	}
	return "" // ScopeNone
}

// metadataString reads a string or number at path in one namespace of the
// forwarded dynamic metadata.
func metadataString(md *corev3.Metadata, ns string, path []string) string {
	s := md.GetFilterMetadata()[ns]
	for i, name := range path {
		v := s.GetFields()[name]
		if i == len(path)-1 {
			return valueString(v)
		}
		s = v.GetStructValue()
	}
	return ""
}

// MissingAttributeMessage is the log message of a missing attribute, logged
// once per policy and attribute at warn.
const MissingAttributeMessage = "Envoy did not send an attribute the policy needs (logged once per policy)"

// missingOnce remembers which (policy, attribute) pairs were logged, so a
// filter configured without an attribute is one warning per policy, not
// one per request; the counter counts every request.
type missingOnce struct{ seen sync.Map }

// missingAttribute counts a request whose policy needed an attribute that
// never arrived, and logs it the first time for the policy.
func (s *Server) missingAttribute(ctx context.Context, a *attempt.Attempt, policyName, name, why string) {
	s.env.MissingAttribute(policyName, name)
	if _, loaded := s.missing.seen.LoadOrStore(policyName+"\x00"+name, true); loaded {
		return
	}
	a.LogAt(ctx, slog.LevelWarn, MissingAttributeMessage,
		slog.String("policy", policyName), slog.String("attribute", name),
		slog.String("fix", "add "+name+" to the ext_proc filter's "+envoyorigin.MissingAttributes[name]),
		slog.String("consequence", why))
}

// routeNameMissing reports, for each policy of set that matches on route
// names, a request that came without xds.route_name: such a policy can
// never match.
func (s *Server) routeNameMissing(ctx context.Context, a *attempt.Attempt, set *policy.Set) {
	for _, pol := range set.Policies {
		if len(pol.Match.RouteNames) > 0 {
			s.missingAttribute(ctx, a, pol.Name, envoyorigin.AttrRouteName, "the policy matches on route names and protects nothing")
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
// instead of released. Both absences are reported for a request that holds
// a record. retried says whether an earlier upstream attempt may have been
// sent (Signals.MayHaveRetried). grpc-go's filter (gRFC A93, proxyless)
// makes no local replies of Envoy's kind and no router retries: there is
// nothing for the attributes to tell apart, and its client makes one
// attempt per call.
func (s *Server) responseOrigin(ctx context.Context, a *attempt.Attempt, attrs *structpb.Struct, proxyless bool) (origin idem.Origin, retried bool) {
	fields := attrs.GetFields()
	dv, hasDetails := fields[envoyorigin.AttrCodeDetails]
	// Envoy sends a CEL uint as a number (matching_utils.cc
	// evaluateAttributes); any other kind is not a count.
	_, hasAttempts := fields[envoyorigin.AttrAttemptCount].GetKind().(*structpb.Value_NumberValue)
	if a.Held() && !proxyless {
		if !hasDetails {
			s.missingAttribute(ctx, a, a.Policy.Name, envoyorigin.AttrCodeDetails,
				"Envoy's own error replies cannot be told from the upstream's and are stored as its answer")
		}
		if !hasAttempts {
			s.missingAttribute(ctx, a, a.Policy.Name, envoyorigin.AttrAttemptCount,
				"a response after a router retry cannot be told from a first attempt's; what would be released (a connection failure, an overflow, the upstream's 408/425/429) is kept as outcome unknown instead")
		}
	}
	sig := envoyorigin.Signals{
		Details: valueString(dv), HasDetails: hasDetails,
		Flags:    attrUint(attrs, envoyorigin.AttrFlags),
		Attempts: attrUint(attrs, envoyorigin.AttrAttemptCount), HasAttempts: hasAttempts,
	}
	return envoyorigin.Classify(sig), sig.MayHaveRetried() && !proxyless
}

// hasAttr reports whether Envoy sent the attribute at all (an unnamed
// route's xds.route_name is present and empty, context.cc XDSLookupValues).
func hasAttr(a *structpb.Struct, name string) bool {
	_, ok := a.GetFields()[name]
	return ok
}

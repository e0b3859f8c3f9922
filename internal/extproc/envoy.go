package extproc

import (
	"cmp"
	"log/slog"
	"slices"
	"strings"

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

	// At the request headers, what the attempt reads through them
	// (attempt.Facts): the headers, the request's target, and the stream
	// that reports an attribute a policy needs and did not get.
	headers *corev3.HeaderMap
	target  target
	p       *processor
}

// Target, Header, Headers, HeadersPrefixed, Metadata and Peer are what
// the attempt reads of the request (attempt.Facts).
func (f *envoyFacts) Target() policy.Request {
	return policy.Request{Method: f.target.method, Authority: f.target.authority, Path: f.target.path,
		RouteName: attrString(f.attrs, envoyorigin.AttrRouteName)}
}

// Header returns the first value of name in the request headers and how
// many field lines carry it, copying only that value out of the message.
// Current Envoy sends raw_value bytes and leaves value empty; older
// versions and other clients send value. Envoy sends each line of a
// repeated header as its own HeaderValue: its header map joins repeated
// lines only for the inline headers it knows
// (source/common/http/header_map_impl.cc HeaderMapImpl::insertByKey, which
// appends to an existing entry only after a static lookup hit), and
// MutationUtils::headersToProto (ext_proc/mutation_utils.cc) adds one
// HeaderValue per entry it iterates.
func (f *envoyFacts) Header(name string) (v string, n int) {
	for _, h := range f.headers.GetHeaders() {
		if h.GetKey() == name {
			if n == 0 {
				v = string(headerValue(h))
			}
			n++
		}
	}
	return v, n
}

// Headers keeps the order and repeats of the names (few: a policy's
// fingerprint headers).
func (f *envoyFacts) Headers(names []string) []idem.Header {
	return keptHeaders(f.headers, func(n string) bool { return slices.Contains(names, n) }, nil)
}

func (f *envoyFacts) HeadersPrefixed(prefix string) []idem.Header {
	return keptHeaders(f.headers, func(n string) bool { return strings.HasPrefix(n, prefix) }, nil)
}

func (f *envoyFacts) Metadata(ns string, path []string) string {
	s := f.metadata.GetFilterMetadata()[ns]
	for i, name := range path {
		v := s.GetFields()[name]
		if i == len(path)-1 {
			return valueString(v)
		}
		s = v.GetStructValue()
	}
	return ""
}

// Peer reads the peer's identity from its attribute.
func (f *envoyFacts) Peer(policyName string, id policy.PeerIdentity) string {
	name := envoyorigin.PeerAttr(id)
	if !hasAttr(f.attrs, name) {
		f.p.srv.missingAttribute(&f.p.att, policyName, name, "every request of the policy is refused 401 principal-missing")
	}
	return attrString(f.attrs, name)
}

// target is what the request headers say of the request and its caller.
type target struct {
	method, path, authority, requestID string
	// sentTo is HomeHeader's value: the region another region's server
	// sent the request to (attempt.Routing).
	sentTo string
	// length is the body's declared length (content-length), 0 when none.
	length int
	// proxyless: grpc-go's filter sent the call (rpcState.proxyless);
	// call: the request is a gRPC call.
	proxyless, call bool
}

// targetHeaders are the request headers requestTarget keeps, in one copy.
var targetHeaders = [...]string{":method", ":path", ":authority", "x-request-id", HomeHeader, "content-length"}

// requestTarget reads the request's method, path, authority, x-request-id,
// HomeHeader and content-length, and learns what kind of client sent it. Envoy sends
// pseudo-headers; grpc-go sends none, and the request_attributes
// request.method, request.path and request.host carry them instead (a gRPC
// call is always a POST).
func requestTarget(hs *corev3.HeaderMap, attrs *structpb.Struct, reqBodyMode procmodev3.ProcessingMode_BodySendMode) target {
	var v [len(targetHeaders)]string
	found := copyHeaders(hs, targetHeaders[:], v[:])
	t := target{method: v[0], path: v[1], authority: v[2], requestID: v[3], sentTo: v[4], length: declaredLength(v[5])}
	t.proxyless = found&0b11 == 0 // neither :method nor :path
	if t.proxyless {
		t.method, t.path, t.authority = cmp.Or(attrString(attrs, "request.method"), "POST"), attrString(attrs, "request.path"), attrString(attrs, "request.host")
	}
	ct, _ := headerBytes(hs, "content-type")
	t.call = t.proxyless || isGRPCContentType(string(ct)) || reqBodyMode == procmodev3.ProcessingMode_GRPC
	return t
}

func isGRPCContentType(ct string) bool {
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
}

// MissingAttributeMessage is the log message of a missing attribute, logged
// once per policy and attribute at warn.
const MissingAttributeMessage = "Envoy did not send an attribute the policy needs (logged once per policy)"

// missingAttribute counts a request whose policy needed an attribute that
// never arrived, and logs it the first time for the policy.
func (s *Server) missingAttribute(a *attempt.Attempt, policyName, name, why string) {
	s.cfg.EnvoyObserver.MissingAttribute(policyName, name)
	if _, loaded := s.missing.LoadOrStore(policyName+"\x00"+name, true); loaded {
		return
	}
	a.LogAt(slog.LevelWarn, MissingAttributeMessage,
		slog.String("policy", policyName), slog.String("attribute", name),
		slog.String("fix", "add "+name+" to the ext_proc filter's "+envoyorigin.MissingAttributes[name]),
		slog.String("consequence", why))
}

// hasAttr reports whether Envoy sent the attribute at all (an unnamed
// route's xds.route_name is present and empty, context.cc XDSLookupValues).
func hasAttr(a *structpb.Struct, name string) bool {
	_, ok := a.GetFields()[name]
	return ok
}

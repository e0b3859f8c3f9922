package envoysim

import (
	"context"
	"fmt"
	"strings"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Header is one header field; names are lower case, as Envoy keeps them.
type Header struct {
	Name  string
	Value string
}

// Get returns the first value of name.
func Get(hs []Header, name string) (string, bool) {
	for _, h := range hs {
		if h.Name == name {
			return h.Value, true
		}
	}
	return "", false
}

// Values returns every value of name, in order.
func Values(hs []Header, name string) []string {
	var out []string
	for _, h := range hs {
		if h.Name == name {
			out = append(out, h.Value)
		}
	}
	return out
}

// Request is a downstream request as Envoy's filter chain sees it.
type Request struct {
	Method    string
	Path      string
	Authority string
	// Scheme defaults to "http".
	Scheme string
	// Headers are the client's headers (lower-case names). The connection
	// manager's x-request-id and x-forwarded-proto are added unless present.
	Headers  []Header
	Body     []byte
	Trailers []Header

	// RouteName is the matched route's name, the xds.route_name attribute:
	// "" for a route without a name, which Envoy still sends (context.cc
	// XDSLookupValues RouteName: CreateString(route->routeName())).
	RouteName string
	// PeerCertificate is the certificate the downstream client presented
	// over TLS; nil for plain text or no client certificate, when Envoy
	// sends no connection.*_peer_certificate attribute.
	PeerCertificate *PeerCertificate
	// RemoteAddress is the downstream peer's "ip:port", the source.address
	// and source.port attributes (context.cc PeerWrapper).
	RemoteAddress string
	// DynamicMetadata is the stream's dynamic metadata by filter namespace
	// (what jwt_authn and others wrote); the filter forwards the namespaces
	// its metadata_options name.
	DynamicMetadata map[string]*structpb.Struct
	// PerRoute is the matched route's ExtProcPerRoute, if any.
	PerRoute *extprocfilterv3.ExtProcPerRoute

	// Retry is the matched route's retry policy; nil for none (router.go).
	Retry *RetryPolicy
	// RemoveHeaders is the matched route's request_headers_to_remove (its
	// own, its virtual host's and its route configuration's): the router
	// removes them before it reads the retry headers (router.go).
	RemoveHeaders []string
	// Attempt is the router's attempt number as the upstream receives the
	// request (1 for the first; x-envoy-attempt-count's value); set by the
	// router on the copy it sends upstream.
	Attempt int

	// ResetAfter makes the downstream client go away right after the given
	// phase completes, as a client timeout or a dropped connection would:
	// Envoy then resets the side stream (and the upstream request).
	ResetAfter Phase
}

// PeerCertificate is a downstream client certificate as Envoy's CEL
// attributes read it (context.cc SslExtractorsValues): the first URI SAN is
// connection.uri_san_peer_certificate, the first DNS SAN
// connection.dns_san_peer_certificate, the subject DN
// connection.subject_peer_certificate.
type PeerCertificate struct {
	URISANs []string
	DNSSANs []string
	Subject string
}

// Response is what a downstream client receives, or what the upstream
// returned to Envoy.
type Response struct {
	Status   int
	Headers  []Header
	Body     []byte
	Trailers []Header
	// Details is the response code details: "via_upstream" for an upstream
	// answer, else the reason of Envoy's local reply.
	Details string
	// Flags is Envoy's legacy response-flags bit vector (response.flags).
	Flags uint64
}

// Upstream is Envoy's router: it sends the request upstream and returns the
// response, or an *UpstreamFailure for which Envoy makes a local reply.
type Upstream func(ctx context.Context, req *Request) (*Response, error)

// Response flag bits, as Envoy's legacyResponseFlags() reports them in the
// response.flags attribute: bit n for CoreResponseFlag n
// (envoy/stream_info/stream_info.h; test/common/stream_info/
// stream_info_impl_test.cc LegacyResponseFlagTest).
const (
	FlagNoHealthyUpstream             uint64 = 0x2
	FlagUpstreamRequestTimeout        uint64 = 0x4
	FlagUpstreamRemoteReset           uint64 = 0x10
	FlagUpstreamConnectionFailure     uint64 = 0x20
	FlagUpstreamConnectionTermination uint64 = 0x40
	FlagUpstreamOverflow              uint64 = 0x80
	FlagNoRouteFound                  uint64 = 0x100
	FlagFaultInjected                 uint64 = 0x400
	FlagRateLimited                   uint64 = 0x800
	FlagUnauthorizedExternalService   uint64 = 0x1000
)

// UpstreamFailure is a local reply Envoy makes instead of the upstream's
// answer: a router failure, or (Filter set) the local reply of a decoder
// filter that runs after ext_proc and before the router, which the request
// never passes.
type UpstreamFailure struct {
	Status  int
	Details string
	Flags   uint64
	Body    string
	// Filter names the decoder filter that answered; "" for the router.
	Filter string
}

func (f *UpstreamFailure) Error() string {
	return fmt.Sprintf("upstream failure %d %s", f.Status, f.Details)
}

// resetBody is the router's local-reply body for a reset before the
// response started (router.cc Filter::onUpstreamReset, no retry).
func resetBody(reason, transport string) string {
	b := "upstream connect error or disconnect/reset before headers. reset reason: " + reason
	if transport != "" {
		b += ", transport failure reason: " + transport
	}
	return b
}

// The router failures a test can return from an Upstream, with the status,
// details, flags and body Envoy gives them. Details are built by router.cc
// Filter::onUpstreamReset: "upstream_reset_before_response_started{" +
// resetReasonToString(reason) + "|" + transport failure reason + "}", every
// space replaced by "_" (StringUtil::replaceAllEmptySpace); the reason
// strings are http/utility.cc Utility::resetReasonToString's, the flag
// streamResetReasonToResponseFlag's, the status 503 (502 only for
// ProtocolError). router_test.cc PoolFailureWithPriority expects
// "upstream_reset_before_response_started{remote_connection_failure|tls_version_mismatch}".
// The transport reason of a refused TCP connect is "delayed connect error: "
// + strerror (network/connection_impl.cc onWriteReady).
var (
	ConnectFailure = &UpstreamFailure{Status: 503,
		Details: "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
		Flags:   FlagUpstreamConnectionFailure, Body: resetBody("remote connection failure", "delayed connect error: Connection refused")}
	ConnectTimeout = &UpstreamFailure{Status: 503,
		Details: "upstream_reset_before_response_started{connection_timeout|connect_timeout}", // router_test.cc PoolFailureDueToConnectTimeout
		Flags:   FlagUpstreamConnectionFailure, Body: resetBody("connection timeout", "connect_timeout")}
	UpstreamOverflow = &UpstreamFailure{Status: 503, Details: "upstream_reset_before_response_started{overflow}",
		Flags: FlagUpstreamOverflow, Body: resetBody("overflow", "")}
	UpstreamTimeout = &UpstreamFailure{Status: 504, Details: "response_timeout", Flags: FlagUpstreamRequestTimeout,
		Body: "upstream request timeout"} // router.cc onUpstreamTimeoutAbort
	UpstreamReset = &UpstreamFailure{Status: 503, Details: "upstream_reset_before_response_started{remote_reset}",
		Flags: FlagUpstreamRemoteReset, Body: resetBody("remote reset", "")}
	ConnectionTermination = &UpstreamFailure{Status: 503, Details: "upstream_reset_before_response_started{connection_termination}",
		Flags: FlagUpstreamConnectionTermination, Body: resetBody("connection termination", "")}
	NoHealthyUpstream = &UpstreamFailure{Status: 503, Details: "no_healthy_upstream", Flags: FlagNoHealthyUpstream,
		Body: "no healthy upstream"} // router.cc sendNoHealthyUpstreamResponse
)

// Local replies of decoder filters placed after ext_proc (Envoy Gateway's
// default order, internal/xds/translator/httpfilters.go): the request
// never reaches the router. Details and flags as each filter sets them.
var (
	// RateLimited is the rate limit filter's over-limit reply
	// (filters/http/ratelimit/ratelimit.cc Filter::complete:
	// setResponseFlag(RateLimited), sendLocalReply(rateLimitedStatus()
	// (429), response_body (empty by default), …, "request_rate_limited")).
	RateLimited = &UpstreamFailure{Status: 429, Details: "request_rate_limited", Flags: FlagRateLimited, Filter: "ratelimit"}
	// LocalRateLimited is local_ratelimit's reply (local_ratelimit.cc
	// decodeHeaders: sendLocalReply(status() (429), "local_rate_limited", …,
	// "local_rate_limited"), test FilterTest.RequestRateLimited). The
	// releases read set the RateLimited flag after sendLocalReply, so the
	// response phase would not see it; envoysim sends it, which only
	// matters to a classifier without the details.
	LocalRateLimited = &UpstreamFailure{Status: 429, Details: "local_rate_limited", Flags: FlagRateLimited,
		Body: "local_rate_limited", Filter: "local_ratelimit"}
	// ExtAuthzDenied is ext_authz's denial (filters/common/ext_authz
	// ResponseCodeDetailsValues AuthzDenied; flag
	// UnauthorizedExternalService), with the default 403 and no body.
	ExtAuthzDenied = &UpstreamFailure{Status: 403, Details: "ext_authz_denied", Flags: FlagUnauthorizedExternalService,
		Filter: "ext_authz"}
)

// RBACDenied is the RBAC filter's 403 for a policy id (filters/common/rbac/
// utility.cc responseDetail: "rbac_access_denied_matched_policy[" + id with
// spaces as "_" + "]"; "none" when no ALLOW policy matched). The body
// "RBAC: access denied" is what Envoy's access logs show; it was not read
// in rbac_filter.cc.
func RBACDenied(policyID string) *UpstreamFailure {
	return &UpstreamFailure{Status: 403, Details: "rbac_access_denied_matched_policy[" + spaceless(policyID) + "]",
		Body: "RBAC: access denied", Filter: "rbac"}
}

// FaultAbort is the fault filter's abort with the given status
// (fault/fault_filter.cc abortWithStatus: setResponseFlag(FaultInjected),
// sendLocalReply(code, "fault filter abort", …, "fault_filter_abort")).
func FaultAbort(status int) *UpstreamFailure {
	return &UpstreamFailure{Status: status, Details: "fault_filter_abort", Flags: FlagFaultInjected,
		Body: "fault filter abort", Filter: "fault"}
}

// spaceless is StringUtil::replaceAllEmptySpace: every whitespace byte
// becomes "_" (test utility_test.cc ResponseDetail maps " \t\f\v\n\r").
func spaceless(s string) string {
	return strings.Map(func(r rune) rune {
		if strings.ContainsRune(" \t\f\v\n\r", r) {
			return '_'
		}
		return r
	}, s)
}

// Phase names a step of the exchange.
type Phase uint8

// The phases, in order.
const (
	PhaseNone Phase = iota
	PhaseRequestHeaders
	PhaseRequestBody
	PhaseRequestTrailers
	PhaseUpstream
	PhaseResponseHeaders
	PhaseResponseBody
	PhaseResponseTrailers
)

func (p Phase) String() string {
	return [...]string{"none", "request_headers", "request_body", "request_trailers", "upstream",
		"response_headers", "response_body", "response_trailers"}[p]
}

// Message records one message sent to the ext_proc server and its reply.
type Message struct {
	Phase       Phase
	EndOfStream bool
	BodyLen     int
	// Reply is "continue", "immediate_response", "mode_override" (a
	// continue with an override that Envoy applied), "mode_override_ignored",
	// or the failure that replaced it.
	Reply string
}

// Result is the outcome of one exchange.
type Result struct {
	// Response is what the downstream client receives; nil when the client
	// went away (Request.ResetAfter).
	Response *Response
	Messages []Message
	// StreamOpened reports whether a side stream was opened at all.
	StreamOpened bool
	// ClosedEarlyAfter is the phase after whose reply the stream was closed
	// because no later phase needed the server (Options.CloseStreamEarly);
	// PhaseNone when it was not.
	ClosedEarlyAfter Phase
	// UpstreamCalled reports whether the router sent the request upstream.
	UpstreamCalled bool
	// UpstreamRequest is the request as the upstream received it.
	UpstreamRequest *Request
	// UpstreamAttempts is the router's attempt count, the
	// upstream.request_attempt_count attribute: 0 when the router made no
	// attempt.
	UpstreamAttempts int
	// ProcessingError is the ext_proc failure Envoy saw (spurious reply,
	// gRPC error, message timeout, bad mutation), or nil.
	ProcessingError error
}

// Phases returns the phases that were sent, in order.
func (r *Result) Phases() []Phase {
	out := make([]Phase, 0, len(r.Messages))
	for _, m := range r.Messages {
		out = append(out, m.Phase)
	}
	return out
}

// String summarises the exchange for test failure messages.
func (r *Result) String() string {
	var b strings.Builder
	for i, m := range r.Messages {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s(eos=%v)->%s", m.Phase, m.EndOfStream, m.Reply)
	}
	if r.Response != nil {
		fmt.Fprintf(&b, " => %d", r.Response.Status)
	}
	if r.ProcessingError != nil {
		fmt.Fprintf(&b, " error=%v", r.ProcessingError)
	}
	return b.String()
}

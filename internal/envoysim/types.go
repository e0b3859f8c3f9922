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

	// RouteName is the xds.route_name attribute.
	RouteName string
	// Principal is the source.principal attribute (the peer's mTLS identity).
	Principal string
	// DynamicMetadata is the stream's dynamic metadata by filter namespace
	// (what jwt_authn and others wrote); the filter forwards the namespaces
	// its metadata_options name.
	DynamicMetadata map[string]*structpb.Struct
	// PerRoute is the matched route's ExtProcPerRoute, if any.
	PerRoute *extprocfilterv3.ExtProcPerRoute

	// ResetAfter makes the downstream client go away right after the given
	// phase completes, as a client timeout or a dropped connection would:
	// Envoy then resets the side stream (and the upstream request).
	ResetAfter Phase
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
// response.flags attribute (envoy/stream_info/stream_info.h CoreResponseFlag
// order).
const (
	FlagNoHealthyUpstream         uint64 = 0x2
	FlagUpstreamRequestTimeout    uint64 = 0x4
	FlagUpstreamRemoteReset       uint64 = 0x10
	FlagUpstreamConnectionFailure uint64 = 0x20
	FlagUpstreamConnTermination   uint64 = 0x40
	FlagUpstreamOverflow          uint64 = 0x80
	FlagNoRouteFound              uint64 = 0x100
)

// UpstreamFailure is a failure Envoy's router answers with a local reply.
type UpstreamFailure struct {
	Status  int
	Details string
	Flags   uint64
	Body    string
}

func (f *UpstreamFailure) Error() string {
	return fmt.Sprintf("upstream failure %d %s", f.Status, f.Details)
}

// The router failures a test can return from an Upstream, with the status,
// details and flags Envoy gives them (router.cc).
var (
	ConnectFailure = &UpstreamFailure{503, "upstream_reset_before_response_started{connection_failure}",
		FlagUpstreamConnectionFailure, "upstream connect error or disconnect/reset before headers. reset reason: connection failure"}
	UpstreamTimeout = &UpstreamFailure{504, "response_timeout", FlagUpstreamRequestTimeout, "upstream request timeout"}
	UpstreamReset   = &UpstreamFailure{503, "upstream_reset_before_response_started{remote_reset}",
		FlagUpstreamRemoteReset, "upstream connect error or disconnect/reset before headers. reset reason: remote reset"}
	NoHealthyUpstream = &UpstreamFailure{503, "no_healthy_upstream", FlagNoHealthyUpstream, "no healthy upstream"}
)

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
	// UpstreamCalled reports whether the router sent the request upstream.
	UpstreamCalled bool
	// UpstreamRequest is the request as the upstream received it.
	UpstreamRequest *Request
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

package envoysim

import (
	"crypto/rand"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

func (x *exchange) metadataContext() *corev3.Metadata {
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	for _, ns := range x.f.cfg.GetMetadataOptions().GetForwardingNamespaces().GetUntyped() {
		if s, ok := x.req.DynamicMetadata[ns]; ok {
			md.FilterMetadata[ns] = s
		}
	}
	return md
}

// addAttributes puts the configured attributes on the first message of
// each direction (Filter::addAttributes).
func (x *exchange) addAttributes(pr *extprocv3.ProcessingRequest, phase Phase) {
	var names []string
	var sent *bool
	if phase <= PhaseRequestTrailers {
		names, sent = x.f.cfg.GetRequestAttributes(), &x.reqAttrsSent
	} else {
		names, sent = x.f.cfg.GetResponseAttributes(), &x.respAttrsSent
	}
	if *sent || len(names) == 0 {
		return
	}
	*sent = true
	fields := map[string]*structpb.Value{}
	for _, n := range names {
		if v := x.attribute(n); v != nil {
			fields[n] = v
		}
	}
	pr.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: fields}}
}

// attribute evaluates one attribute name as Envoy's CEL context does
// (source/extensions/filters/common/expr/context.h names, context.cc
// values). Only names that context defines are answered; any other name
// (source.principal, a typo) evaluates to an error, which
// ExpressionManager::evaluateAttributes (ext_proc matching_utils.cc) skips:
// it is left out of the message, as is a defined name with no value.
// Strings travel as strings, int64 and uint64 as numbers, bools as bools.
func (x *exchange) attribute(name string) *structpb.Value {
	switch {
	case strings.HasPrefix(name, "request."):
		return x.requestAttribute(name)
	case strings.HasPrefix(name, "connection."):
		return x.connectionAttribute(name)
	}
	return x.otherAttribute(name)
}

// optString is s as a value, none when empty.
func optString(s string) *structpb.Value {
	if s == "" {
		return nil
	}
	return structpb.NewStringValue(s)
}

func (x *exchange) requestAttribute(name string) *structpb.Value {
	r := x.req
	str, opt := structpb.NewStringValue, optString
	switch name {
	// RequestLookupValues: header-backed values are absent without the header.
	case "request.method":
		return opt(r.Method)
	case "request.path":
		return opt(r.Path)
	case "request.url_path":
		p, _, _ := strings.Cut(r.Path, "?")
		return opt(p)
	case "request.query":
		_, q, _ := strings.Cut(r.Path, "?")
		q, _, _ = strings.Cut(q, "#")
		return str(q)
	case "request.host":
		return opt(r.Authority)
	case "request.scheme":
		return opt(get(x.reqHeaders, ":scheme"))
	case "request.id":
		return opt(get(x.reqHeaders, "x-request-id"))
	case "request.useragent":
		return opt(get(x.reqHeaders, "user-agent"))
	case "request.referer":
		return opt(get(x.reqHeaders, "referer"))
	}
	return nil
}

// otherAttribute answers the response, source and xds names.
func (x *exchange) otherAttribute(name string) *structpb.Value {
	r := x.req
	opt := optString
	switch name {
	// ResponseLookupValues: only in the response direction.
	case "response.code":
		if x.respStatus == 0 {
			return nil
		}
		return structpb.NewNumberValue(float64(x.respStatus))
	case "response.code_details":
		// Every response sets the details, "" included: the router's
		// via_upstream (router.cc onUpstreamHeaders) or what a local reply
		// passed (filter_manager.cc sendLocalReply:
		// setResponseCodeDetails(details)); CodeDetails is absent only
		// when nothing set them.
		if x.respStatus == 0 {
			return nil
		}
		return structpb.NewStringValue(x.respDetails)
	case "response.flags":
		if x.respStatus == 0 {
			return nil
		}
		return structpb.NewNumberValue(float64(x.respFlags))
	// UpstreamLookupValues: attemptCount().value_or(0), a uint, present in
	// both directions.
	case "upstream.request_attempt_count":
		return structpb.NewNumberValue(float64(x.attempts))
	// PeerWrapper: the downstream remote address.
	case "source.address":
		return opt(r.RemoteAddress)
	case "source.port":
		_, port, err := net.SplitHostPort(r.RemoteAddress)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil {
			return nil
		}
		return structpb.NewNumberValue(float64(n))
	// XDSLookupValues: route_name is the route's name, "" when unnamed.
	case "xds.route_name":
		return structpb.NewStringValue(r.RouteName)
	}
	return nil
}

func (x *exchange) connectionAttribute(name string) *structpb.Value {
	first := func(vs []string) *structpb.Value {
		if len(vs) == 0 {
			return nil // SslExtractorsValues: an empty SAN list has no value
		}
		return structpb.NewStringValue(vs[0])
	}
	cert := x.req.PeerCertificate
	switch name {
	// ConnectionLookupValues and SslExtractorsValues: without TLS (or a
	// client certificate) there is no SSL connection info and no value.
	case "connection.mtls":
		return structpb.NewBoolValue(cert != nil)
	case "connection.uri_san_peer_certificate":
		if cert == nil {
			return nil
		}
		return first(cert.URISANs)
	case "connection.dns_san_peer_certificate":
		if cert == nil {
			return nil
		}
		return first(cert.DNSSANs)
	case "connection.subject_peer_certificate":
		if cert == nil {
			return nil
		}
		return structpb.NewStringValue(cert.Subject)
	}
	return nil
}

// connectionManagerHeaders builds the request header map as the connection
// manager hands it to the filter (ConnectionManagerUtility::
// mutateRequestHeaders, http/conn_manager_utility.cc): pseudo-headers, the
// client's headers, then x-forwarded-proto and a fresh x-request-id unless
// the client sent them. At an edge (Options.Edge: use_remote_address with no
// trusted hops, an external client) the client's x-forwarded-proto is
// overwritten with the connection's scheme, and its x-request-id replaced
// unless preserve_external_request_id. A client that is not internal
// (Options.InternalClient) loses its retry headers: mutateRequestHeaders
// calls cleanInternalHeaders unless internal_request, edge or not.
func connectionManagerHeaders(r *Request, opts Options) []Header {
	scheme := r.Scheme
	if scheme == "" {
		scheme = "http"
	}
	hs := make([]Header, 0, len(r.Headers)+6)
	hs = append(hs, Header{":authority", r.Authority}, Header{":path", r.Path}, Header{":method", r.Method}, Header{":scheme", scheme})
	hs = append(hs, r.Headers...)
	if !opts.InternalClient {
		for _, name := range retryHeaders {
			hs = remove(hs, name)
		}
	}
	if opts.Edge {
		hs = remove(hs, "x-forwarded-proto")
		if !opts.PreserveExternalRequestID {
			hs = remove(hs, "x-request-id")
		}
	}
	if _, ok := Get(hs, "x-forwarded-proto"); !ok {
		hs = append(hs, Header{"x-forwarded-proto", scheme})
	}
	if _, ok := Get(hs, "x-request-id"); !ok {
		hs = append(hs, Header{"x-request-id", newRequestID()})
	}
	return hs
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func toHeaderMap(hs []Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(hs))}
	for _, h := range hs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: h.Name, RawValue: []byte(h.Value)})
	}
	return m
}

func get(hs []Header, name string) string {
	v, _ := Get(hs, name)
	return v
}

func withoutPseudo(hs []Header) []Header {
	out := make([]Header, 0, len(hs))
	for _, h := range hs {
		if len(h.Name) == 0 || h.Name[0] != ':' {
			out = append(out, h)
		}
	}
	return out
}

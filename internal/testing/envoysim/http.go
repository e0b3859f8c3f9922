package envoysim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// DefaultRouteTimeout is Envoy's default route timeout.
const DefaultRouteTimeout = 15 * time.Second

// maxDownstreamBody bounds what the Proxy reads from a client, so a test
// cannot exhaust memory; Envoy's own limit is the filter's buffer limit.
const maxDownstreamBody = 64 << 20

// Proxy is an HTTP front that runs every request through a Filter and an
// Upstream, as an Envoy listener with the ext_proc filter and a router
// would. Serve it with net/http (httptest.NewServer(proxy)).
type Proxy struct {
	Filter   *Filter
	Upstream Upstream
	// Route gives the matched route's name and ExtProcPerRoute, if any.
	Route func(r *http.Request) (name string, perRoute *extprocfilterv3.ExtProcPerRoute)
	// Decorate may set attributes Envoy would know (principal, dynamic
	// metadata) on the request before it enters the filter.
	Decorate func(r *http.Request, req *Request)
	// ResponseDelay holds every response back before writing it, as a slow
	// network on the way back would: a client whose timeout is shorter
	// gives up after the proxy (and the ext_proc server) saw the response.
	ResponseDelay time.Duration
	// Observe, when set, receives every exchange's result.
	Observe func(*Result)
}

// hopByHop headers describe the downstream connection; Envoy does not pass
// them on.
var hopByHop = []string{"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxDownstreamBody))
	if err != nil {
		http.Error(w, "downstream read: "+err.Error(), http.StatusBadRequest)
		return
	}
	req := &Request{
		Method:    r.Method,
		Path:      r.URL.RequestURI(),
		Authority: r.Host,
		Headers:   fromHTTPHeader(r.Header),
		Body:      body,
		// r.RemoteAddr is the peer's "ip:port", as Envoy's address string.
		RemoteAddress: r.RemoteAddr,
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		c := r.TLS.PeerCertificates[0]
		pc := &PeerCertificate{DNSSANs: c.DNSNames, Subject: c.Subject.String()}
		for _, u := range c.URIs {
			pc.URISANs = append(pc.URISANs, u.String())
		}
		req.PeerCertificate = pc
	}
	if p.Route != nil {
		req.RouteName, req.PerRoute = p.Route(r)
	}
	if p.Decorate != nil {
		p.Decorate(r, req)
	}
	res := p.Filter.Do(r.Context(), req, p.Upstream)
	if p.Observe != nil {
		p.Observe(res)
	}
	resp := res.Response
	if resp == nil {
		return // the client went away; Envoy resets the downstream stream
	}
	if p.ResponseDelay > 0 {
		select {
		case <-time.After(p.ResponseDelay):
		case <-r.Context().Done():
			return // lost on the way back, after the proxy processed it
		}
	}
	for _, h := range resp.Headers {
		if h.Name == "content-length" {
			continue // net/http sets it from the body
		}
		w.Header().Add(h.Name, h.Value)
	}
	w.Header().Set("server", "envoy")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func fromHTTPHeader(h http.Header) []Header {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names) // net/http keeps no order across names
	var out []Header
	for _, name := range names {
		lower := strings.ToLower(name)
		if slices.Contains(hopByHop, lower) {
			continue
		}
		for _, v := range h[name] {
			out = append(out, Header{Name: lower, Value: v})
		}
	}
	return out
}

// HTTPUpstream is a router sending requests to base with client, bounded
// by routeTimeout (DefaultRouteTimeout when zero). Transport failures map to
// the local replies Envoy makes for them.
func HTTPUpstream(client *http.Client, base *url.URL, routeTimeout time.Duration) Upstream {
	if routeTimeout <= 0 {
		routeTimeout = DefaultRouteTimeout
	}
	return func(ctx context.Context, req *Request) (*Response, error) {
		ctx, cancel := context.WithTimeout(ctx, routeTimeout)
		defer cancel()
		u := *base
		target, err := url.ParseRequestURI(req.Path)
		if err != nil {
			return nil, &UpstreamFailure{Status: 400, Details: "invalid_path", Body: "bad path"}
		}
		u.Path, u.RawQuery = target.Path, target.RawQuery
		hr, err := http.NewRequestWithContext(ctx, req.Method, u.String(), bytes.NewReader(req.Body))
		if err != nil {
			return nil, err
		}
		hr.Host = req.Authority
		for _, h := range req.Headers {
			hr.Header.Add(h.Name, h.Value)
		}
		resp, err := client.Do(hr)
		if err != nil {
			return nil, classify(ctx, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, classify(ctx, err)
		}
		out := &Response{Status: resp.StatusCode, Headers: fromHTTPHeader(resp.Header), Body: body}
		if len(resp.Trailer) > 0 {
			out.Trailers = fromHTTPHeader(resp.Trailer)
		}
		return out, nil
	}
}

func classify(ctx context.Context, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return UpstreamTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return ConnectFailure
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return ConnectFailure
	}
	return UpstreamReset
}

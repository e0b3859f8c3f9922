package envoysim

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestAttributeVocabulary: only names of Envoy's CEL context are answered,
// with Envoy's types; other names are left out (expr/context.h, context.cc;
// ext_proc matching_utils.cc evaluateAttributes).
func TestAttributeVocabulary(t *testing.T) {
	cfg := RecommendedConfig()
	cfg.RequestAttributes = []string{"source.principal", "request.principal", "no.such.thing",
		"connection.uri_san_peer_certificate", "connection.dns_san_peer_certificate", "connection.subject_peer_certificate",
		"connection.mtls", "source.address", "source.port", "xds.route_name", "request.method"}
	s := &scripted{script: continueAll(nil)}
	f := start(t, s, cfg, Options{})
	req := post("x")
	req.RouteName = "" // an unnamed route: xds.route_name is still sent, empty
	req.RemoteAddress = "10.1.2.3:41000"
	req.PeerCertificate = &PeerCertificate{URISANs: []string{"spiffe://example.org/ns/a/sa/b", "spiffe://second"},
		DNSSANs: []string{"b.a.svc"}, Subject: "CN=b,O=a"}
	f.Do(context.Background(), req, echoUpstream(200, "ok"))
	a := s.received()[0].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
	for _, absent := range []string{"source.principal", "request.principal", "no.such.thing"} {
		if _, ok := a[absent]; ok {
			t.Errorf("%s is not in Envoy's vocabulary and must be left out", absent)
		}
	}
	for name, want := range map[string]string{
		"connection.uri_san_peer_certificate": "spiffe://example.org/ns/a/sa/b", // the first URI SAN
		"connection.dns_san_peer_certificate": "b.a.svc",
		"connection.subject_peer_certificate": "CN=b,O=a",
		"source.address":                      "10.1.2.3:41000",
		"xds.route_name":                      "",
		"request.method":                      "POST",
	} {
		v, ok := a[name]
		if !ok || v.GetStringValue() != want {
			t.Errorf("%s = %v (present %v), want %q", name, v, ok, want)
		}
	}
	if a["source.port"].GetNumberValue() != 41000 || !a["connection.mtls"].GetBoolValue() {
		t.Errorf("source.port %v, connection.mtls %v", a["source.port"], a["connection.mtls"])
	}

	// Without a client certificate there is no SSL info: no value at all.
	s2 := &scripted{script: continueAll(nil)}
	start(t, s2, cfg, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
	a = s2.received()[0].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
	if _, ok := a["connection.uri_san_peer_certificate"]; ok {
		t.Error("a plain-text request has no peer certificate attribute")
	}
}

// TestRouterFailureDetails: the failures carry Envoy's real details, built
// as router.cc onUpstreamReset builds them, with the legacy flag bits.
func TestRouterFailureDetails(t *testing.T) {
	for _, tc := range []struct {
		f       *UpstreamFailure
		details string
		flags   uint64
	}{
		{ConnectFailure, "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}", 0x20},
		{ConnectTimeout, "upstream_reset_before_response_started{connection_timeout|connect_timeout}", 0x20},
		{UpstreamOverflow, "upstream_reset_before_response_started{overflow}", 0x80},
		{UpstreamReset, "upstream_reset_before_response_started{remote_reset}", 0x10},
		{ConnectionTermination, "upstream_reset_before_response_started{connection_termination}", 0x40},
		{UpstreamTimeout, "response_timeout", 0x4},
		{NoHealthyUpstream, "no_healthy_upstream", 0x2},
		{RateLimited, "request_rate_limited", 0x800},
		{LocalRateLimited, "local_rate_limited", 0x800},
		{RBACDenied("ns[a]-policy[deny all]"), "rbac_access_denied_matched_policy[ns[a]-policy[deny_all]]", 0},
		{ExtAuthzDenied, "ext_authz_denied", 0x1000},
		{FaultAbort(503), "fault_filter_abort", 0x400},
	} {
		s := &scripted{script: continueAll(nil)}
		res := start(t, s, nil, Options{}).Do(context.Background(), post("x"),
			func(context.Context, *Request) (*Response, error) { return nil, tc.f })
		var attrs map[string]*structpb.Value
		for _, m := range s.received() {
			if m.GetResponseHeaders() != nil {
				attrs = m.GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
			}
		}
		if d := attrs["response.code_details"].GetStringValue(); d != tc.details {
			t.Errorf("details %q, want %q", d, tc.details)
		}
		if fl := uint64(attrs["response.flags"].GetNumberValue()); fl != tc.flags {
			t.Errorf("%s: flags %#x, want %#x", tc.details, fl, tc.flags)
		}
		if res.UpstreamCalled != (tc.f.Filter == "") {
			t.Errorf("%s: UpstreamCalled %v, but the filter %q answered", tc.details, res.UpstreamCalled, tc.f.Filter)
		}
		_, hasCL := Get(res.Response.Headers, "content-length")
		if hasCL != (tc.f.Body != "") {
			t.Errorf("%s: content-length present %v with body %q (prepareLocalReply)", tc.details, hasCL, tc.f.Body)
		}
	}
}

func immediateWith(body string, hs ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: 201}, Body: []byte(body), Details: "idempotency replay",
		Headers: &extprocv3.HeaderMutation{SetHeaders: hs},
	}}}
}

func set(name, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: name, RawValue: []byte(value)}}
}

// TestImmediateResponseLocalReply: prepareLocalReply settles the content
// headers after the mutation; the details lose their spaces.
func TestImmediateResponseLocalReply(t *testing.T) {
	s := &scripted{script: continueAll(immediateWith("", set("content-type", "application/json"), set("content-length", "12"),
		set("idempotent-replayed", "true")))}
	res := start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
	r := res.Response
	for _, h := range []string{"content-type", "content-length"} {
		if _, ok := Get(r.Headers, h); ok {
			t.Errorf("an empty-body local reply keeps no %s (prepareLocalReply removes it)", h)
		}
	}
	if v, _ := Get(r.Headers, "idempotent-replayed"); v != "true" || r.Details != "idempotency_replay" {
		t.Fatalf("%+v", r)
	}

	s = &scripted{script: continueAll(immediateWith("{}", set("content-length", "99"), set("content-type", "application/json")))}
	r = start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok")).Response
	if cl, _ := Get(r.Headers, "content-length"); cl != "2" {
		t.Errorf("content-length %q: Envoy sets the body's length after the mutation", cl)
	}
	if ct, _ := Get(r.Headers, "content-type"); ct != "application/json" {
		t.Errorf("content-type %q: a content-type the mutation set is kept", ct)
	}
}

// TestMutationLimits: more than max_headers_count set headers rejects the
// whole mutation before any change (responseHeaderSizeCheck); a result over
// 60 KiB or 100 headers is an error after the change
// (headerMutationResultCheck); a control character other than HTAB is
// refused where it stands.
func TestMutationLimits(t *testing.T) {
	many := []*corev3.HeaderValueOption{set("idempotent-replayed", "true")}
	for i := range 100 {
		many = append(many, set(fmt.Sprintf("x-stored-%d", i), "v"))
	}
	s := &scripted{script: continueAll(immediateWith("ok", many...))}
	res := start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
	if _, ok := Get(res.Response.Headers, "idempotent-replayed"); ok || res.ProcessingError == nil {
		t.Fatalf("101 set headers must be rejected whole: %v %v", res.Response.Headers[:2], res.ProcessingError)
	}

	for name, value := range map[string]string{"NUL": "a\x00b", "SOH": "a\x01b", "DEL": "a\x7fb", "LF": "a\nb"} {
		s := &scripted{script: continueAll(immediateWith("ok", set("idempotent-replayed", "true"), set("x-bad", value), set("x-after", "1")))}
		res := start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
		_, before := Get(res.Response.Headers, "idempotent-replayed")
		_, after := Get(res.Response.Headers, "x-after")
		if res.ProcessingError == nil || !before || after {
			t.Errorf("%s: the walk stops at the bad value, keeping what came before: %v %v", name, res.Response.Headers, res.ProcessingError)
		}
	}
	s = &scripted{script: continueAll(immediateWith("ok", set("x-tab", "a\tb")))}
	if res := start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok")); res.ProcessingError != nil {
		t.Errorf("HTAB is allowed: %v", res.ProcessingError)
	}

	// A CONTINUE whose result exceeds 60 KiB fails the request with
	// status_on_error.
	big := set("x-big", strings.Repeat("v", 61*1024))
	reply := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{big}}}}}}
	s = &scripted{script: continueAll(reply)}
	res = start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
	if res.Response.Status != 500 || res.UpstreamCalled {
		t.Fatalf("an oversized header mutation must fail closed: %v", res)
	}
}

// TestAppendActionIgnored: Envoy's ext_proc reads only the BoolValue append
// (mutation_utils.cc); append_action is not looked at.
func TestAppendActionIgnored(t *testing.T) {
	h := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
		AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD}
	s := &scripted{script: continueAll(immediateWith("{}", h))}
	r := start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok")).Response
	if v := Values(r.Headers, "content-type"); len(v) != 1 || v[0] != "application/json" {
		t.Fatalf("content-type %v: append_action must not append", v)
	}
	h = &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-a", RawValue: []byte("2")},
		//lint:ignore SA1019 the field Envoy reads.
		Append: wrapperspb.Bool(true), AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	s = &scripted{script: continueAll(immediateWith("{}", set("x-a", "1"), h))}
	r = start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok")).Response
	if v := Values(r.Headers, "x-a"); len(v) != 2 {
		t.Fatalf("x-a %v: append true appends whatever append_action says", v)
	}
}

// TestCloseStreamEarly: with 1.37+'s optimisation the stream closes after
// the reply that leaves no later phase for the server.
func TestCloseStreamEarly(t *testing.T) {
	noBody := &extprocfilterv3.ProcessingMode{ResponseBodyMode: extprocfilterv3.ProcessingMode_NONE,
		ResponseTrailerMode: extprocfilterv3.ProcessingMode_SKIP}
	script := func(st extprocv3.ExternalProcessor_ProcessServer) error {
		for {
			m, err := st.Recv()
			if err != nil {
				return nil
			}
			r := cont(m)
			if m.GetResponseHeaders() != nil {
				r.ModeOverride = noBody
			}
			if err := st.Send(r); err != nil {
				return err
			}
		}
	}
	for _, early := range []bool{false, true} {
		s := &scripted{script: script}
		res := start(t, s, nil, Options{CloseStreamEarly: early}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
		want := PhaseNone
		if early {
			want = PhaseResponseHeaders
		}
		if res.ClosedEarlyAfter != want || string(res.Response.Body) != "ok" {
			t.Errorf("early %v: closed after %v, want %v: %v", early, res.ClosedEarlyAfter, want, res)
		}
	}
}

// TestEdgeConnectionManager: an edge connection manager overwrites the
// client's x-forwarded-proto and x-request-id; an inner one keeps them.
func TestEdgeConnectionManager(t *testing.T) {
	for _, tc := range []struct {
		opts           Options
		keepID, keepXF bool
	}{
		{Options{}, true, true},
		{Options{Edge: true}, false, false},
		{Options{Edge: true, PreserveExternalRequestID: true}, true, false},
	} {
		s := &scripted{script: continueAll(nil)}
		req := post("x")
		req.Scheme = "https"
		req.Headers = append(req.Headers, Header{"x-request-id", "client-id"}, Header{"x-forwarded-proto", "http"})
		start(t, s, nil, tc.opts).Do(context.Background(), req, echoUpstream(200, "ok"))
		var id, xf string
		for _, h := range s.received()[0].GetRequestHeaders().GetHeaders().GetHeaders() {
			switch h.GetKey() {
			case "x-request-id":
				id = string(h.GetRawValue())
			case "x-forwarded-proto":
				xf = string(h.GetRawValue())
			}
		}
		if (id == "client-id") != tc.keepID || (xf == "http") != tc.keepXF || id == "" || xf == "" {
			t.Errorf("%+v: x-request-id %q, x-forwarded-proto %q", tc.opts, id, xf)
		}
	}
}

// TestContentLengthRemoved: in STREAMED, BUFFERED_PARTIAL, and BUFFERED with
// the headers skipped, decodeHeaders removes content-length after sending
// the headers, whatever the reply's mode override says; BUFFERED keeps it.
func TestContentLengthRemoved(t *testing.T) {
	buffered := &extprocfilterv3.ProcessingMode{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED,
		ResponseBodyMode: extprocfilterv3.ProcessingMode_BUFFERED}
	for _, tc := range []struct {
		name    string
		body    extprocfilterv3.ProcessingMode_BodySendMode
		headers extprocfilterv3.ProcessingMode_HeaderSendMode
		kept    bool
	}{
		{"buffered", extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_SEND, true},
		{"streamed, overridden to buffered", extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_SEND, false},
		{"buffered partial", extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL, extprocfilterv3.ProcessingMode_SEND, false},
		{"buffered, headers skipped", extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_SKIP, false},
	} {
		cfg := RecommendedConfig()
		cfg.ProcessingMode.RequestBodyMode, cfg.ProcessingMode.RequestHeaderMode = tc.body, tc.headers
		s := &scripted{script: func(st extprocv3.ExternalProcessor_ProcessServer) error {
			for {
				m, err := st.Recv()
				if err != nil {
					return nil
				}
				r := cont(m)
				if m.GetRequestHeaders() != nil {
					r = headersReply(buffered)
				}
				if err := st.Send(r); err != nil {
					return err
				}
			}
		}}
		req := post("abc")
		req.Headers = append(req.Headers, Header{"content-length", "3"})
		res := start(t, s, cfg, Options{}).Do(context.Background(), req, echoUpstream(200, "ok"))
		_, kept := Get(res.UpstreamRequest.Headers, "content-length")
		if kept != tc.kept {
			t.Errorf("%s: content-length reached the upstream %v, want %v", tc.name, kept, tc.kept)
		}
		if tc.headers == extprocfilterv3.ProcessingMode_SEND {
			var sent bool
			for _, h := range s.received()[0].GetRequestHeaders().GetHeaders().GetHeaders() {
				sent = sent || h.GetKey() == "content-length"
			}
			if !sent {
				t.Errorf("%s: the headers message carries content-length", tc.name)
			}
		}
	}
}

// TestMutatedBodyLength: in BUFFERED a body reply whose body mutation
// differs in length from the content-length the held headers carry fails
// the stream, unless the same reply's header mutation removes it (applied
// first); in BUFFERED_PARTIAL the mutation is applied unchecked
// (processor_state.cc ProcessorState::handleBodyResponse).
func TestMutatedBodyLength(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mode   extprocfilterv3.ProcessingMode_BodySendMode
		remove bool
		fails  bool
	}{
		{"buffered", extprocfilterv3.ProcessingMode_BUFFERED, false, true},
		{"buffered, content-length removed", extprocfilterv3.ProcessingMode_BUFFERED, true, false},
		{"buffered partial", extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL, false, false},
	} {
		cfg := RecommendedConfig()
		cfg.ProcessingMode.RequestBodyMode = tc.mode
		cfg.AllowModeOverride = false
		s := &scripted{script: func(st extprocv3.ExternalProcessor_ProcessServer) error {
			for {
				m, err := st.Recv()
				if err != nil {
					return nil
				}
				r := cont(m)
				if m.GetRequestBody() != nil {
					cr := &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
						Mutation: &extprocv3.BodyMutation_Body{Body: []byte("longer body")}}}
					if tc.remove {
						cr.HeaderMutation = &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}}
					}
					r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
						RequestBody: &extprocv3.BodyResponse{Response: cr}}}
				}
				if err := st.Send(r); err != nil {
					return err
				}
			}
		}}
		req := post("abc")
		req.Headers = append(req.Headers, Header{"content-length", "3"})
		res := start(t, s, cfg, Options{}).Do(context.Background(), req, echoUpstream(200, "ok"))
		if failed := res.ProcessingError != nil; failed != tc.fails {
			t.Errorf("%s: processing error %v, want a failure %v", tc.name, res.ProcessingError, tc.fails)
		}
		if tc.fails && (res.Response.Status != 500 || res.Response.Details != "mismatch_between_content_length_and_the_length_of_the_mutated_body") {
			t.Errorf("%s: local reply %d %q", tc.name, res.Response.Status, res.Response.Details)
		}
		if !tc.fails && (res.UpstreamRequest == nil || string(res.UpstreamRequest.Body) != "longer body") {
			t.Errorf("%s: the upstream got %+v", tc.name, res.UpstreamRequest)
		}
	}
}

// TestBufferedPartialSendsPastTheLimit: the queue goes out once it holds
// more than the limit, so the one message may carry more than the limit.
func TestBufferedPartialSendsPastTheLimit(t *testing.T) {
	cfg := RecommendedConfig()
	cfg.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL
	cfg.AllowModeOverride = false
	for _, tc := range []struct {
		chunk, wantLen int
		wantEOS        bool
	}{
		{0, 4000, true},     // arrived whole: all of it
		{600, 1200, false},  // 600, 1200 > 1000: sent
		{1000, 2000, false}, // 1000 is not over the limit; 2000 is
	} {
		s := &scripted{script: continueAll(nil)}
		res := start(t, s, cfg, Options{BufferLimit: 1000, ChunkSize: tc.chunk}).Do(context.Background(), post(strings.Repeat("b", 4000)), echoUpstream(200, "ok"))
		m := res.Messages[1]
		if m.Phase != PhaseRequestBody || m.BodyLen != tc.wantLen || m.EndOfStream != tc.wantEOS || len(res.UpstreamRequest.Body) != 4000 {
			t.Errorf("chunk %d: %+v, upstream got %d bytes", tc.chunk, m, len(res.UpstreamRequest.Body))
		}
	}
}

// TestRouterRetries plays the ways router.cc ends a request its route
// retries (RetryStateImpl::shouldRetry's order: not covered → No, no
// retries left → NoRetryLimitExceeded, circuit breaker → NoOverflow,
// else doRetry). In every ending but the retry limit, the details and
// flags are those of a failure that could have been the first attempt's;
// only upstream.request_attempt_count tells.
func TestRouterRetries(t *testing.T) {
	// The first attempt reaches the upstream and is reset; later ones fail
	// to connect.
	resetThenRefused := func(calls *int) Upstream {
		return func(_ context.Context, r *Request) (*Response, error) {
			*calls++
			if r.Attempt != *calls {
				t.Errorf("attempt %d seen as Request.Attempt %d", *calls, r.Attempt)
			}
			if r.Attempt == 1 {
				return nil, UpstreamReset
			}
			return nil, ConnectFailure
		}
	}
	onlyResets := func(f *UpstreamFailure, _ *Response) bool { return f == UpstreamReset }
	for _, tc := range []struct {
		name     string
		policy   *RetryPolicy
		up       func(*int) Upstream
		calls    int
		attempts float64
		status   int
		details  string
		flags    uint64
		body     string
	}{
		{"retries exhausted", &RetryPolicy{NumRetries: 2}, resetThenRefused, 3, 3, 503,
			"upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
			FlagUpstreamConnectionFailure | FlagUpstreamRetryLimitExceeded,
			"upstream connect error or disconnect/reset before headers. retried and the latest reset reason: remote connection failure, transport failure reason: delayed connect error: Connection refused"},
		{"retry circuit breaker refuses", &RetryPolicy{NumRetries: 3, OverflowAfter: 2}, resetThenRefused, 2, 2, 503,
			"upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
			FlagUpstreamConnectionFailure | FlagUpstreamOverflow, ""},
		{"last reset not retriable", &RetryPolicy{NumRetries: 3, RetryOn: onlyResets}, resetThenRefused, 2, 2, 503,
			"upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
			FlagUpstreamConnectionFailure, ""},
		{"retry finds no host", &RetryPolicy{NumRetries: 3, NoHostAt: 2}, resetThenRefused, 1, 2, 503,
			"no_healthy_upstream", FlagNoHealthyUpstream, "no healthy upstream"},
		{"no retry policy", nil, resetThenRefused, 1, 1, 503,
			"upstream_reset_before_response_started{remote_reset}", FlagUpstreamRemoteReset, ""},
		{"no host before the first attempt", &RetryPolicy{NumRetries: 3},
			func(calls *int) Upstream {
				return func(context.Context, *Request) (*Response, error) { *calls++; return nil, NoHealthyUpstream }
			}, 1, 0, 503, "no_healthy_upstream", FlagNoHealthyUpstream, ""},
		// wouldRetryFromReset never retries an overflow (Policy5xxResetOverflow).
		{"an overflow is not retried", &RetryPolicy{NumRetries: 3},
			func(calls *int) Upstream {
				return func(context.Context, *Request) (*Response, error) { *calls++; return nil, UpstreamOverflow }
			}, 1, 1, 503, "upstream_reset_before_response_started{overflow}", FlagUpstreamOverflow, ""},
		{"a filter answers", &RetryPolicy{NumRetries: 3},
			func(calls *int) Upstream {
				return func(context.Context, *Request) (*Response, error) { *calls++; return nil, RateLimited }
			}, 1, 0, 429, "request_rate_limited", FlagRateLimited, ""},
		{"5xx retried, then the upstream's answer", &RetryPolicy{NumRetries: 1},
			func(calls *int) Upstream {
				return func(_ context.Context, r *Request) (*Response, error) {
					*calls++
					if r.Attempt == 1 {
						return &Response{Status: 503, Body: []byte("busy")}, nil
					}
					return &Response{Status: 201, Body: []byte("made")}, nil
				}
			}, 2, 2, 201, "via_upstream", 0, ""},
		{"5xx retries exhausted", &RetryPolicy{NumRetries: 1},
			func(calls *int) Upstream {
				return func(context.Context, *Request) (*Response, error) {
					*calls++
					return &Response{Status: 503, Body: []byte("busy")}, nil
				}
			}, 2, 2, 503, "via_upstream", FlagUpstreamRetryLimitExceeded, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := RecommendedConfig()
			s := &scripted{script: continueAll(nil)}
			req := post("x")
			req.Retry = tc.policy
			calls := 0
			res := start(t, s, cfg, Options{}).Do(context.Background(), req, tc.up(&calls))
			if calls != tc.calls {
				t.Errorf("the upstream was called %d times, want %d", calls, tc.calls)
			}
			var attrs map[string]*structpb.Value
			for _, m := range s.received() {
				if m.GetResponseHeaders() != nil {
					attrs = m.GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
				}
			}
			if a, ok := attrs["upstream.request_attempt_count"]; !ok || a.GetNumberValue() != tc.attempts {
				t.Errorf("upstream.request_attempt_count = %v (present %v), want %v", a, ok, tc.attempts)
			}
			if float64(res.UpstreamAttempts) != tc.attempts {
				t.Errorf("Result.UpstreamAttempts = %d, want %v", res.UpstreamAttempts, tc.attempts)
			}
			if d := attrs["response.code_details"].GetStringValue(); d != tc.details {
				t.Errorf("details %q, want %q", d, tc.details)
			}
			if fl := uint64(attrs["response.flags"].GetNumberValue()); fl != tc.flags {
				t.Errorf("flags %#x, want %#x", fl, tc.flags)
			}
			if res.Response.Status != tc.status {
				t.Errorf("status %d, want %d", res.Response.Status, tc.status)
			}
			if tc.body != "" && string(res.Response.Body) != tc.body {
				t.Errorf("body %q, want %q", res.Response.Body, tc.body)
			}
		})
	}
}

// TestEmptyDetailsArePresent: a local reply whose filter passed "" as its
// details still sets them (filter_manager.cc sendLocalReply), so
// response.code_details arrives, empty.
func TestEmptyDetailsArePresent(t *testing.T) {
	s := &scripted{script: continueAll(nil)}
	start(t, s, nil, Options{}).Do(context.Background(), post("x"),
		func(context.Context, *Request) (*Response, error) {
			return nil, &UpstreamFailure{Status: 403, Body: "denied by a Wasm filter", Filter: "wasm"}
		})
	for _, m := range s.received() {
		if m.GetResponseHeaders() == nil {
			continue
		}
		d, ok := m.GetAttributes()["envoy.filters.http.ext_proc"].GetFields()["response.code_details"]
		if !ok || d.GetStringValue() != "" {
			t.Errorf("response.code_details = %v (present %v), want present and empty", d, ok)
		}
		return
	}
	t.Fatal("no response headers message")
}

// TestRetryHeaders plays a client's own retry headers on a route with no
// retry policy: from a client the connection manager counts as internal
// they arm the router's retries (one by default, x-envoy-max-retries
// more), so a write the first attempt already delivered runs again behind
// the filter; the route's request_headers_to_remove takes them away before
// the router reads them; a client that is not internal (Envoy 1.33+'s
// default) loses them in the connection manager. The upstream never sees
// them.
func TestRetryHeaders(t *testing.T) {
	retryHeaders := []Header{{"x-envoy-retry-on", "5xx"}, {"x-envoy-max-retries", "2"}}
	for _, tc := range []struct {
		name     string
		headers  []Header
		internal bool
		remove   []string
		calls    int
	}{
		{"internal client, route keeps them", retryHeaders, true, nil, 3},
		{"internal client, default retry count", []Header{{"x-envoy-retry-on", "reset, 5xx"}}, true, nil, 2},
		{"internal client, gRPC conditions only", []Header{{"x-envoy-retry-grpc-on", "unavailable"}}, true, nil, 1},
		{"internal client, unknown condition", []Header{{"x-envoy-retry-on", "sometimes"}, {"x-envoy-max-retries", "5"}}, true, nil, 1},
		{"internal client, route removes them", retryHeaders, true, []string{"X-Envoy-Retry-On", "x-envoy-retry-grpc-on"}, 1},
		{"external client", retryHeaders, false, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := post("x")
			req.Headers = append(req.Headers, tc.headers...)
			req.RemoveHeaders = tc.remove
			calls := 0
			up := func(_ context.Context, r *Request) (*Response, error) {
				calls++
				for _, h := range r.Headers {
					if strings.HasPrefix(h.Name, "x-envoy-retry") || h.Name == "x-envoy-max-retries" {
						t.Errorf("the upstream received %s", h.Name)
					}
				}
				return &Response{Status: 503, Body: []byte("wrote, then failed")}, nil
			}
			s := &scripted{script: continueAll(nil)}
			res := start(t, s, RecommendedConfig(), Options{InternalClient: tc.internal}).Do(context.Background(), req, up)
			if calls != tc.calls || res.UpstreamAttempts != tc.calls {
				t.Errorf("the upstream was called %d times (attempts %d), want %d", calls, res.UpstreamAttempts, tc.calls)
			}
		})
	}
}

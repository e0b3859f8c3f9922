package envoysim

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// scripted is an ext_proc server whose behaviour each test writes, and
// which records every message it receives.
type scripted struct {
	extprocv3.UnimplementedExternalProcessorServer
	script func(s extprocv3.ExternalProcessor_ProcessServer) error

	mu   sync.Mutex
	got  []*extprocv3.ProcessingRequest
	ends []error // how each stream ended, as Recv reported it
}

func (s *scripted) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	return s.script(&recording{st, s})
}

type recording struct {
	extprocv3.ExternalProcessor_ProcessServer
	s *scripted
}

func (r *recording) Recv() (*extprocv3.ProcessingRequest, error) {
	m, err := r.ExternalProcessor_ProcessServer.Recv()
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if err != nil {
		r.s.ends = append(r.s.ends, err)
	} else {
		r.s.got = append(r.s.got, m)
	}
	return m, err
}

func (s *scripted) received() []*extprocv3.ProcessingRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), s.got...)
}

// continueAll answers every message CONTINUE, plus extra for the first.
func continueAll(first *extprocv3.ProcessingResponse) func(extprocv3.ExternalProcessor_ProcessServer) error {
	return func(st extprocv3.ExternalProcessor_ProcessServer) error {
		for i := 0; ; i++ {
			m, err := st.Recv()
			if err != nil {
				return nil
			}
			if i == 0 && first != nil {
				if err := st.Send(first); err != nil {
					return err
				}
				continue
			}
			if err := st.Send(cont(m)); err != nil {
				return err
			}
		}
	}
}

func cont(m *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch m.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_RequestBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	default:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
}

func start(t *testing.T, s *scripted, cfg *extprocfilterv3.ExternalProcessor, opts Options) *Filter {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, s)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	// The connection is made before the first request: grpc-go's NewClient
	// performs no I/O, the first RPC connects (clientconn.go, NewClient),
	// and on a loaded machine that dial alone can outlast the 200 ms
	// message timer the filter starts with the stream, which would leave
	// the server without the message the test then reads.
	cc.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for st := cc.GetState(); st != connectivity.Ready; st = cc.GetState() {
		if !cc.WaitForStateChange(ctx, st) {
			t.Fatalf("the test's ext_proc server at %s is not reachable: %v", lis.Addr(), st)
		}
	}
	if cfg == nil {
		cfg = RecommendedConfig()
	}
	return NewFilter(cc, cfg, opts)
}

func echoUpstream(status int, body string) Upstream {
	return func(_ context.Context, req *Request) (*Response, error) {
		return &Response{Status: status, Headers: []Header{{"content-type", "text/plain"}}, Body: []byte(body)}, nil
	}
}

func post(body string) *Request {
	return &Request{Method: "POST", Path: "/orders", Authority: "api.example", RouteName: "orders",
		Headers: []Header{{"idempotency-key", "k1"}}, Body: []byte(body)}
}

func TestBufferedConversationShape(t *testing.T) {
	s := &scripted{script: continueAll(nil)}
	f := start(t, s, nil, Options{})
	res := f.Do(context.Background(), post(`{"a":1}`), echoUpstream(201, "created"))
	if res.Response == nil || res.Response.Status != 201 || string(res.Response.Body) != "created" {
		t.Fatalf("response %+v (%v)", res.Response, res)
	}
	got := s.received()
	if len(got) != 4 {
		t.Fatalf("server received %d messages, want 4: %v", len(got), res)
	}
	rh, rb, sh, sb := got[0].GetRequestHeaders(), got[1].GetRequestBody(), got[2].GetResponseHeaders(), got[3].GetResponseBody()
	if rh == nil || rb == nil || sh == nil || sb == nil {
		t.Fatalf("message order %v", res)
	}
	if rh.GetEndOfStream() || !rb.GetEndOfStream() || sh.GetEndOfStream() || !sb.GetEndOfStream() {
		t.Fatalf("end_of_stream flags wrong: %v", res)
	}
	if string(rb.GetBody()) != `{"a":1}` || string(sb.GetBody()) != "created" {
		t.Fatal("bodies not sent whole")
	}
	// protocol_config on the first message only.
	pc := got[0].GetProtocolConfig()
	if pc.GetRequestBodyMode() != extprocfilterv3.ProcessingMode_BUFFERED || pc.GetResponseBodyMode() != extprocfilterv3.ProcessingMode_BUFFERED {
		t.Fatalf("protocol_config %v", pc)
	}
	for _, m := range got[1:] {
		if m.GetProtocolConfig() != nil {
			t.Fatal("protocol_config repeated")
		}
	}
	// metadata_context on every message.
	for i, m := range got {
		if m.GetMetadataContext() == nil {
			t.Fatalf("message %d lacks metadata_context", i)
		}
	}
	// Attributes on the first message of each direction only.
	reqAttrs := got[0].GetAttributes()["envoy.filters.http.ext_proc"]
	if reqAttrs.GetFields()["xds.route_name"].GetStringValue() != "orders" {
		t.Fatalf("request attributes %v", reqAttrs)
	}
	respAttrs := got[2].GetAttributes()["envoy.filters.http.ext_proc"]
	if respAttrs.GetFields()["response.code_details"].GetStringValue() != "via_upstream" {
		t.Fatalf("response attributes %v", respAttrs)
	}
	if _, ok := respAttrs.GetFields()["response.flags"].GetKind().(*structpb.Value_NumberValue); !ok {
		t.Fatalf("response.flags must be a number: %v", respAttrs)
	}
	if got[1].GetAttributes() != nil || got[3].GetAttributes() != nil {
		t.Fatal("attributes repeated within a direction")
	}
	// Headers in raw_value, lower case, with the pseudo-headers and what the
	// connection manager adds.
	names := map[string]bool{}
	for _, h := range rh.GetHeaders().GetHeaders() {
		if h.GetValue() != "" || (len(h.GetRawValue()) == 0 && h.GetKey() != "") {
			t.Fatalf("header %s not in raw_value alone", h.GetKey())
		}
		names[h.GetKey()] = true
	}
	for _, n := range []string{":authority", ":path", ":method", ":scheme", "x-request-id", "x-forwarded-proto", "idempotency-key"} {
		if !names[n] {
			t.Fatalf("request headers lack %s", n)
		}
	}
	if h := sh.GetHeaders().GetHeaders(); len(h) == 0 || h[0].GetKey() != ":status" || string(h[0].GetRawValue()) != "201" {
		t.Fatalf("response headers start %v", h)
	}
	// Closing is a half-close and a reset: the server sees the end.
	testwait.Until(t, "the server seeing the stream end", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.ends) == 1
	})
}

func TestNoBodyMeansNoBodyMessage(t *testing.T) {
	s := &scripted{script: continueAll(nil)}
	f := start(t, s, nil, Options{})
	res := f.Do(context.Background(), &Request{Method: "POST", Path: "/x", Authority: "a"}, echoUpstream(204, ""))
	got := res.Phases()
	if len(got) != 2 || got[0] != PhaseRequestHeaders || got[1] != PhaseResponseHeaders {
		t.Fatalf("phases %v", res)
	}
	if !res.Messages[0].EndOfStream || !res.Messages[1].EndOfStream {
		t.Fatalf("end_of_stream must be true on bodiless headers: %v", res)
	}
}

// TestOnReplyTimesEveryAnsweredMessage: the timing hook hears of each
// message that got its reply, in order, and changes nothing about the
// exchange.
func TestOnReplyTimesEveryAnsweredMessage(t *testing.T) {
	s := &scripted{script: func(st extprocv3.ExternalProcessor_ProcessServer) error {
		for {
			m, err := st.Recv()
			if err != nil {
				return nil
			}
			if m.GetRequestBody() != nil {
				time.Sleep(2 * time.Millisecond)
			}
			if err := st.Send(cont(m)); err != nil {
				return err
			}
		}
	}}
	var phases []Phase
	var waited []time.Duration
	f := start(t, s, nil, Options{OnReply: func(p Phase, d time.Duration) {
		phases = append(phases, p)
		waited = append(waited, d)
	}})
	res := f.Do(context.Background(), post("x"), echoUpstream(200, "ok"))
	if res.Response.Status != 200 || len(res.Messages) != 4 {
		t.Fatalf("the hook changed the exchange: %v", res)
	}
	want := []Phase{PhaseRequestHeaders, PhaseRequestBody, PhaseResponseHeaders, PhaseResponseBody}
	if len(phases) != len(want) {
		t.Fatalf("timed %v, want %v", phases, want)
	}
	for i := range want {
		if phases[i] != want[i] || waited[i] <= 0 {
			t.Fatalf("timed %v %v, want phases %v with positive waits", phases, waited, want)
		}
	}
	if waited[1] < 2*time.Millisecond {
		t.Fatalf("request body waited %v, less than the server's 2ms", waited[1])
	}
}

func TestSpuriousRepliesFailClosed(t *testing.T) {
	for name, reply := range map[string]*extprocv3.ProcessingResponse{
		"wrong type": {Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}},
		"empty":      {},
	} {
		t.Run(name, func(t *testing.T) {
			up := 0
			s := &scripted{script: continueAll(reply)}
			f := start(t, s, nil, Options{})
			res := f.Do(context.Background(), post("x"), func(ctx context.Context, r *Request) (*Response, error) {
				up++
				return echoUpstream(200, "")(ctx, r)
			})
			if res.Response.Status != 500 || !errors.Is(res.ProcessingError, ErrSpurious) || up != 0 {
				t.Fatalf("status %d, error %v, upstream calls %d", res.Response.Status, res.ProcessingError, up)
			}
		})
	}
}

var skipAll = &extprocfilterv3.ProcessingMode{
	RequestHeaderMode: extprocfilterv3.ProcessingMode_SKIP, ResponseHeaderMode: extprocfilterv3.ProcessingMode_SKIP,
	RequestTrailerMode: extprocfilterv3.ProcessingMode_SKIP, ResponseTrailerMode: extprocfilterv3.ProcessingMode_SKIP,
}

func headersReply(mode *extprocfilterv3.ProcessingMode) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response:     &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}},
		ModeOverride: mode,
	}
}

func TestModeOverride(t *testing.T) {
	t.Run("allowed override skips every later phase", func(t *testing.T) {
		s := &scripted{script: continueAll(headersReply(skipAll))}
		res := start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
		if len(res.Messages) != 1 || res.Messages[0].Reply != "mode_override" || res.Response.Status != 200 {
			t.Fatalf("%v", res)
		}
	})
	t.Run("disallowed override is ignored", func(t *testing.T) {
		cfg := RecommendedConfig()
		cfg.AllowModeOverride = false
		s := &scripted{script: continueAll(headersReply(skipAll))}
		res := start(t, s, cfg, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
		if len(res.Messages) != 4 || res.Messages[0].Reply != "mode_override_ignored" {
			t.Fatalf("%v", res)
		}
	})
	t.Run("header modes left DEFAULT keep the filter's, body modes are copied", func(t *testing.T) {
		s := &scripted{script: continueAll(headersReply(&extprocfilterv3.ProcessingMode{}))}
		res := start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
		got := res.Phases()
		if len(got) != 2 || got[1] != PhaseResponseHeaders {
			t.Fatalf("want request and response headers only: %v", res)
		}
	})
	t.Run("allowed_override_modes must match the merged mode", func(t *testing.T) {
		cfg := RecommendedConfig()
		cfg.AllowedOverrideModes = []*extprocfilterv3.ProcessingMode{{ResponseHeaderMode: extprocfilterv3.ProcessingMode_SEND}}
		s := &scripted{script: continueAll(headersReply(skipAll))}
		res := start(t, s, cfg, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
		if res.Messages[0].Reply != "mode_override_ignored" {
			t.Fatalf("%v", res)
		}
	})
}

func TestImmediateResponse(t *testing.T) {
	ir := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: 100},
		Body:   []byte("nope"),
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/problem+json")}},
			{Header: &corev3.HeaderValue{Key: "x-envoy-secret", RawValue: []byte("1")}},
			{Header: &corev3.HeaderValue{Key: "x-multi", RawValue: []byte("a")}},
			{Header: &corev3.HeaderValue{Key: "x-multi", RawValue: []byte("b")}, Append: wrapperspb.Bool(true)},
			{Header: &corev3.HeaderValue{Key: "x-only-value", Value: "v"}},
		}},
	}}}
	s := &scripted{script: continueAll(ir)}
	res := start(t, s, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
	r := res.Response
	if r.Status != 200 || string(r.Body) != "nope" || res.UpstreamCalled {
		t.Fatalf("%+v %v", r, res)
	}
	if ct, _ := Get(r.Headers, "content-type"); ct != "application/problem+json" {
		t.Fatalf("content-type %q", ct)
	}
	if _, ok := Get(r.Headers, "x-envoy-secret"); ok {
		t.Fatal("x-envoy-* must be dropped by the default mutation rules")
	}
	if v := Values(r.Headers, "x-multi"); len(v) != 2 {
		t.Fatalf("x-multi = %v, want both values", v)
	}
	if v, _ := Get(r.Headers, "x-only-value"); v != "" {
		t.Fatal("a value-only mutation yields an empty header in Envoy")
	}
}

func TestFailures(t *testing.T) {
	slow := func(st extprocv3.ExternalProcessor_ProcessServer) error {
		_, _ = st.Recv()
		time.Sleep(300 * time.Millisecond)
		return nil
	}
	grpcErr := func(st extprocv3.ExternalProcessor_ProcessServer) error {
		_, _ = st.Recv()
		return status.Error(codes.Internal, "boom")
	}
	closeOK := func(st extprocv3.ExternalProcessor_ProcessServer) error {
		_, _ = st.Recv()
		return nil
	}
	for _, tc := range []struct {
		name       string
		script     func(extprocv3.ExternalProcessor_ProcessServer) error
		allow      bool
		wantStatus int
		wantErr    bool
	}{
		{"message timeout is a 504", slow, false, 504, true},
		{"message timeout with failure_mode_allow continues", slow, true, 201, true},
		{"gRPC error is status_on_error", grpcErr, false, 500, true},
		{"gRPC error with failure_mode_allow continues", grpcErr, true, 201, true},
		{"server closing with OK continues unprocessed", closeOK, false, 201, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := RecommendedConfig()
			cfg.MessageTimeout = durationpb.New(100 * time.Millisecond)
			cfg.FailureModeAllow = tc.allow
			res := start(t, &scripted{script: tc.script}, cfg, Options{}).Do(context.Background(), post("x"), echoUpstream(201, "ok"))
			if res.Response.Status != tc.wantStatus || (res.ProcessingError != nil) != tc.wantErr {
				t.Fatalf("status %d error %v; want %d, error %v", res.Response.Status, res.ProcessingError, tc.wantStatus, tc.wantErr)
			}
		})
	}
}

func TestStreamedChunksAreSentWithoutWaiting(t *testing.T) {
	cfg := RecommendedConfig()
	cfg.ProcessingMode.RequestBodyMode = extprocfilterv3.ProcessingMode_STREAMED
	s := &scripted{script: func(st extprocv3.ExternalProcessor_ProcessServer) error {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		_ = st.Send(cont(m))
		// Read all three chunks before answering any of them: a client that
		// waited for each reply would deadlock here and time out.
		var chunks []*extprocv3.ProcessingRequest
		for range 3 {
			m, err := st.Recv()
			if err != nil {
				return nil
			}
			chunks = append(chunks, m)
		}
		for _, c := range chunks {
			_ = st.Send(cont(c))
		}
		return continueAll(nil)(st)
	}}
	res := start(t, s, cfg, Options{ChunkSize: 4}).Do(context.Background(), post("abcdefghij"), echoUpstream(200, "ok"))
	if res.Response.Status != 200 || string(res.UpstreamRequest.Body) != "abcdefghij" {
		t.Fatalf("%v", res)
	}
	var eos []bool
	for _, m := range res.Messages {
		if m.Phase == PhaseRequestBody {
			eos = append(eos, m.EndOfStream)
		}
	}
	if len(eos) != 3 || eos[0] || eos[1] || !eos[2] {
		t.Fatalf("chunk end_of_stream flags %v, want false false true", eos)
	}
}

func TestBothValueAndRawValueIsAnError(t *testing.T) {
	bad := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "x", Value: "a", RawValue: []byte("a")}},
		}}},
	}}}
	res := start(t, &scripted{script: continueAll(bad)}, nil, Options{}).Do(context.Background(), post("x"), echoUpstream(200, "ok"))
	if res.Response.Status != 500 || res.ProcessingError == nil || res.UpstreamCalled {
		t.Fatalf("%v", res)
	}
}

func TestLocalRepliesPassTheResponsePhases(t *testing.T) {
	for _, skip := range []bool{false, true} {
		s := &scripted{script: continueAll(nil)}
		res := start(t, s, nil, Options{SkipLocalReplies: skip}).Do(context.Background(), post("x"),
			func(context.Context, *Request) (*Response, error) { return nil, UpstreamTimeout })
		if res.Response.Status != 504 {
			t.Fatalf("status %d", res.Response.Status)
		}
		sawResponse := len(res.Messages) >= 3 && res.Messages[2].Phase == PhaseResponseHeaders
		if sawResponse == skip {
			t.Fatalf("SkipLocalReplies=%v: %v", skip, res)
		}
		if !skip {
			attrs := s.received()[2].GetAttributes()["envoy.filters.http.ext_proc"].GetFields()
			if attrs["response.code_details"].GetStringValue() != "response_timeout" ||
				attrs["response.flags"].GetNumberValue() != float64(FlagUpstreamRequestTimeout) {
				t.Fatalf("local reply attributes %v", attrs)
			}
		}
	}
}

func TestClientGoneResetsTheStream(t *testing.T) {
	s := &scripted{script: continueAll(nil)}
	req := post("x")
	req.ResetAfter = PhaseRequestBody
	res := start(t, s, nil, Options{}).Do(context.Background(), req, echoUpstream(200, "ok"))
	if res.Response != nil || res.UpstreamCalled {
		t.Fatalf("%v", res)
	}
	testwait.Until(t, "the server seeing the reset", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.ends) == 1
	})
}

func TestOverrideMessageTimeout(t *testing.T) {
	slowAfterOverride := func(st extprocv3.ExternalProcessor_ProcessServer) error {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		_ = st.Send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(time.Second)})
		time.Sleep(300 * time.Millisecond)
		_ = st.Send(cont(m))
		return continueAll(nil)(st)
	}
	for _, tc := range []struct {
		name       string
		max        time.Duration
		wantStatus int
	}{
		{"honoured within max_message_timeout", 2 * time.Second, 201},
		{"ignored without max_message_timeout", 0, 504},
		{"ignored above max_message_timeout", 500 * time.Millisecond, 504},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := RecommendedConfig()
			cfg.MessageTimeout = durationpb.New(100 * time.Millisecond)
			if tc.max > 0 {
				cfg.MaxMessageTimeout = durationpb.New(tc.max)
			}
			res := start(t, &scripted{script: slowAfterOverride}, cfg, Options{}).Do(context.Background(), post("x"), echoUpstream(201, "ok"))
			if res.Response.Status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %v", res.Response.Status, tc.wantStatus, res)
			}
		})
	}
}

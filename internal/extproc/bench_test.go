package extproc

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/asynclog"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// The benchmarks play the messages Envoy sends for one HTTP request (as
// envoysim builds them: the recommended filter configuration, BUFFERED
// bodies, the request and response attributes) through Server.Process on
// a fake stream, with the in-memory store and a JSON logger at info level
// writing nowhere: the server's own work per request, without gRPC or
// Redis. The load tool (tools/idem-loadtest) measures the whole.

const benchKeyDigits = 12

var benchRequestBody = []byte(`{"customer":"c-0123456789","currency":"EUR","lines":[{"sku":"sku-1","qty":2},{"sku":"sku-2","qty":1}],"note":"` +
	strings.Repeat("n", 120) + `"}`)

var benchResponseBody = []byte(`{"id":"0123456789","status":"created","items":"` + strings.Repeat("x", 1024-48) + `"}`)

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

// benchExchange is the messages of one request, with its key's bytes
// changed in place between iterations.
type benchExchange struct {
	msgs []*extprocv3.ProcessingRequest
	key  []byte // nil when the request carries no key
}

func newBenchExchange(method string, withKey, withBodies bool) *benchExchange {
	x := &benchExchange{}
	hs := []*corev3.HeaderValue{
		hv(":authority", "api.example.com"), hv(":path", "/v1/orders"), hv(":method", method), hv(":scheme", "http"),
		hv("content-type", "application/json"), hv("user-agent", "bench/1.0"),
	}
	if withKey {
		k := hv("idempotency-key", "k-"+strings.Repeat("0", benchKeyDigits))
		x.key = k.RawValue[2:]
		hs = append(hs, k)
	}
	hs = append(hs, hv("x-forwarded-proto", "http"), hv("x-request-id", "5f0c6f1e-8a53-4d3a-9d2f-2b1d3c4e5f60"))
	reqAttrs := map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{}}}
	respAttrs := map[string]*structpb.Struct{attributesKey: {Fields: map[string]*structpb.Value{
		"response.code_details": structpb.NewStringValue("via_upstream"),
		"response.flags":        structpb.NewNumberValue(0),
	}}}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	x.msgs = append(x.msgs, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: !withBodies}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode: procmodev3.ProcessingMode_BUFFERED, ResponseBodyMode: procmodev3.ProcessingMode_BUFFERED},
		Attributes: reqAttrs, MetadataContext: md,
	})
	if withBodies {
		x.msgs = append(x.msgs, &extprocv3.ProcessingRequest{
			Request:         &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: benchRequestBody, EndOfStream: true}},
			MetadataContext: md,
		})
	}
	x.msgs = append(x.msgs, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				hv(":status", "201"), hv("content-type", "application/json"), hv("location", "/v1/orders/0123456789"),
				hv("x-envoy-upstream-service-time", "0"),
			}}, EndOfStream: !withBodies}},
		Attributes: respAttrs, MetadataContext: md,
	})
	if withBodies {
		x.msgs = append(x.msgs, &extprocv3.ProcessingRequest{
			Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: benchResponseBody, EndOfStream: true}},
			MetadataContext: md,
		})
	}
	return x
}

// setKey writes n as the key's digits.
func (x *benchExchange) setKey(n int) {
	d := strconv.AppendInt(make([]byte, 0, benchKeyDigits), int64(n), 10)
	for i := range x.key {
		x.key[i] = '0'
	}
	copy(x.key[len(x.key)-len(d):], d)
}

// benchServer logs as the daemon does by default (JSON lines at info,
// formatted by asynclog's appender), into nothing.
func benchServer(st idem.Store) *Server {
	log := slog.New(asynclog.NewJSONLineHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return New(Config{Store: st, Logger: log})
}

// play runs one stream; Envoy sends no more messages after an immediate
// response, so the stream ends there.
func play(b *testing.B, srv *Server, s *fakeStream, msgs []*extprocv3.ProcessingRequest, wantReplies int) {
	s.msgs, s.next, s.replies = msgs, 0, s.replies[:0]
	if err := srv.Process(s); err != nil {
		b.Fatal(err)
	}
	if len(s.replies) != wantReplies {
		b.Fatalf("%d replies, want %d: %v", len(s.replies), wantReplies, s.replies)
	}
}

// BenchmarkProcess times whole requests through the server: a protected
// first write (4 messages, reserve and complete), a replay (2 messages,
// answered at the request body from the record) and an unprotected GET
// (answered at its headers, every later phase skipped).
func BenchmarkProcess(b *testing.B) {
	ctx := context.Background()
	b.Run("first_write", func(b *testing.B) {
		x := newBenchExchange("POST", true, true)
		s := &fakeStream{ctx: ctx}
		var st *memstore.Store
		var srv *Server
		b.ReportAllocs()
		for i := range b.N {
			if i%8192 == 0 {
				// A fresh store now and then keeps b.N records from
				// piling up in memory.
				b.StopTimer()
				if st != nil {
					_ = st.Close()
				}
				st = memstore.New(memstore.Options{})
				srv = benchServer(st)
				b.StartTimer()
			}
			x.setKey(i)
			play(b, srv, s, x.msgs, 4)
		}
		b.StopTimer()
		_ = st.Close()
	})
	b.Run("replay", func(b *testing.B) {
		st := memstore.New(memstore.Options{})
		defer st.Close()
		srv := benchServer(st)
		x := newBenchExchange("POST", true, true)
		s := &fakeStream{ctx: ctx}
		play(b, srv, s, x.msgs, 4)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			play(b, srv, s, x.msgs[:2], 2)
			if s.replies[1].GetImmediateResponse() == nil {
				b.Fatal("not a replay")
			}
		}
	})
	b.Run("unprotected", func(b *testing.B) {
		st := memstore.New(memstore.Options{})
		defer st.Close()
		srv := benchServer(st)
		x := newBenchExchange("GET", false, false)
		s := &fakeStream{ctx: ctx}
		b.ReportAllocs()
		for range b.N {
			play(b, srv, s, x.msgs[:1], 1)
		}
	})
}

// BenchmarkRequestHeaders times the request-header decision alone: policy
// match, key parsing and record id for a protected POST; policy match and
// the skip-everything override for a GET.
func BenchmarkRequestHeaders(b *testing.B) {
	ctx := context.Background()
	st := memstore.New(memstore.Options{})
	defer st.Close()
	srv := benchServer(st)
	set := srv.cfg.Policies()
	for _, tc := range []struct {
		name   string
		method string
		key    bool
	}{{"protected", "POST", true}, {"unprotected", "GET", false}} {
		b.Run(tc.name, func(b *testing.B) {
			msg := newBenchExchange(tc.method, tc.key, true).msgs[0]
			b.ReportAllocs()
			for range b.N {
				p := newProcessor(srv, set)
				m := messageOf(msg)
				if _, err := p.handle(ctx, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReplayResponse builds the immediate response of a replay from a
// stored response (status, three headers, 1 KiB body).
func BenchmarkReplayResponse(b *testing.B) {
	r := &idem.Response{Status: 201, Body: benchResponseBody, Headers: []idem.Header{
		{Name: "content-type", Value: "application/json"}, {Name: "location", Value: "/v1/orders/0123456789"},
		{Name: "x-request-id", Value: "5f0c6f1e-8a53-4d3a-9d2f-2b1d3c4e5f60"},
	}}
	keep := func(string) bool { return true }
	b.ReportAllocs()
	for range b.N {
		_, _ = replayResponse(r, keep)
	}
}

// BenchmarkProblemResponse builds a 409 request-in-progress answer.
func BenchmarkProblemResponse(b *testing.B) {
	p := problem.New(problem.InProgress, "an earlier request with this Idempotency-Key is still being processed; retry later")
	p.RetryAfter = time.Second
	b.ReportAllocs()
	for range b.N {
		_ = problemResponse(p)
	}
}

package main

// recorderSource is the package the instrumented copy's functions call:
// it records, while on, each entry and exit with its goroutine.
const recorderSource = `// Package archtrace records function entries for tools/archfigures.
package archtrace

import (
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

type Event struct {
	G     int64  ` + "`json:\"g\"`" + `
	File  string ` + "`json:\"file\"`" + `
	Func  string ` + "`json:\"func\"`" + `
	Enter bool   ` + "`json:\"enter\"`" + `
	Value bool   ` + "`json:\"value\"`" + `
}

var (
	on     atomic.Bool
	mu     sync.Mutex
	events []Event
)

func Start() { on.Store(true) }

func Stop() []Event {
	on.Store(false)
	mu.Lock()
	defer mu.Unlock()
	return events
}

// Goid is the calling goroutine's id, from its stack's first line.
func Goid() int64 {
	var buf [64]byte
	s := string(buf[:runtime.Stack(buf[:], false)])
	s = strings.TrimPrefix(s, "goroutine ")
	if i := strings.IndexByte(s, ' '); i > 0 {
		s = s[:i]
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func nop() {}

func Enter(file, fn string, value bool) func() {
	if !on.Load() {
		return nop
	}
	g := Goid()
	mu.Lock()
	events = append(events, Event{G: g, File: file, Func: fn, Enter: true, Value: value})
	mu.Unlock()
	return func() {
		mu.Lock()
		events = append(events, Event{G: g, File: file, Func: fn})
		mu.Unlock()
	}
}
`

// driverSource plays one protected POST and then its retry through
// extproc.Server.Process, with the messages Envoy sends for them in the
// recommended configuration (BUFFERED bodies, the response attributes
// that tell the upstream's answers from Envoy's), on a stream of its own
// that runs on the test's goroutine.
const driverSource = `package archtrace_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-extproc/idem-extproc/internal/archtrace"
	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
)

type stream struct {
	ctx     context.Context
	msgs    []*extprocv3.ProcessingRequest
	replies []*extprocv3.ProcessingResponse
}

func (s *stream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(s.msgs) == 0 {
		return nil, io.EOF
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}
func (s *stream) Send(r *extprocv3.ProcessingResponse) error {
	s.replies = append(s.replies, r)
	// Envoy sends nothing more after an immediate response.
	if r.GetImmediateResponse() != nil {
		s.msgs = nil
	}
	return nil
}
func (s *stream) Context() context.Context     { return s.ctx }
func (s *stream) SetHeader(metadata.MD) error  { return nil }
func (s *stream) SendHeader(metadata.MD) error { return nil }
func (s *stream) SetTrailer(metadata.MD)       {}
func (s *stream) SendMsg(any) error            { return nil }
func (s *stream) RecvMsg(any) error            { return nil }

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

func exchange() []*extprocv3.ProcessingRequest {
	const attrs = "envoy.filters.http.ext_proc"
	reqAttrs := map[string]*structpb.Struct{attrs: {Fields: map[string]*structpb.Value{}}}
	respAttrs := map[string]*structpb.Struct{attrs: {Fields: map[string]*structpb.Value{
		"response.code_details":         structpb.NewStringValue("via_upstream"),
		"response.flags":                structpb.NewNumberValue(0),
		"upstream.request_attempt_count": structpb.NewNumberValue(1),
	}}}
	return []*extprocv3.ProcessingRequest{
		{
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					hv(":authority", "api.example.com"), hv(":path", "/v1/orders"), hv(":method", "POST"),
					hv(":scheme", "http"), hv("content-type", "application/json"), hv("idempotency-key", "k-1"),
					hv("x-request-id", "5f0c6f1e-8a53-4d3a-9d2f-2b1d3c4e5f60"),
				}}}},
			ProtocolConfig: &extprocv3.ProtocolConfiguration{
				RequestBodyMode: procmodev3.ProcessingMode_BUFFERED, ResponseBodyMode: procmodev3.ProcessingMode_BUFFERED},
			Attributes: reqAttrs,
		},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: []byte(` + "`" + `{"sku":"a","qty":1}` + "`" + `), EndOfStream: true}}},
		{
			Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					hv(":status", "201"), hv("content-type", "application/json"), hv("location", "/v1/orders/1"),
				}}}},
			Attributes: respAttrs,
		},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte(` + "`" + `{"id":"1"}` + "`" + `), EndOfStream: true}}},
	}
}

func TestWalk(t *testing.T) {
	st := memstore.New(memstore.Options{})
	defer st.Close()
	srv := extproc.New(extproc.Config{Store: st, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	first := &stream{ctx: context.Background(), msgs: exchange()}
	retry := &stream{ctx: context.Background(), msgs: exchange()}
	g := archtrace.Goid()
	archtrace.Start()
	err1 := srv.Process(first)
	err2 := srv.Process(retry)
	events := archtrace.Stop()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if len(first.replies) != 4 {
		t.Fatalf("first write: %d replies, want 4", len(first.replies))
	}
	if n := len(retry.replies); n != 2 || retry.replies[1].GetImmediateResponse().GetStatus().GetCode() != 201 {
		t.Fatalf("retry: %d replies, want 2 ending in the replayed 201: %v", n, retry.replies)
	}
	b, err := json.Marshal(struct {
		G      int64              ` + "`json:\"g\"`" + `
		Events []archtrace.Event ` + "`json:\"events\"`" + `
	}{g, events})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv("ARCHTRACE_OUT"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}
`

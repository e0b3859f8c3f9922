package extproc

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// fakeStream is one ext_proc stream played from a fixed list of messages:
// Recv hands them out in order, then io.EOF; Send records the replies.
type fakeStream struct {
	grpc.ServerStream
	ctx     context.Context
	msgs    []*extprocv3.ProcessingRequest
	next    int
	replies []*extprocv3.ProcessingResponse
}

func (s *fakeStream) Context() context.Context { return s.ctx }

func (s *fakeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if s.next == len(s.msgs) {
		return nil, io.EOF
	}
	s.next++
	return s.msgs[s.next-1], nil
}

func (s *fakeStream) Send(r *extprocv3.ProcessingResponse) error {
	s.replies = append(s.replies, r)
	return nil
}

const (
	fuzzAuthority = "api.example"
	fuzzKey       = "dup-key"
	fuzzBody      = `{"a":1}`
)

func fuzzHeaders(key string, extra ...*corev3.HeaderValue) *corev3.HeaderMap {
	hs := []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte("POST")},
		{Key: ":path", RawValue: []byte("/orders")},
		{Key: ":authority", RawValue: []byte(fuzzAuthority)},
		{Key: ":scheme", RawValue: []byte("http")},
		{Key: "content-type", RawValue: []byte("application/json")},
		{Key: "x-request-id", RawValue: []byte("fuzz")},
	}
	if key != "" {
		hs = append(hs, &corev3.HeaderValue{Key: "idempotency-key", RawValue: []byte(key)})
	}
	return &corev3.HeaderMap{Headers: append(hs, extra...)}
}

// decodeMessages turns fuzz bytes into a message sequence: any order of
// phases, bodies with or without end_of_stream, garbage and huge headers,
// empty messages and processing modes.
func decodeMessages(b []byte) []*extprocv3.ProcessingRequest {
	var out []*extprocv3.ProcessingRequest
	take := func(n int) []byte {
		n = min(n, len(b))
		v := b[:n]
		b = b[n:]
		return v
	}
	byte1 := func() int {
		if len(b) == 0 {
			return 0
		}
		return int(take(1)[0])
	}
	for len(b) > 0 && len(out) < 32 {
		op := byte(byte1())
		eos := op&0x80 != 0
		switch op & 0x0f {
		case 0, 1: // the duplicate's own headers, key in several spellings
			key := []string{fuzzKey, `"` + fuzzKey + `"`, " " + fuzzKey + "\t", "other-key", ""}[int(op>>4&0x7)%5]
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
				RequestHeaders: &extprocv3.HttpHeaders{Headers: fuzzHeaders(key), EndOfStream: eos}}})
		case 2: // garbage headers
			n := byte1()
			var extra []*corev3.HeaderValue
			for i := 0; i < n && len(b) > 0; i++ {
				kv := take(byte1() % 24)
				k, v, _ := strings.Cut(string(kv), "=")
				h := &corev3.HeaderValue{Key: k}
				if i%2 == 0 {
					h.RawValue = []byte(v)
				} else {
					h.Value = v
				}
				extra = append(extra, h)
			}
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
				RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: extra}, EndOfStream: eos}}})
		case 3: // huge headers: many, or one very long value
			var extra []*corev3.HeaderValue
			if op&0x10 != 0 {
				for i := range 5000 {
					extra = append(extra, &corev3.HeaderValue{Key: "x-many", RawValue: []byte{byte(i)}})
				}
			} else {
				extra = append(extra, &corev3.HeaderValue{Key: "x-long", RawValue: []byte(strings.Repeat("v", 1<<20))})
			}
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
				RequestHeaders: &extprocv3.HttpHeaders{Headers: fuzzHeaders(fuzzKey, extra...), EndOfStream: eos}}})
		case 4: // the duplicate's body, whole or split
			body := fuzzBody
			if op&0x10 != 0 {
				body = body[:3]
			} else if op&0x20 != 0 {
				body = body[3:]
			}
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: eos}}})
		case 5: // garbage body
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: take(byte1()), EndOfStream: eos}}})
		case 6:
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
				RequestTrailers: &extprocv3.HttpTrailers{}}})
		case 7:
			status := []string{"200", "201", "408", "500", "abc", ""}[int(op>>4)%6]
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
				ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					{Key: ":status", RawValue: []byte(status)}}}, EndOfStream: eos}}})
		case 8:
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: take(byte1()), EndOfStream: eos}}})
		case 9:
			out = append(out, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
				ResponseTrailers: &extprocv3.HttpTrailers{}}})
		case 10:
			out = append(out, &extprocv3.ProcessingRequest{})
		case 11: // the duplicate's headers with the body modes in force
			modes := []procmodev3.ProcessingMode_BodySendMode{procmodev3.ProcessingMode_NONE, procmodev3.ProcessingMode_STREAMED,
				procmodev3.ProcessingMode_BUFFERED, procmodev3.ProcessingMode_BUFFERED_PARTIAL}
			out = append(out, &extprocv3.ProcessingRequest{
				ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[int(op>>4)%4], ResponseBodyMode: modes[int(op>>6)%4]},
				Request: &extprocv3.ProcessingRequest_RequestHeaders{
					RequestHeaders: &extprocv3.HttpHeaders{Headers: fuzzHeaders(fuzzKey), EndOfStream: eos}}})
		default: // nothing: sequences may end anywhere
		}
	}
	return out
}

// FuzzMessageSequence plays arbitrary ext_proc message sequences for the
// key of an operation that already completed. Whatever the order, gaps,
// garbage or size: the server never panics, never hangs, never lets the
// duplicate through (no CONTINUE where the whole request is known and its
// fingerprint is the completed operation's), and never changes the stored
// record.
func FuzzMessageSequence(f *testing.F) {
	f.Add([]byte{0x00, 0x84})                   // headers, body with end_of_stream: the plain duplicate
	f.Add([]byte{0x80})                         // headers with end_of_stream (a different, bodyless request)
	f.Add([]byte{0x0b, 0x94, 0x00, 0xa4})       // streamed body in two chunks
	f.Add([]byte{0x1b, 0x94, 0xa4})             // STREAMED mode announced
	f.Add([]byte{0x00, 0x04, 0x06})             // body without end_of_stream, then trailers
	f.Add([]byte{0x84, 0x00})                   // body before headers
	f.Add([]byte{0x0a, 0x00, 0x84})             // an empty message first
	f.Add([]byte{0x00, 0x00, 0x84})             // headers twice
	f.Add([]byte{0x07, 0x08, 0x01, 0x41, 0x09}) // response phases first
	f.Add([]byte{0x13, 0x84})                   // 5000 headers
	f.Add([]byte{0x03, 0x84})                   // a 1 MiB header value
	f.Add([]byte{0x02, 0x03, 0x05, 'a', '=', 'b', 0x84})
	f.Add([]byte{0x00, 0x05, 0xff})
	f.Add([]byte{})

	pol := policy.Default()
	id := idem.RecordIDFor(pol.Name, fuzzAuthority, fuzzKey)
	completedFP := fingerprint.Compute(fingerprint.Request{Method: "POST", Path: "/orders",
		Headers: headerList(fuzzHeaders(fuzzKey)), Body: []byte(fuzzBody)}, pol.FingerprintHeaders)
	stored := idem.Response{Status: 201, Headers: []idem.Header{{Name: "location", Value: "/orders/1"}}, Body: []byte(`{"id":1}`)}

	f.Fuzz(func(t *testing.T, program []byte) {
		store := memstore.New(memstore.Options{})
		defer store.Close()
		ctx := context.Background()
		tok := idem.NewToken()
		if _, err := store.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: completedFP, Token: tok,
			Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := store.Complete(ctx, id, tok, stored, time.Hour); err != nil {
			t.Fatal(err)
		}
		msgs := decodeMessages(program)
		stream := &fakeStream{ctx: ctx, msgs: msgs}
		srv := New(Config{Store: store, StoreTimeout: time.Second, SettleAtEndTimeout: time.Second})
		done := make(chan error, 1)
		go func() { done <- srv.Process(stream) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("Process hangs on %d messages", len(msgs))
		}

		// Replay the conversation from Envoy's side: what would the
		// server know at each reply?
		var hs []idem.Header
		var body []byte
		headersSeen := false
		for i, reply := range stream.replies {
			msg := msgs[i]
			decisive := false
			switch r := msg.GetRequest().(type) {
			case *extprocv3.ProcessingRequest_RequestHeaders:
				if !headersSeen {
					headersSeen, hs = true, headerList(r.RequestHeaders.GetHeaders())
				}
				decisive = r.RequestHeaders.GetEndOfStream()
			case *extprocv3.ProcessingRequest_RequestBody:
				body = append(body, r.RequestBody.GetBody()...)
				decisive = r.RequestBody.GetEndOfStream()
			case *extprocv3.ProcessingRequest_RequestTrailers:
				decisive = true
			}
			if reply.GetImmediateResponse() != nil {
				break // the exchange is over: Envoy sends nothing more
			}
			if !decisive || !headersSeen {
				continue
			}
			method, _ := idem.FirstHeader(hs, ":method")
			path, _ := idem.FirstHeader(hs, ":path")
			authority, _ := idem.FirstHeader(hs, ":authority")
			raw, _ := idem.FirstHeader(hs, "idempotency-key")
			key, err := idem.ParseKey(raw, 0)
			if err != nil || !strings.EqualFold(method, "POST") || idem.RecordIDFor(pol.Name, authority, key) != id {
				continue
			}
			fp := fingerprint.Compute(fingerprint.Request{Method: method, Path: path, Headers: hs, Body: body}, pol.FingerprintHeaders)
			if fp == completedFP {
				t.Fatalf("message %d (%T) of a completed operation's duplicate answered %v, not a replay",
					i, msg.GetRequest(), reply)
			}
			break // the request is whole: Envoy sends no further request phase
		}
		rec, err := store.Get(ctx, id)
		if err != nil || rec.State != idem.StateCompleted || rec.Token != tok || rec.Response.Status != stored.Status ||
			string(rec.Response.Body) != string(stored.Body) {
			t.Fatalf("the completed record changed: %+v, %v", rec, err)
		}
	})
}

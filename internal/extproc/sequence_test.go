package extproc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Messages of a sequence table. A protected request is a POST with a key;
// reqH takes the key so that cases do not share records.
func reqH(eos bool, key string) *extprocv3.ProcessingRequest {
	kv := []string{":method", "POST", ":path", "/orders", ":authority", "api.example"}
	if key != "" {
		kv = append(kv, "idempotency-key", key)
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers(eos, kv...)}}
}

func reqB(eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: eos}}}
}

func reqT() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
}

func respH(eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: headers(eos, ":status", "201")}}
}

func respB(eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("ok"), EndOfStream: eos}}}
}

func respT() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}
}

func withModes(m *extprocv3.ProcessingRequest, req, resp procmodev3.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
	m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}
	return m
}

// TestOutOfOrderSequencesEndTheStream: each sequence is answered up to its
// last message, which cannot follow the ones before it; the stream then
// ends INVALID_ARGUMENT, never with a reply to that message (SECURITY.md).
// Before sequence.go, all but the first four and the two "request headers"
// cases after a response or a pass-through failed: the server answered the
// last message. The "after response headers" request cases came from
// FuzzMessageSequence (testdata/fuzz/FuzzMessageSequence/49502e392165edb7):
// a duplicate's body let through with a CONTINUE.
func TestOutOfOrderSequencesEndTheStream(t *testing.T) {
	c := client(t)
	type seq = []*extprocv3.ProcessingRequest
	buffered := procmodev3.ProcessingMode_BUFFERED
	cases := []struct {
		name string
		msgs func(key string) seq
	}{
		{"request body before request headers", func(string) seq { return seq{reqB(true)} }},
		{"request trailers before request headers", func(string) seq { return seq{reqT()} }},
		{"request headers twice", func(k string) seq { return seq{reqH(false, k), reqH(false, k)} }},
		{"empty message", func(string) seq { return seq{{}} }},

		{"request body after request headers with end_of_stream", func(k string) seq { return seq{reqH(true, k), reqB(true)} }},
		{"request body after unprotected request headers with end_of_stream", func(string) seq { return seq{reqH(true, ""), reqB(true)} }},
		{"request body after the request body's end_of_stream", func(k string) seq { return seq{reqH(false, k), reqB(true), reqB(true)} }},
		{"request trailers after the request body's end_of_stream", func(k string) seq { return seq{reqH(false, k), reqB(true), reqT()} }},
		{"request trailers after request headers with end_of_stream", func(k string) seq { return seq{reqH(true, k), reqT()} }},
		{"request trailers twice", func(k string) seq { return seq{reqH(false, k), reqB(false), reqT(), reqT()} }},
		{"request body after request trailers", func(k string) seq { return seq{reqH(false, k), reqT(), reqB(true)} }},
		{"request headers after response headers", func(k string) seq { return seq{respH(false), reqH(false, k)} }},
		{"BUFFERED request body after response headers", func(k string) seq {
			return seq{withModes(reqH(false, k), buffered, buffered), respH(false), reqB(true)}
		}},
		{"request body after response headers, modes unknown (BUFFERED assumed)", func(k string) seq {
			return seq{reqH(false, k), respH(false), reqB(true)}
		}},
		{"BUFFERED request trailers after response headers", func(k string) seq {
			return seq{withModes(reqH(false, k), buffered, buffered), respH(false), reqT()}
		}},
		{"request headers twice after a pass-through", func(string) seq { return seq{reqH(true, ""), reqH(true, "")} }},

		{"response headers twice", func(k string) seq { return seq{reqH(true, k), respH(false), respH(false)} }},
		{"response body before response headers", func(k string) seq { return seq{reqH(true, k), respB(true)} }},
		{"response trailers before response headers", func(k string) seq { return seq{reqH(true, k), respT()} }},
		{"response body after response headers with end_of_stream", func(k string) seq { return seq{reqH(true, k), respH(true), respB(true)} }},
		{"response trailers after response headers with end_of_stream", func(k string) seq { return seq{reqH(true, k), respH(true), respT()} }},
		{"response body after the response body's end_of_stream", func(k string) seq { return seq{reqH(true, k), respH(false), respB(true), respB(true)} }},
		{"response trailers after the response body's end_of_stream", func(k string) seq { return seq{reqH(true, k), respH(false), respB(true), respT()} }},
		{"response trailers twice", func(k string) seq { return seq{reqH(true, k), respH(false), respB(false), respT(), respT()} }},
		{"response body after response trailers", func(k string) seq { return seq{reqH(true, k), respH(false), respT(), respB(true)} }},
		{"unprotected response body after response headers with end_of_stream", func(string) seq { return seq{reqH(true, ""), respH(true), respB(true)} }},
	}
	// With BUFFERED known, the pass-through decided at those response
	// headers ends the stream (stream.go, processor.finished): the server has read its last
	// message before the violation comes, and the stream ends with OK.
	finishedFirst := map[string]bool{
		"BUFFERED request body after response headers":     true,
		"BUFFERED request trailers after response headers": true,
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msgs := tc.msgs(fmt.Sprintf("violation-%d", i))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := c.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var last error
			for i, m := range msgs {
				if err := st.Send(m); err != nil {
					// io.EOF: the stream has ended; its status comes
					// from Recv (grpc-go ClientStream.SendMsg).
					_, last = st.Recv()
					break
				}
				resp, err := st.Recv()
				if err != nil {
					last = err
					if i != len(msgs)-1 {
						t.Fatalf("message %d of %d, before the violation, ended the stream: %v", i+1, len(msgs), err)
					}
					break
				}
				if i == len(msgs)-1 {
					t.Fatalf("the violation was answered: %v", resp)
				}
			}
			if finishedFirst[tc.name] {
				if !errors.Is(last, io.EOF) {
					t.Fatalf("stream ended with %v, want the server's OK close (io.EOF)", last)
				}
				return
			}
			if status.Code(last) != codes.InvalidArgument {
				t.Fatalf("stream ended with %v, want InvalidArgument", last)
			}
		})
	}
}

// TestClientSequencesAreServed: what Envoy and grpc-go legitimately send
// is never refused. Every message is sent, the stream half-closed, and
// every reply read; the stream must end cleanly with one reply per message
// (held replies come out once the key is reserved). Sources in sequence.go.
func TestClientSequencesAreServed(t *testing.T) {
	c := client(t)
	type seq = []*extprocv3.ProcessingRequest
	buffered, streamed, duplex := procmodev3.ProcessingMode_BUFFERED, procmodev3.ProcessingMode_STREAMED, procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
	cases := []struct {
		name string
		msgs func(key string) seq
	}{
		{"no body", func(k string) seq { return seq{reqH(true, k), respH(false), respB(true)} }},
		{"BUFFERED with trailers both ways (body end_of_stream false)", func(k string) seq {
			return seq{withModes(reqH(false, k), buffered, buffered), reqB(false), reqT(), respH(false), respB(false), respT()}
		}},
		{"trailers right after headers (empty body)", func(k string) seq { return seq{reqH(false, k), reqT(), respH(true)} }},
		{"STREAMED chunks when the override is ignored, last chunk empty", func(k string) seq {
			return seq{withModes(reqH(false, k), streamed, streamed), reqB(false), reqB(false), reqB(true), respH(false), respB(false), respB(true)}
		}},
		{"STREAMED: the upstream answers before the request body ends", func(k string) seq {
			return seq{withModes(reqH(false, k), streamed, streamed), reqB(false), respH(false), reqB(true), respB(true)}
		}},
		{"FULL_DUPLEX_STREAMED with trailers", func(k string) seq {
			return seq{withModes(reqH(false, k), duplex, duplex), reqB(false), reqT(), respH(false), respB(false), respT()}
		}},
		{"request side skipped", func(string) seq { return seq{respH(false), respB(true)} }},
		{"every phase of an unprotected request (override not honoured)", func(string) seq {
			return seq{reqH(false, ""), reqB(false), reqT(), respH(false), respB(false), respT()}
		}},
		{"grpc-go: messages, half-close, response, trailers", func(k string) seq {
			return seq{proxylessHeaders("idempotency-key", k), requestBody("m1", false), requestBody("", true),
				respH(false), {Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("r1")}}}, respT()}
		}},
		{"grpc-go: trailers-only response", func(k string) seq {
			return seq{proxylessHeaders("idempotency-key", k), requestBody("m1", false), requestBody("", true), respH(true)}
		}},
	}
	// The server ends these streams with OK after that many replies
	// (stream.go, processor.finished) and reads no later message: in BUFFERED mode the body is
	// whole even when trailers follow, so the record is stored at the
	// response body and nothing is left to do.
	endsAfter := map[string]int{
		"BUFFERED with trailers both ways (body end_of_stream false)": 5,
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msgs := tc.msgs(fmt.Sprintf("served-%d", i))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := c.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// Replies are read as they come: a held reply (FULL_DUPLEX,
			// grpc-go) arrives only after later messages.
			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			go func() {
				n := 0
				for {
					r, err := st.Recv()
					if err != nil {
						done <- result{n, err}
						return
					}
					if r.GetResponse() != nil { // not a bare window update
						n++
					}
				}
			}()
			for _, m := range msgs {
				if err := st.Send(m); err != nil {
					break
				}
			}
			_ = st.CloseSend()
			res := <-done
			if !errors.Is(res.err, io.EOF) {
				t.Fatalf("stream ended with %v after %d replies", res.err, res.n)
			}
			want := len(msgs)
			if n, ok := endsAfter[tc.name]; ok {
				want = n
			}
			if res.n != want {
				t.Fatalf("%d replies to %d messages, want %d", res.n, len(msgs), want)
			}
		})
	}
}

package extproc_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/extprocwire"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/server"
)

// What holding a body costs the server, per body byte, however Envoy
// cuts it: the live heap (after a collection) at the moments the server
// holds the most of it, measured against the heap before the request. The
// server runs in the production wiring (server.NewGRPCServer, the
// hand-written codec) on loopback; the client sends what Envoy sends in
// each body mode and keeps nothing it sent.
//
//   - Before the last body message is read: every earlier one was handled
//     (a request body kept for the fingerprint, a response body for the
//     record; in FULL_DUPLEX_STREAMED their echoes withheld until the key
//     is reserved or the outcome stored). A stream interceptor measures as
//     the server asks for that message.
//   - At the reservation, for a request body: it is fingerprinted, and in
//     FULL_DUPLEX_STREAMED still held for the echoes that follow the
//     reservation; in BUFFERED mode it is the one message being answered.
//     A store wrapper measures as Reserve is called.
//
// In BUFFERED mode Envoy itself gathers the chunks and sends the body as
// one message (ext_proc.cc handleDataBufferedMode, sendBufferedData), so
// how the client cut it costs the server nothing: the body is one message.
// A BUFFERED response body, one message read and stored in one go, has no
// moment of its own to measure and is left out.

// heldHeap measures the peak live heap of the requests it is given.
type heldHeap struct {
	cc *grpc.ClientConn
	// probeAt: the server's RecvMsg call that measures (1-based), 0 for
	// none; peak is the highest live heap measured.
	probeAt atomic.Int64
	peak    atomic.Uint64
	// replies counts the replies the client read; a probe first waits for
	// wantReplies of them, so that no reply the server sent waits in
	// gRPC's buffers on either side (a stream may queue 64 KiB of reply
	// messages, grpc-go's write quota, whatever holding them costs).
	replies, wantReplies atomic.Int64
	// atReserve: the reservation is a moment to measure (a request body
	// is held then; a response body comes later).
	atReserve atomic.Bool
}

func liveHeap() uint64 {
	// Twice: sync.Pool's victim cache survives one collection.
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func (h *heldHeap) measure(ctx context.Context) {
	for h.replies.Load() < h.wantReplies.Load() && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	// The server holds still while it is measured; what the client side
	// holds for a moment (a sent message until its writer frees it) does
	// not last: the least of a few readings is the server's.
	v := liveHeap()
	for range 3 {
		time.Sleep(time.Millisecond)
		v = min(v, liveHeap())
	}
	for {
		p := h.peak.Load()
		if v <= p || h.peak.CompareAndSwap(p, v) {
			return
		}
	}
}

// plainCodec is the client's: protobuf into a new slice per message.
type plainCodec struct{}

func (plainCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (plainCodec) Unmarshal(data []byte, v any) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (plainCodec) Name() string { return "proto" }

// storeProbe measures the heap when a key is reserved.
type storeProbe struct {
	idem.Store
	h *heldHeap
}

func (s storeProbe) Reserve(ctx context.Context, r idem.Reservation) (idem.ReserveResult, error) {
	if s.h.atReserve.Load() {
		s.h.measure(ctx)
	}
	return s.Store.Reserve(ctx, r)
}

// recvProbe counts the messages the server asks for.
type recvProbe struct {
	grpc.ServerStream
	h *heldHeap
	n int64
}

func (s *recvProbe) RecvMsg(m any) error {
	s.n++
	if s.n == s.h.probeAt.Load() {
		s.h.measure(s.Context())
	}
	return s.ServerStream.RecvMsg(m)
}

func newHeldHeap(tb testing.TB) *heldHeap {
	tb.Helper()
	h := &heldHeap{}
	st := memstore.New(memstore.Options{})
	tb.Cleanup(func() { _ = st.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	gs := server.NewGRPCServer(0, nil, extprocwire.ServerOption(),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			return handler(srv, &recvProbe{ServerStream: ss, h: h})
		}))
	extprocv3.RegisterExternalProcessorServer(gs, extproc.New(extproc.Config{Store: storeProbe{Store: st, h: h}}))
	go func() { _ = gs.Serve(lis) }()
	tb.Cleanup(gs.Stop)
	// The client's messages are plain slices, not grpc-go's pooled
	// buffers (a 64 KiB message takes one of 1 MiB from its pool), and it
	// makes no retries (grpc-go keeps what a stream sent for a retry until
	// the server's first reply): costs of the client's, not the server's.
	h.cc, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(), grpc.WithDefaultCallOptions(grpc.ForceCodec(plainCodec{})))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.cc.Close() })
	// What the first requests set up once (the connection's buffers, the
	// policy's and the store's first use) is no cost of a body.
	for i, mode := range bodyModes {
		h.perByte(tb, bodyCase{mode: mode, size: 4 << 10, chunk: 1 << 10}, "warm-"+strconv.Itoa(i))
		h.perByte(tb, bodyCase{mode: mode, response: true, size: 4 << 10, chunk: 1 << 10}, "warm-response-"+strconv.Itoa(i))
	}
	return h
}

// bodyCase is a body the client sends: in which mode, which direction,
// how large, cut into how large chunks (one message in BUFFERED mode).
type bodyCase struct {
	mode        procmodev3.ProcessingMode_BodySendMode
	response    bool
	size, chunk int
	// declared: the body's headers carry its content-length.
	declared bool
}

// headersBefore are the messages before the body: the request headers,
// and for a response body the response headers too (the request has
// none).
func headersBefore(c bodyCase, key string) []*extprocv3.ProcessingRequest {
	req, resp := reqH(c.response, key), respH(false)
	if c.declared {
		h := &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(c.size))}
		hs := req.GetRequestHeaders().GetHeaders()
		if c.response {
			hs = resp.GetResponseHeaders().GetHeaders()
		}
		hs.Headers = append(hs.Headers, h)
	}
	if c.response {
		return []*extprocv3.ProcessingRequest{withModes(req, c.mode, c.mode), resp}
	}
	return []*extprocv3.ProcessingRequest{withModes(req, c.mode, c.mode)}
}

// perByte sends one protected request with the case's body, reads every
// reply, and returns the peak live heap it cost, per body byte.
func (h *heldHeap) perByte(tb testing.TB, c bodyCase, key string) float64 {
	tb.Helper()
	if c.mode == procmodev3.ProcessingMode_BUFFERED {
		c.chunk = c.size
	}
	chunks := (c.size + c.chunk - 1) / c.chunk
	before := len(headersBefore(c, key))
	h.peak.Store(0)
	h.probeAt.Store(int64(before + chunks))
	// Before the last chunk is read the client has the replies to the
	// headers and, in STREAMED, to each earlier chunk; in
	// FULL_DUPLEX_STREAMED the request headers reply is withheld with the
	// request body until the reservation.
	h.replies.Store(0)
	want := before
	switch {
	case c.mode == procmodev3.ProcessingMode_STREAMED:
		want += chunks - 1
	case c.mode == procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED && !c.response:
		want = 0
	}
	h.wantReplies.Store(int64(want))
	h.atReserve.Store(!c.response)
	base := liveHeap()
	// One chunk's bytes sent again and again: the client keeps no more of
	// the body than that in this process's heap.
	buf := make([]byte, c.chunk)
	for i := range buf {
		buf[i] = 'a' + byte(i%26)
	}
	sendBody(tb, h.cc, c, key, buf, &h.replies)
	peak := h.peak.Load()
	if peak == 0 {
		tb.Fatal("the server reached neither the last chunk nor the reservation")
	}
	return float64(int64(peak)-int64(base)) / float64(c.size)
}

// sendBody runs one protected request on cc as Envoy sends it in the
// case's mode (BUFFERED: the body in one message), with its body cut into
// the case's chunks, and reads every reply, counting them in replies,
// until the server ends the stream. The body is src, or when src is
// shorter than the case's size, src's first bytes again for every chunk.
func sendBody(tb testing.TB, cc *grpc.ClientConn, c bodyCase, key string, src []byte, replies *atomic.Int64) {
	tb.Helper()
	if c.mode == procmodev3.ProcessingMode_BUFFERED {
		c.chunk = c.size
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
			replies.Add(1)
		}
	})
	before := headersBefore(c, key)
	for _, m := range before {
		if err := st.Send(m); err != nil {
			tb.Fatal(err)
		}
	}
	// A response comes once the request was answered, as from Envoy: no
	// part of it waits on the client's side while the key is reserved.
	for c.response && replies.Load() < int64(len(before)) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	for sent := 0; sent < c.size; sent += c.chunk {
		n := min(c.chunk, c.size-sent)
		chunk := src[:n]
		if len(src) >= c.size {
			chunk = src[sent : sent+n]
		}
		body := &extprocv3.HttpBody{Body: chunk, EndOfStream: sent+n == c.size}
		m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: body}}
		if c.response {
			m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: body}
		}
		if err := st.Send(m); err != nil {
			tb.Fatal(err)
		}
	}
	_ = st.CloseSend()
	wg.Wait()
}

var bodyModes = []procmodev3.ProcessingMode_BodySendMode{
	procmodev3.ProcessingMode_STREAMED,
	procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED,
	procmodev3.ProcessingMode_BUFFERED,
}

// directions are the bodies measured in a mode: request (false) and
// response (true), but a BUFFERED response (see above).
func directions(mode procmodev3.ProcessingMode_BodySendMode) []bool {
	if mode == procmodev3.ProcessingMode_BUFFERED {
		return []bool{false}
	}
	return []bool{false, true}
}

// TestBodyMemoryPerByteIsBounded: a body held by the server, request or
// response, costs at most three times its size in live heap in every body
// mode, also when Envoy sends it one byte per message. Before the
// withheld echoes of FULL_DUPLEX_STREAMED were kept as the body's bytes, a
// 64 KiB body in 1-byte chunks held about 400 bytes per byte there.
func TestBodyMemoryPerByteIsBounded(t *testing.T) {
	h := newHeldHeap(t)
	const size = 64 << 10
	for i, mode := range bodyModes {
		for _, response := range directions(mode) {
			t.Run(fmt.Sprintf("%s/response=%v", mode, response), func(t *testing.T) {
				got := h.perByte(t, bodyCase{mode: mode, response: response, size: size, chunk: 1}, fmt.Sprintf("mem-%d-%v", i, response))
				t.Logf("%.2f bytes of heap per body byte", got)
				if got > 3 {
					t.Errorf("a %d byte body in 1-byte chunks held %.1f bytes of heap per body byte, want at most 3", size, got)
				}
			})
		}
	}
}

// BenchmarkBodyMemory reports the peak live heap per body byte (heap-B/B)
// of a 256 KiB body, request or response, in each body mode, cut into
// chunks of 1 byte, 1 KiB and 64 KiB (BUFFERED: one message). Its time
// per operation is that of one request of that many messages over
// loopback gRPC, not a figure to compare. Under the race detector (the
// suite's one benchmark pass, -test.bench=. -test.benchtime=1x) a body in 1-byte chunks is 64 KiB,
// not 256 (a message each, about 33 s for 256 KiB under the detector), the
// size TestBodyMemoryPerByteIsBounded holds to its bound: that run shows
// the benchmark works. (At 16 KiB, FULL_DUPLEX_STREAMED's request reported
// about 400 bytes per byte under the detector.)
func BenchmarkBodyMemory(b *testing.B) {
	h := newHeldHeap(b)
	const size = 256 << 10
	n := 0
	for _, mode := range bodyModes {
		chunks := []int{1, 1 << 10, 64 << 10}
		if mode == procmodev3.ProcessingMode_BUFFERED {
			chunks = []int{size}
		}
		for _, chunk := range chunks {
			for _, response := range directions(mode) {
				b.Run(fmt.Sprintf("%s/response=%v/chunk=%d", mode, response, chunk), func(b *testing.B) {
					size := size
					if underRace && chunk == 1 {
						size = 64 << 10
					}
					var worst float64
					for b.Loop() {
						n++
						worst = max(worst, h.perByte(b, bodyCase{mode: mode, response: response, size: size, chunk: chunk}, "bench-"+strconv.Itoa(n)))
					}
					b.ReportMetric(worst, "heap-B/B")
				})
			}
		}
	}
}

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

// What holding a request body costs the server, per body byte, however
// Envoy cuts it: the live heap (after a collection) at the two moments
// the server holds the most of a protected request, measured against the
// heap before the request. The server runs in the production wiring
// (server.NewGRPCServer, the hand-written codec) on loopback; the client
// sends what Envoy sends in each body mode and keeps nothing it sent.
//
//   - Before the last body message is read: every earlier chunk was
//     handled (STREAMED: kept for the fingerprint; FULL_DUPLEX_STREAMED:
//     kept for the fingerprint and its echo withheld until the key is
//     reserved). A stream interceptor measures as the server asks for that
//     message.
//   - At the reservation: the body is fingerprinted, and in
//     FULL_DUPLEX_STREAMED still held for the echoes that follow the
//     reservation. A store wrapper measures as Reserve is called.
//
// In BUFFERED mode Envoy itself gathers the chunks and sends the body as
// one message (ext_proc.cc handleDataBufferedMode, sendBufferedData), so
// how the client cut it costs the server nothing: the body is one message.

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

// reserveProbe measures the heap when a key is reserved.
type reserveProbe struct {
	idem.Store
	h *heldHeap
}

func (s reserveProbe) Reserve(ctx context.Context, r idem.Reservation) (idem.ReserveResult, error) {
	s.h.measure(ctx)
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
	extprocv3.RegisterExternalProcessorServer(gs, extproc.New(extproc.Config{Store: reserveProbe{Store: st, h: h}}))
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
		h.perByte(tb, mode, 4<<10, 1<<10, "warm-"+strconv.Itoa(i))
	}
	return h
}

// perByte sends one protected request whose body of size bytes is cut
// into chunks of chunk bytes (one message in BUFFERED mode), reads every
// reply, and returns the peak live heap it cost, per body byte.
func (h *heldHeap) perByte(tb testing.TB, mode procmodev3.ProcessingMode_BodySendMode, size, chunk int, key string) float64 {
	tb.Helper()
	if mode == procmodev3.ProcessingMode_BUFFERED {
		chunk = size
	}
	chunks := (size + chunk - 1) / chunk
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.peak.Store(0)
	// The headers are message 1, the last chunk message 1+chunks.
	h.probeAt.Store(int64(1 + chunks))
	// Before the last chunk is read: the headers reply and each earlier
	// chunk's in STREAMED, the headers reply in BUFFERED (the body is one
	// message); nothing in FULL_DUPLEX_STREAMED, where every reply is
	// withheld until the reservation.
	h.replies.Store(0)
	switch mode {
	case procmodev3.ProcessingMode_STREAMED:
		h.wantReplies.Store(int64(chunks))
	case procmodev3.ProcessingMode_BUFFERED:
		h.wantReplies.Store(1)
	default:
		h.wantReplies.Store(0)
	}
	base := liveHeap()
	st, err := extprocv3.NewExternalProcessorClient(h.cc).Process(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
			h.replies.Add(1)
		}
	})
	if err := st.Send(withModes(reqH(false, key), mode, mode)); err != nil {
		tb.Fatal(err)
	}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = 'a' + byte(i%26)
	}
	for sent := 0; sent < size; sent += chunk {
		n := min(chunk, size-sent)
		body := &extprocv3.HttpBody{Body: buf[:n], EndOfStream: sent+n == size}
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: body}}); err != nil {
			tb.Fatal(err)
		}
	}
	_ = st.CloseSend()
	wg.Wait()
	peak := h.peak.Load()
	if peak == 0 {
		tb.Fatal("the server reached neither the last chunk nor the reservation")
	}
	return float64(int64(peak)-int64(base)) / float64(size)
}

var bodyModes = []procmodev3.ProcessingMode_BodySendMode{
	procmodev3.ProcessingMode_STREAMED,
	procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED,
	procmodev3.ProcessingMode_BUFFERED,
}

// TestBodyMemoryPerByteIsBounded: a request body held by the server costs
// at most three times its size in live heap in every body mode, also when
// Envoy sends it one byte per message. Before the held echoes of
// FULL_DUPLEX_STREAMED were kept as one buffer, a 64 KiB body in 1-byte
// chunks cost about 600 bytes per byte there.
func TestBodyMemoryPerByteIsBounded(t *testing.T) {
	h := newHeldHeap(t)
	const size = 64 << 10
	for i, mode := range bodyModes {
		t.Run(mode.String(), func(t *testing.T) {
			got := h.perByte(t, mode, size, 1, "mem-"+strconv.Itoa(i))
			t.Logf("%.2f bytes of heap per body byte", got)
			if got > 3 {
				t.Errorf("a %d byte body in 1-byte chunks held %.1f bytes of heap per body byte, want at most 3", size, got)
			}
		})
	}
}

// BenchmarkBodyMemory reports the peak live heap per body byte (heap-B/B)
// of a 256 KiB request body in each body mode, cut into chunks of 1 byte,
// 1 KiB and 64 KiB. Its time per operation is that of one request of
// that many messages over loopback gRPC, and not a figure to compare.
func BenchmarkBodyMemory(b *testing.B) {
	h := newHeldHeap(b)
	const size = 256 << 10
	n := 0
	for _, mode := range bodyModes {
		for _, chunk := range []int{1, 1 << 10, 64 << 10} {
			if mode == procmodev3.ProcessingMode_BUFFERED && chunk != 1 {
				continue // one message however it was cut
			}
			b.Run(fmt.Sprintf("%s/chunk=%d", mode, chunk), func(b *testing.B) {
				var worst float64
				for b.Loop() {
					n++
					worst = max(worst, h.perByte(b, mode, size, chunk, "bench-"+strconv.Itoa(n)))
				}
				b.ReportMetric(worst, "heap-B/B")
			})
		}
	}
}

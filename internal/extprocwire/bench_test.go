package extprocwire

import (
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// codecs are the two codecs compared: this package's and grpc-go's
// standard one, each called as grpc-go calls it (a new message per
// receive, the BufferSlice freed after the send).
func codecs() map[string]encoding.CodecV2 {
	return map[string]encoding.CodecV2{"fast": NewCodec(), "proto": encoding.GetCodecV2(grpcproto.Name)}
}

// cpuTime is the process's CPU time (user and system, every thread: the
// garbage collector's work included).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loop runs op b.N times and reports, besides ns/op, the CPU time per op
// (cpu-ns/op): on this shared two-vCPU machine a benchmark often gets a
// fraction of a CPU, which stretches ns/op but not the CPU it spends.
func loop(b *testing.B, op func()) {
	b.ReportAllocs()
	start := cpuTime(b)
	n := 0
	for b.Loop() {
		op()
		n++
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(n), "cpu-ns/op")
}

func BenchmarkUnmarshal(b *testing.B) {
	for _, c := range []struct {
		name string
		m    *extprocv3.ProcessingRequest
	}{
		{"request-headers-12", typicalRequestHeaders()},
		{"request-body-256B", bodyRequest(256, false)},
		{"response-headers", responseHeadersRequest()},
	} {
		wire := mustMarshal(c.m)
		for _, name := range []string{"fast", "proto"} {
			codec := codecs()[name]
			b.Run(c.name+"/"+name, func(b *testing.B) {
				data := mem.BufferSlice{mem.SliceBuffer(wire)}
				loop(b, func() {
					if err := codec.Unmarshal(data, new(extprocv3.ProcessingRequest)); err != nil {
						b.Fatal(err)
					}
				})
			})
		}
	}
}

// overwrite is a header option as internal/extproc's setHeader builds it.
func overwrite(k, v string) *corev3.HeaderValueOption {
	o := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	//lint:ignore SA1019 the server sets the deprecated append too.
	o.Append = wrapperspb.Bool(false)
	return o
}

// marshalCase is a response as the server sends it.
type marshalCase struct {
	name string
	m    *extprocv3.ProcessingResponse
}

// marshalCases are the responses the marshal benchmarks encode: the
// CONTINUE a first write gets at each of its four phases, one with a
// mode_override, and a replay's immediate response.
func marshalCases() []marshalCase {
	return []marshalCase{
		{"continue-headers", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}},
		{"body-mode-override", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}},
			ModeOverride: &procmodev3.ProcessingMode{ResponseBodyMode: procmodev3.ProcessingMode_BUFFERED}}},
		{"immediate", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_Created},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				overwrite("content-type", "application/json"),
				overwrite("location", "/v1/orders/42"),
				overwrite("idempotency-replayed", "true"),
			}},
			Body:    make([]byte, 1024),
			Details: "idempotency_replay",
		}}}},
	}
}

func BenchmarkMarshal(b *testing.B) {
	for _, c := range marshalCases() {
		for _, name := range []string{"fast", "proto"} {
			codec := codecs()[name]
			b.Run(c.name+"/"+name, func(b *testing.B) {
				loop(b, func() {
					data, err := codec.Marshal(c.m)
					if err != nil {
						b.Fatal(err)
					}
					data.Free()
				})
			})
		}
	}
}

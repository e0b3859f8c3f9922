package extprocwire

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// codecs are the two codecs compared: this package's and grpc-go's
// standard one, each called as grpc-go calls it (a new message per
// receive, the BufferSlice freed after the send).
func codecs() map[string]encoding.CodecV2 {
	return map[string]encoding.CodecV2{"fast": NewCodec(), "proto": encoding.GetCodecV2(grpcproto.Name)}
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
				b.ReportAllocs()
				for b.Loop() {
					if err := codec.Unmarshal(data, new(extprocv3.ProcessingRequest)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkMarshal(b *testing.B) {
	for _, c := range []struct {
		name string
		m    *extprocv3.ProcessingResponse
	}{
		{"continue-headers", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}},
		{"body-mode-override", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}},
			ModeOverride: &procmodev3.ProcessingMode{ResponseBodyMode: procmodev3.ProcessingMode_BUFFERED}}},
		{"immediate", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode_Created},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
				{Header: &corev3.HeaderValue{Key: "location", RawValue: []byte("/v1/orders/42")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
				{Header: &corev3.HeaderValue{Key: "idempotency-replayed", RawValue: []byte("true")}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD},
			}},
			Body:    make([]byte, 1024),
			Details: "idempotency_replay",
		}}}},
	} {
		for _, name := range []string{"fast", "proto"} {
			codec := codecs()[name]
			b.Run(c.name+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					data, err := codec.Marshal(c.m)
					if err != nil {
						b.Fatal(err)
					}
					data.Free()
				}
			})
		}
	}
}

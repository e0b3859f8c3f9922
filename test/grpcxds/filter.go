package grpcxds

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	insecurev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/grpc_service/channel_credentials/insecure/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// FilterConfig is the ext_proc filter configuration docs/grpc.md gives for
// grpc-go clients, pointing at the idem-extproc server on target (a gRPC
// target URI such as "dns:///idem-extproc:50051" or "127.0.0.1:50051"):
//
//   - request headers SEND: the call's metadata carries the key;
//   - request body GRPC: each request message, then the half-close, reach
//     the server, which fingerprints them and holds them until the key is
//     reserved;
//   - response headers SEND, response body GRPC and response trailers SEND
//     (grpc-go requires trailers SEND with a GRPC response body): the
//     server records the outcome when the call ends;
//   - request_attributes request.path, request.host and request.method:
//     grpc-go sends no pseudo-headers, so the method's path and the
//     authority that policies match on come from these;
//   - failure_mode_allow false: a call is never let through unprotected;
//   - no grpc_service timeout: grpc-go applies it to the whole ext_proc
//     stream, which lives as long as the call;
//   - a stat_prefix: grpc-go ignores it, but the Envoy API requires one, so
//     a management server that validates its resources refuses the filter
//     without it.
func FilterConfig(target string) *extprocfilterv3.ExternalProcessor {
	creds, err := anypb.New(&insecurev3.InsecureCredentials{})
	if err != nil {
		panic(err) // marshalling an empty message cannot fail
	}
	return &extprocfilterv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_GoogleGrpc_{GoogleGrpc: &corev3.GrpcService_GoogleGrpc{
				TargetUri:                target,
				StatPrefix:               "idem_extproc",
				ChannelCredentialsPlugin: []*anypb.Any{creds},
			}},
		},
		ProcessingMode: &extprocfilterv3.ProcessingMode{
			RequestHeaderMode:   extprocfilterv3.ProcessingMode_SEND,
			RequestBodyMode:     extprocfilterv3.ProcessingMode_GRPC,
			ResponseHeaderMode:  extprocfilterv3.ProcessingMode_SEND,
			ResponseBodyMode:    extprocfilterv3.ProcessingMode_GRPC,
			ResponseTrailerMode: extprocfilterv3.ProcessingMode_SEND,
		},
		RequestAttributes: []string{"request.path", "request.host", "request.method"},
		FailureModeAllow:  false,
	}
}

func httpFilter(name string, cfg proto.Message) (*hcmv3.HttpFilter, error) {
	a, err := anypb.New(cfg)
	if err != nil {
		return nil, err
	}
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}}, nil
}

func wrapU32(v uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(v) }

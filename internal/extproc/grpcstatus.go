package extproc

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"

	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// grpcCodes maps each problem type to the gRPC status a gRPC call gets
// instead (docs/grpc.md has the table and the reasons):
//   - a missing or malformed key is the caller's mistake whatever the
//     state: INVALID_ARGUMENT;
//   - a key reused for another request, and an earlier call whose outcome
//     is unknown, will not change by retrying: the caller must use a new
//     key or first check the resource (gRPC's guidance for
//     FAILED_PRECONDITION: "do not retry until the system state has been
//     explicitly fixed");
//   - a call still in progress is a concurrency conflict that a retry
//     with backoff resolves: ABORTED;
//   - the store unreachable is transient: UNAVAILABLE, the code gRPC
//     retry policies retry;
//   - a request too large to fingerprint: RESOURCE_EXHAUSTED, as gRPC
//     answers an over-limit message;
//   - no principal to scope the key: UNAUTHENTICATED;
//   - the server's body budget full: transient too, UNAVAILABLE;
//   - a body a policy must read and cannot: the client's to fix,
//     INVALID_ARGUMENT.
var grpcCodes = map[string]codes.Code{
	problem.KeyMissing.Slug:       codes.InvalidArgument,
	problem.KeyInvalid.Slug:       codes.InvalidArgument,
	problem.KeyReused.Slug:        codes.FailedPrecondition,
	problem.InProgress.Slug:       codes.Aborted,
	problem.OutcomeUnknown.Slug:   codes.FailedPrecondition,
	problem.StoreUnavailable.Slug: codes.Unavailable,
	problem.BodyTooLarge.Slug:     codes.ResourceExhausted,
	problem.BodyIncomplete.Slug:   codes.ResourceExhausted,
	problem.PrincipalMissing.Slug: codes.Unauthenticated,
	problem.CapacityExceeded.Slug: codes.Unavailable,
	problem.HomeOutOfReach.Slug:   codes.FailedPrecondition,
	problem.HomesDisagree.Slug:    codes.FailedPrecondition,
	problem.BodyUnreadable.Slug:   codes.InvalidArgument,
}

// ReplayCode is the gRPC status of a retry of a completed call: the
// operation it names already exists. A gRPC answer cannot carry the
// original response message (grpc-go turns an immediate response into a
// status; Envoy turns a local reply to a gRPC request into a trailers-only
// response), so the status message says the operation completed and with
// which status (processor.replayReply).
const ReplayCode = codes.AlreadyExists

// grpcAnswer builds the immediate response that ends a gRPC call with a
// status. grpc-go uses grpc_status and takes details as the status
// message (it applies no headers before the response trailers). Envoy
// answers a gRPC request's local reply trailers-only, with grpc_status as
// grpc-status and the body as grpc-message (http/utility.cc
// sendLocalReply), and records details as the response code details.
func grpcAnswer(code codes.Code, msg string, httpStatus int, hs []*corev3.HeaderValueOption, envoyDetails string, proxyless bool) *extprocv3.ProcessingResponse {
	var body []byte
	if proxyless {
		hs, envoyDetails = nil, msg
	} else {
		body = []byte(msg)
	}
	resp := immediate(httpStatus, hs, body, envoyDetails)
	resp.GetImmediateResponse().GrpcStatus = &extprocv3.GrpcStatus{Status: uint32(code)}
	return resp
}

package extproc

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/idem-extproc/idem-extproc/internal/idem"
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

// codeNames are the canonical gRPC code names (google/rpc/code.proto).
var codeNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func codeName(c codes.Code) string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "CODE_" + strconv.Itoa(int(c))
}

// encodeGRPCMessage percent-encodes a status message as grpc-message
// requires (gRPC over HTTP/2: "%"-encode bytes outside 0x20-0x7E and "%").
func encodeGRPCMessage(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func decodeGRPCMessage(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(n))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// withStatus sets grpc-status and grpc-message in the stored headers.
func withStatus(hs []idem.Header, code codes.Code, msg string) []idem.Header {
	out := slices.DeleteFunc(slices.Clone(hs), func(h idem.Header) bool {
		return h.Name == "grpc-status" || h.Name == "grpc-message"
	})
	out = append(out, idem.Header{Name: "grpc-status", Value: strconv.Itoa(int(code))})
	if msg != "" {
		out = append(out, idem.Header{Name: "grpc-message", Value: encodeGRPCMessage(msg)})
	}
	return out
}

// grpcStatusOf reads a gRPC status from headers: grpc-status and
// grpc-message, or grpc-status-details-bin (a google.rpc.Status; grpc-go
// forwards it base64-encoded like every binary header).
func grpcStatusOf(hs []idem.Header) (codes.Code, string, bool) {
	if s, ok := firstHeader(hs, "grpc-status"); ok {
		if n, err := strconv.ParseUint(s, 10, 32); err == nil {
			msg, _ := firstHeader(hs, "grpc-message")
			return codes.Code(n), decodeGRPCMessage(msg), true
		}
	}
	if b, ok := firstHeader(hs, "grpc-status-details-bin"); ok {
		// Base64, padded or not (gRPC over HTTP/2 allows both).
		raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(b, "="))
		st := &spb.Status{}
		if err == nil && proto.Unmarshal(raw, st) == nil {
			return codes.Code(st.GetCode()), st.GetMessage(), true
		}
	}
	return codes.Unknown, "", false
}

// httpStatuses is google.rpc.Code's HTTP mapping (google/rpc/code.proto),
// indexed by code.
var httpStatuses = [...]int{200, 499, 500, 400, 504, 404, 409, 403, 429, 400, 409, 400, 501, 500, 503, 500, 401}

func httpStatusFor(c codes.Code) int {
	if int(c) < len(httpStatuses) {
		return httpStatuses[c]
	}
	return 500 // codes beyond 16
}

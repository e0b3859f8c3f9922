package envoysim

import (
	"fmt"
	"strconv"
	"strings"
)

// isGRPC reports whether the request is a gRPC request as Envoy decides it
// for local replies (grpc/common.cc Common::isGrpcRequestHeaders: a
// content-type of application/grpc, optionally with a +suffix or
// parameters).
func (x *exchange) isGRPC() bool {
	ct := get(x.reqHeaders, "content-type")
	return ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+") || strings.HasPrefix(ct, "application/grpc;")
}

// grpcLocalReply is the local reply Envoy sends to a gRPC request
// (http/utility.cc Utility::sendLocalReply): a trailers-only response,
// :status 200 and content-type application/grpc, whose grpc-status is the
// immediate response's grpc_status (else the HTTP code mapped by
// Grpc::Utility::httpToGrpcStatus) unless the header mutation already set
// one, whose grpc-message is the percent-encoded body, and with no
// content-length. headers are what modify_headers produced.
func grpcLocalReply(code int, headers []Header, body []byte, grpcStatus *uint32, details string) *Response {
	hs := remove(remove(headers, "content-length"), "content-type")
	hs = append(hs, Header{"content-type", "application/grpc"})
	if _, ok := Get(hs, "grpc-status"); !ok {
		st := httpToGRPCStatus(code)
		if grpcStatus != nil {
			st = *grpcStatus
		}
		hs = append(hs, Header{"grpc-status", strconv.FormatUint(uint64(st), 10)})
	}
	if len(body) > 0 {
		hs = append(remove(hs, "grpc-message"), Header{"grpc-message", percentEncode(string(body))})
	}
	return &Response{Status: 200, Headers: hs, Details: details}
}

// httpToGRPCStatus is Envoy's Grpc::Utility::httpToGrpcStatus.
func httpToGRPCStatus(code int) uint32 {
	switch code {
	case 400:
		return 13 // INTERNAL
	case 401:
		return 16 // UNAUTHENTICATED
	case 403:
		return 7 // PERMISSION_DENIED
	case 404:
		return 12 // UNIMPLEMENTED
	case 429, 502, 503, 504:
		return 14 // UNAVAILABLE
	}
	return 2 // UNKNOWN
}

// percentEncode is Envoy's PercentEncoding::encode for grpc-message:
// bytes below ' ', from '~' up, and '%' are escaped.
func percentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c >= '~' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

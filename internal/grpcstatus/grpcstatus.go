// Package grpcstatus reads and writes a gRPC call's status where a
// response carries it among its headers or trailers (gRPC over HTTP/2,
// PROTOCOL-HTTP2.md: grpc-status, grpc-message, grpc-status-details-bin),
// and names a status code and its HTTP equivalent.
package grpcstatus

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// names are the canonical gRPC code names (google/rpc/code.proto).
var names = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

// Name is c's canonical name ("ALREADY_EXISTS"), as gRPC's documentation
// and other languages' libraries spell it; grpc-go's codes.Code.String
// spells them in Go's style ("AlreadyExists", codes/code_string.go).
func Name(c codes.Code) string {
	if int(c) < len(names) {
		return names[c]
	}
	return "CODE_" + strconv.Itoa(int(c))
}

// encodeMessage percent-encodes a status message as grpc-message
// requires (gRPC over HTTP/2: "%"-encode bytes outside 0x20-0x7E and "%").
func encodeMessage(s string) string {
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

// decodeMessage undoes encodeMessage, leaving a malformed escape as it is.
func decodeMessage(s string) string {
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

// With returns hs with grpc-status and grpc-message set to code and msg,
// the status's earlier fields dropped; hs itself is not changed.
func With(hs []idem.Header, code codes.Code, msg string) []idem.Header {
	out := slices.DeleteFunc(slices.Clone(hs), func(h idem.Header) bool {
		return h.Name == "grpc-status" || h.Name == "grpc-message"
	})
	out = append(out, idem.Header{Name: "grpc-status", Value: strconv.Itoa(int(code))})
	if msg != "" {
		out = append(out, idem.Header{Name: "grpc-message", Value: encodeMessage(msg)})
	}
	return out
}

// Of reads a gRPC status from headers: grpc-status and grpc-message, or
// grpc-status-details-bin (a google.rpc.Status; grpc-go forwards it
// base64-encoded like every binary header); false when they hold none.
func Of(hs []idem.Header) (codes.Code, string, bool) {
	if s, ok := idem.FirstHeader(hs, "grpc-status"); ok {
		if n, err := strconv.ParseUint(s, 10, 32); err == nil {
			msg, _ := idem.FirstHeader(hs, "grpc-message")
			return codes.Code(n), decodeMessage(msg), true
		}
	}
	if b, ok := idem.FirstHeader(hs, "grpc-status-details-bin"); ok {
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

// HTTPStatus is c's HTTP equivalent, by google.rpc.Code's mapping.
func HTTPStatus(c codes.Code) int {
	if int(c) < len(httpStatuses) {
		return httpStatuses[c]
	}
	return 500 // codes beyond 16
}

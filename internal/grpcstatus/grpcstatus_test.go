package grpcstatus

import (
	"encoding/base64"
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

func TestOf(t *testing.T) {
	details, _ := proto.Marshal(&spb.Status{Code: int32(codes.NotFound), Message: "gone"})
	for name, tc := range map[string]struct {
		hs    []idem.Header
		code  codes.Code
		msg   string
		known bool
	}{
		"grpc-status":       {[]idem.Header{{Name: "grpc-status", Value: "9"}, {Name: "grpc-message", Value: "no%20stock%25"}}, codes.FailedPrecondition, "no stock%", true},
		"details, padded":   {[]idem.Header{{Name: "grpc-status-details-bin", Value: base64.StdEncoding.EncodeToString(details)}}, codes.NotFound, "gone", true},
		"details, unpadded": {[]idem.Header{{Name: "grpc-status-details-bin", Value: base64.RawStdEncoding.EncodeToString(details)}}, codes.NotFound, "gone", true},
		"grpc-status wins":  {[]idem.Header{{Name: "grpc-status", Value: "0"}, {Name: "grpc-status-details-bin", Value: "!!"}}, codes.OK, "", true},
		"nothing":           {[]idem.Header{{Name: "content-type", Value: "application/grpc"}}, codes.Unknown, "", false},
		"malformed details": {[]idem.Header{{Name: "grpc-status-details-bin", Value: "%%%"}}, codes.Unknown, "", false},
		"malformed status":  {[]idem.Header{{Name: "grpc-status", Value: "x"}}, codes.Unknown, "", false},
	} {
		t.Run(name, func(t *testing.T) {
			code, msg, known := Of(tc.hs)
			if code != tc.code || msg != tc.msg || known != tc.known {
				t.Fatalf("got %v %q %v, want %v %q %v", code, msg, known, tc.code, tc.msg, tc.known)
			}
		})
	}
}

func TestGRPCMessageRoundTrip(t *testing.T) {
	for _, s := range []string{"plain", "100% sure", "naïve\n", ""} {
		if got := decodeMessage(encodeMessage(s)); got != s {
			t.Fatalf("%q came back as %q", s, got)
		}
	}
}

// TestHTTPStatus: the codes whose HTTP equivalent the default response
// rules single out.
func TestHTTPStatus(t *testing.T) {
	for code, want := range map[codes.Code]int{
		codes.OK: 200, codes.ResourceExhausted: 429, codes.Unavailable: 503, codes.DeadlineExceeded: 504,
		codes.InvalidArgument: 400, codes.Unknown: 500, codes.Code(42): 500,
	} {
		if got := HTTPStatus(code); got != want {
			t.Errorf("%v: %d, want %d", code, got, want)
		}
	}
	if a := idem.DecideResponse(idem.DefaultResponseRules(), idem.OriginUpstream, HTTPStatus(codes.ResourceExhausted)); a != idem.ActionRelease {
		t.Fatalf("RESOURCE_EXHAUSTED: %v, want release", a)
	}
}

package envoyorigin

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// TestClassifyRealDetails runs the classifier over details strings exactly as
// Envoy writes them, each from the Envoy test or source named beside it.
func TestClassifyRealDetails(t *testing.T) {
	for _, tc := range []struct {
		details string
		flags   uint64
		want    idem.Origin
	}{
		// router_test.cc (RouterTest) and router.cc.
		{"via_upstream", 0, idem.OriginUpstream}, // AddCookie
		{"upstream_reset_before_response_started{remote_connection_failure|tls_version_mismatch}", UpstreamConnectionFailure, idem.OriginNotSent}, // PoolFailureWithPriority
		{"upstream_reset_before_response_started{connection_timeout|connect_timeout}", UpstreamConnectionFailure, idem.OriginNotSent},             // PoolFailureDueToConnectTimeout
		{"upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}", UpstreamConnectionFailure, idem.OriginNotSent},
		{"upstream_reset_before_response_started{local_connection_failure}", UpstreamConnectionFailure, idem.OriginNotSent},
		{"upstream_reset_before_response_started{remote_connection_failure|immediate_connect_error:_Network_is_unreachable|remote_address:[fdc4::254]:80}", UpstreamConnectionFailure, idem.OriginNotSent},
		{"upstream_reset_before_response_started{overflow}", UpstreamOverflow, idem.OriginNotSent},
		{"upstream_reset_before_response_started{remote_reset}", UpstreamRemoteReset, idem.OriginMaybeSent}, // RetryUpstreamReset...
		{"upstream_reset_before_response_started{connection_termination}", UpstreamConnectionTermination, idem.OriginMaybeSent},
		{"upstream_reset_before_response_started{local_reset|codec_error}", LocalReset, idem.OriginMaybeSent},
		{"upstream_reset_before_response_started{protocol_error}", UpstreamProtocolError, idem.OriginMaybeSent},
		{"upstream_reset_before_response_started{remote_refused_stream_reset}", UpstreamRemoteReset, idem.OriginMaybeSent},
		{"upstream_reset_after_response_started{remote_reset}", UpstreamRemoteReset, idem.OriginMaybeSent},
		{"response_timeout", UpstreamRequestTimeout, idem.OriginMaybeSent},
		{"upstream_per_try_timeout", UpstreamRequestTimeout, idem.OriginMaybeSent},
		{"cluster_not_found", NoClusterFound, idem.OriginNotSent}, // ClusterNotFound
		{"route_not_found", NoRouteFound, idem.OriginNotSent},
		{"no_healthy_upstream", NoHealthyUpstream, idem.OriginNotSent},
		{"direct_response", 0, idem.OriginNotSent},
		{"maintenance_mode", 0, idem.OriginNotSent},
		{"drop_overload", DropOverLoad, idem.OriginNotSent},
		// Filters after ext_proc.
		{"request_rate_limited", RateLimited, idem.OriginNotSent},          // ratelimit.cc
		{"local_rate_limited", RateLimited, idem.OriginNotSent},            // local_ratelimit_test.cc RequestRateLimited
		{"rbac_access_denied_matched_policy[none]", 0, idem.OriginNotSent}, // rbac utility_test.cc
		{"rbac_access_denied_matched_policy[ab_df__xy]", 0, idem.OriginNotSent},
		{"ext_authz_denied", UnauthorizedExternalService, idem.OriginNotSent},
		{"ext_authz_error", 0, idem.OriginNotSent},
		{"fault_filter_abort", FaultInjected, idem.OriginNotSent}, // fault_filter_test.cc
		// Not recognised, or proving nothing: maybe sent.
		{"response_payload_too_large", 0, idem.OriginMaybeSent},
		{"upstream_reset_before_response_started{connection_failure_but_new}", 0, idem.OriginMaybeSent},
		{"upstream_reset_before_response_started{}", 0, idem.OriginMaybeSent},
		{"upstream_reset_before_response_started{remote_connection_failure", 0, idem.OriginMaybeSent},
		{"rbac_access_denied", 0, idem.OriginMaybeSent},
		{"something_new_in_a_later_envoy", 0, idem.OriginMaybeSent},
		// Retries: the details describe the last attempt only.
		{"upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
			UpstreamConnectionFailure | UpstreamRetryLimitExceeded, idem.OriginMaybeSent},
	} {
		if got := Classify(tc.details, true, tc.flags); got != tc.want {
			t.Errorf("Classify(%q, %#x) = %v, want %v", tc.details, tc.flags, got, tc.want)
		}
	}
}

// TestClassifyByFlags covers a filter that sends response.flags without
// response.code_details: the bit vector as legacyResponseFlags() builds it.
func TestClassifyByFlags(t *testing.T) {
	for _, tc := range []struct {
		flags uint64
		want  idem.Origin
	}{
		{0, idem.OriginUpstream},
		{0x20, idem.OriginNotSent},       // UF
		{0x2 | 0x80, idem.OriginNotSent}, // UH, UO
		{0x800, idem.OriginNotSent},      // RL
		{0x4, idem.OriginMaybeSent},      // UT
		{0x20 | 0x10, idem.OriginMaybeSent},
		{0x20 | 0x8000, idem.OriginMaybeSent}, // UF after retries (URX)
		{1 << 40, idem.OriginMaybeSent},       // a bit no release defines
	} {
		if got := Classify("", false, tc.flags); got != tc.want {
			t.Errorf("Classify(no details, %#x) = %v, want %v", tc.flags, got, tc.want)
		}
	}
}

func TestResetReason(t *testing.T) {
	for details, want := range map[string]string{
		"upstream_reset_before_response_started{remote_connection_failure|tls_version_mismatch}": "remote_connection_failure",
		"upstream_reset_before_response_started{overflow}":                                       "overflow",
		"upstream_reset_before_response_started{connection_failure,delayed_connect_error:_111}":  "connection_failure",
		"upstream_reset_before_response_started{}":                                               "",
		"response_timeout": "",
	} {
		if got, _ := ResetReason(details, EarlyUpstreamReset); got != want {
			t.Errorf("ResetReason(%q) = %q, want %q", details, got, want)
		}
	}
}

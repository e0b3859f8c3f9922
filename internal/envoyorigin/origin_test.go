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
		// With the attempt count of a request that was not retried.
		if got := Classify(Signals{Details: tc.details, HasDetails: true, Flags: tc.flags, Attempts: 1, HasAttempts: true}); got != tc.want {
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
		if got := Classify(Signals{Flags: tc.flags, Attempts: 1, HasAttempts: true}); got != tc.want {
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

// TestClassifyEmptyDetails: only the router writes via_upstream; a filter's
// local reply carries whatever details it passed, "" included
// (filter_manager.cc sendLocalReply sets them as given; Wasm's
// sendLocalResponse and Go filters commonly pass ""). An empty value that
// arrived is no proof of the upstream.
func TestClassifyEmptyDetails(t *testing.T) {
	for _, flags := range []uint64{0, RateLimited, UpstreamConnectionFailure} {
		s := Signals{Details: "", HasDetails: true, Flags: flags, Attempts: 0, HasAttempts: true}
		if got := Classify(s); got != idem.OriginMaybeSent {
			t.Errorf("Classify(empty details, flags %#x) = %v, want maybe-sent", flags, got)
		}
	}
}

// TestClassifyAfterRouterRetries plays the ways router.cc ends a retried
// request. Each looks like a first attempt that never left, except for the
// attempt count.
func TestClassifyAfterRouterRetries(t *testing.T) {
	const connRefused = "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}"
	for _, tc := range []struct {
		name string
		s    Signals
		want idem.Origin
	}{
		// maybeRetryReset, RetryStatus::NoOverflow: the retry circuit breaker
		// refuses the retry of the last attempt's reset; the flag is
		// UpstreamOverflow beside the reset's own.
		{"retry overflow after a retried attempt",
			Signals{Details: connRefused, HasDetails: true, Flags: UpstreamConnectionFailure | UpstreamOverflow, Attempts: 2, HasAttempts: true},
			idem.OriginMaybeSent},
		{"retry overflow after the first attempt only",
			Signals{Details: connRefused, HasDetails: true, Flags: UpstreamConnectionFailure | UpstreamOverflow, Attempts: 1, HasAttempts: true},
			idem.OriginNotSent},
		// RetryStatus::No: the last reset is not retriable; no flag is added.
		{"last reset not retriable",
			Signals{Details: connRefused, HasDetails: true, Flags: UpstreamConnectionFailure, Attempts: 3, HasAttempts: true},
			idem.OriginMaybeSent},
		// doRetry finds no connection pool: sendNoHealthyUpstreamResponse
		// after attempt_count_ was incremented.
		{"retry finds no host",
			Signals{Details: "no_healthy_upstream", HasDetails: true, Flags: NoHealthyUpstream, Attempts: 2, HasAttempts: true},
			idem.OriginMaybeSent},
		// decodeHeaders finds no host before it sets the attempt count.
		{"no host before the first attempt",
			Signals{Details: "no_healthy_upstream", HasDetails: true, Flags: NoHealthyUpstream, Attempts: 0, HasAttempts: true},
			idem.OriginNotSent},
		{"flags only, retried",
			Signals{Flags: UpstreamConnectionFailure, Attempts: 2, HasAttempts: true},
			idem.OriginMaybeSent},
		// A filter after ext_proc answered: the router made no attempt.
		{"rate limited", Signals{Details: "request_rate_limited", HasDetails: true, Flags: RateLimited, Attempts: 0, HasAttempts: true},
			idem.OriginNotSent},
		// The upstream's own answer after retries is still its answer.
		{"upstream answer after retries",
			Signals{Details: ViaUpstream, HasDetails: true, Flags: UpstreamRetryLimitExceeded, Attempts: 3, HasAttempts: true},
			idem.OriginUpstream},
	} {
		if got := Classify(tc.s); got != tc.want {
			t.Errorf("%s: Classify(%+v) = %v, want %v", tc.name, tc.s, got, tc.want)
		}
	}
}

// TestClassifyWithoutAttemptCount: when the filter was not asked for
// upstream.request_attempt_count, an answer the router could have made
// after a retry is never released; answers made before the router ran
// still are.
func TestClassifyWithoutAttemptCount(t *testing.T) {
	for _, tc := range []struct {
		s    Signals
		want idem.Origin
	}{
		{Signals{Details: "upstream_reset_before_response_started{connection_timeout|connect_timeout}", HasDetails: true, Flags: UpstreamConnectionFailure}, idem.OriginMaybeSent},
		{Signals{Details: "upstream_reset_before_response_started{overflow}", HasDetails: true, Flags: UpstreamOverflow}, idem.OriginMaybeSent},
		{Signals{Details: "no_healthy_upstream", HasDetails: true, Flags: NoHealthyUpstream}, idem.OriginMaybeSent},
		{Signals{Flags: UpstreamConnectionFailure}, idem.OriginMaybeSent},
		{Signals{Flags: NoHealthyUpstream | UpstreamOverflow}, idem.OriginMaybeSent},
		{Signals{Details: "route_not_found", HasDetails: true, Flags: NoRouteFound}, idem.OriginNotSent},
		{Signals{Details: "local_rate_limited", HasDetails: true, Flags: RateLimited}, idem.OriginNotSent},
		{Signals{Details: "rbac_access_denied_matched_policy[none]", HasDetails: true}, idem.OriginNotSent},
		{Signals{Flags: RateLimited}, idem.OriginNotSent},
		{Signals{Details: ViaUpstream, HasDetails: true}, idem.OriginUpstream},
		{Signals{}, idem.OriginUpstream},
	} {
		if got := Classify(tc.s); got != tc.want {
			t.Errorf("Classify(%+v) = %v, want %v", tc.s, got, tc.want)
		}
	}
}

// TestMayHaveRetried: whether an earlier upstream attempt may have been
// sent, whatever the last one says.
func TestMayHaveRetried(t *testing.T) {
	for _, tc := range []struct {
		s    Signals
		want bool
	}{
		{Signals{Details: ViaUpstream, HasDetails: true, Attempts: 1, HasAttempts: true}, false},
		{Signals{Details: ViaUpstream, HasDetails: true, Attempts: 2, HasAttempts: true}, true},
		{Signals{Details: ViaUpstream, HasDetails: true, Flags: UpstreamRetryLimitExceeded, Attempts: 1, HasAttempts: true}, true},
		{Signals{Details: "request_rate_limited", HasDetails: true, Flags: RateLimited, Attempts: 0, HasAttempts: true}, false},
		// Without the count: every answer the router made may follow a
		// retry; a filter's before the router cannot.
		{Signals{Details: ViaUpstream, HasDetails: true}, true},
		{Signals{}, true},
		{Signals{Details: "upstream_reset_before_response_started{overflow}", HasDetails: true, Flags: UpstreamOverflow}, true},
		{Signals{Details: "local_rate_limited", HasDetails: true, Flags: RateLimited}, false},
		{Signals{Flags: RateLimited}, false},
	} {
		if got := tc.s.MayHaveRetried(); got != tc.want {
			t.Errorf("%+v: MayHaveRetried %v, want %v", tc.s, got, tc.want)
		}
	}
}

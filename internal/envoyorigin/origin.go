// Package envoyorigin tells who made a response from the signals Envoy's
// ext_proc filter sends with the response phase: the response.code_details
// and response.flags attributes (Envoy's CEL vocabulary,
// source/extensions/filters/common/expr/context.cc ResponseLookupValues:
// code_details is StreamInfo::responseCodeDetails(), flags is
// StreamInfo::legacyResponseFlags() as an int64).
//
// It also names the attributes the server asks the filter for
// (attributes.go). Every constant here is spelt as Envoy spells it; each
// cites the file it was read in (envoyproxy/envoy, main of 2026 and the
// 1.34-1.37 releases). The domain's meaning of an origin lives in
// internal/idem; only Envoy's facts live here.
package envoyorigin

import (
	"strings"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// Envoy's legacy response-flag bits, as response.flags carries them:
// StreamInfoImpl::legacyResponseFlags() (source/common/stream_info/
// stream_info_impl.h) sets bit n for CoreResponseFlag n, in the enum order of
// envoy/stream_info/stream_info.h; test/common/stream_info/
// stream_info_impl_test.cc LegacyResponseFlagTest pins each value.
const (
	FailedLocalHealthCheck           uint64 = 0x1
	NoHealthyUpstream                uint64 = 0x2
	UpstreamRequestTimeout           uint64 = 0x4
	LocalReset                       uint64 = 0x8
	UpstreamRemoteReset              uint64 = 0x10
	UpstreamConnectionFailure        uint64 = 0x20
	UpstreamConnectionTermination    uint64 = 0x40
	UpstreamOverflow                 uint64 = 0x80
	NoRouteFound                     uint64 = 0x100
	DelayInjected                    uint64 = 0x200
	FaultInjected                    uint64 = 0x400
	RateLimited                      uint64 = 0x800
	UnauthorizedExternalService      uint64 = 0x1000
	RateLimitServiceError            uint64 = 0x2000
	DownstreamConnectionTermination  uint64 = 0x4000
	UpstreamRetryLimitExceeded       uint64 = 0x8000
	StreamIdleTimeout                uint64 = 0x10000
	InvalidEnvoyRequestHeaders       uint64 = 0x20000
	DownstreamProtocolError          uint64 = 0x40000
	UpstreamMaxStreamDurationReached uint64 = 0x80000
	ResponseFromCacheFilter          uint64 = 0x100000
	NoFilterConfigFound              uint64 = 0x200000
	DurationTimeout                  uint64 = 0x400000
	UpstreamProtocolError            uint64 = 0x800000
	NoClusterFound                   uint64 = 0x1000000
	OverloadManager                  uint64 = 0x2000000
	DnsResolutionFailed              uint64 = 0x4000000
	DropOverLoad                     uint64 = 0x8000000
	DownstreamRemoteReset            uint64 = 0x10000000
	UnconditionalDropOverload        uint64 = 0x20000000
)

// notSentFlags are the flags Envoy sets only on paths where no byte of the
// request reached an upstream host: the router found nothing to send to
// (router.cc: NoRouteFound, NoClusterFound, NoHealthyUpstream, DropOverLoad,
// UnconditionalDropOverload), the connection pool never connected
// (streamResetReasonToResponseFlag: LocalConnectionFailure,
// RemoteConnectionFailure and ConnectionTimeout give
// UpstreamConnectionFailure; Overflow gives UpstreamOverflow), or a decoder
// filter before the router answered (fault_filter.cc abortWithStatus:
// FaultInjected; ratelimit.cc complete: RateLimited, RateLimitServiceError;
// local_ratelimit.cc: RateLimited; ext_authz.cc: UnauthorizedExternalService;
// health_check: FailedLocalHealthCheck).
const notSentFlags = FailedLocalHealthCheck | NoHealthyUpstream | UpstreamConnectionFailure |
	UpstreamOverflow | NoRouteFound | FaultInjected | RateLimited | UnauthorizedExternalService |
	RateLimitServiceError | NoClusterFound | DropOverLoad | UnconditionalDropOverload

// Response code details: StreamInfo::ResponseCodeDetailValues
// (envoy/stream_info/stream_info.h) and the filters' own RcDetails.
const (
	ViaUpstream        = "via_upstream"
	EarlyUpstreamReset = "upstream_reset_before_response_started"
	LateUpstreamReset  = "upstream_reset_after_response_started"
)

// notSentDetails are whole details values Envoy writes only when the request
// never reached the router's upstream request.
var notSentDetails = map[string]bool{
	// envoy/stream_info/stream_info.h ResponseCodeDetailValues, set by the
	// router (router.cc decodeHeaders) or the connection manager before any
	// upstream request exists.
	"route_configuration_not_found": true,
	"route_not_found":               true,
	"direct_response":               true,
	"cluster_not_found":             true,
	"maintenance_mode":              true,
	"drop_overload":                 true,
	"unconditional_drop_overload":   true,
	"no_healthy_upstream":           true,
	"overload":                      true,
	// A decoding filter's buffer overflowed (filter_manager.cc
	// requestDataTooLarge); the router's own retry buffer reports
	// request_payload_exceeded_retry_buffer_limit instead, which is not here.
	"request_payload_too_large": true,
	// Local replies of decoder filters that run after ext_proc and before the
	// router: source/extensions/filters/http/ratelimit/ratelimit.cc
	// RcDetailsValues; local_ratelimit/local_ratelimit.cc (sendLocalReply
	// details "local_rate_limited", test FilterTest.RequestRateLimited);
	// ext_authz/ext_authz.cc and filters/common/ext_authz/ext_authz.h
	// ResponseCodeDetailsValues; fault/fault_filter.cc RcDetailsValues
	// (test FaultFilterTest.AbortWithHttpStatus).
	"request_rate_limited": true,
	"rate_limiter_error":   true,
	"local_rate_limited":   true,
	"ext_authz_denied":     true,
	"ext_authz_error":      true,
	"ext_authz_invalid":    true,
	"fault_filter_abort":   true,
}

// RBACDeniedPrefix starts RBAC's details, "rbac_access_denied_matched_policy[<policy id, spaces as _>]"
// (source/extensions/filters/common/rbac/utility.cc responseDetail; test
// test/extensions/filters/common/rbac/utility_test.cc ResponseDetail).
const RBACDeniedPrefix = "rbac_access_denied_matched_policy["

// notSentResets are the reset reasons, as resetReasonToString
// (source/common/http/utility.cc) spells them with spaces replaced by "_"
// (router.cc Filter::onUpstreamReset: StringUtil::replaceAllEmptySpace),
// for which the connection pool never handed the request to a connection:
// the connection failed or timed out, or the circuit breaker refused it.
// router_test.cc PoolFailureWithPriority expects
// "upstream_reset_before_response_started{remote_connection_failure|tls_version_mismatch}",
// PoolFailureDueToConnectTimeout
// "upstream_reset_before_response_started{connection_timeout|connect_timeout}".
// "connection_failure" is the single reason of releases before the
// local/remote split (Http::StreamResetReason::ConnectionFailure).
var notSentResets = map[string]bool{
	"local_connection_failure":  true,
	"remote_connection_failure": true,
	"connection_timeout":        true,
	"overflow":                  true,
	"connection_failure":        true,
}

// ResetReason returns the reason inside Envoy's reset details,
// "<prefix>{<reason>[|<transport failure reason>]}", and whether details
// has that form. The transport failure reason may itself hold "|" and ":"
// ("immediate_connect_error:_Network_is_unreachable|remote_address:[…]:80"),
// so only the first "|" ends the reason. Releases before 1.3x joined the
// transport reason with ","; that form is read too.
func ResetReason(details, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(details, prefix+"{")
	if !ok || !strings.HasSuffix(rest, "}") {
		return "", false
	}
	rest = rest[:len(rest)-1]
	if i := strings.IndexAny(rest, "|,"); i >= 0 {
		rest = rest[:i]
	}
	return rest, rest != ""
}

// Signals are what the filter sends about a response in the response
// phase's attributes. The Has fields say whether the attribute arrived at
// all: Envoy leaves out an attribute the filter was not asked for
// (ExpressionManager::evaluateAttributes in ext_proc's matching_utils.cc).
type Signals struct {
	// Details is response.code_details: StreamInfo::responseCodeDetails().
	Details    string
	HasDetails bool
	// Flags is response.flags: StreamInfo::legacyResponseFlags().
	Flags uint64
	// Attempts is upstream.request_attempt_count: StreamInfo::attemptCount(),
	// 0 when the router never set it (context.cc UpstreamLookupValues:
	// CreateUint64(attemptCount().value_or(0))).
	Attempts    uint64
	HasAttempts bool
}

// Classify tells who made a response. The details decide when present;
// the flags are the fallback. A response whose details and flags are both
// absent is taken as the upstream's, as it is in the common case: the
// caller must make that loud (the filter was not asked for
// response_attributes). Details that arrived empty are not the router's:
// only the router writes via_upstream (router.cc onUpstreamHeaders), and a
// filter's sendLocalReply stores whatever details it passes, "" included,
// so an empty value proves nothing and stays maybe-sent. Anything
// unrecognised stays maybe-sent: never release on a guess.
//
// Details and flags describe the last upstream attempt only (router.cc
// onUpstreamReset and onUpstreamAbort run for the attempt that ended the
// request), and the router ends a retried request in ways that look like
// a first attempt that never left: retries exhausted sets
// UpstreamRetryLimitExceeded, but a retry the circuit breaker refuses
// (maybeRetryReset, RetryStatus::NoOverflow) sets UpstreamOverflow, a last
// reset that is not retriable (RetryStatus::No) sets nothing, and a retry
// that finds no host (doRetry → sendNoHealthyUpstreamResponse) says
// no_healthy_upstream. So a not-sent origin is demoted to maybe-sent when
// the router made more than one attempt (Attempts > 1: doRetry increments
// attempt_count_ before it looks for a host), when the retry limit flag is
// set, or, without the attempt count, whenever the router itself could
// have made that answer after a retry.
func Classify(s Signals) idem.Origin {
	o := classify(s.Details, s.HasDetails, s.Flags)
	if o == idem.OriginNotSent && s.MayHaveRetried() {
		return idem.OriginMaybeSent
	}
	return o
}

// MayHaveRetried reports whether the router may have made more than one
// upstream attempt for this request, so that an earlier one may have
// reached the upstream whatever the last one says: the retry limit flag
// is set, or the attempt count is above 1, or, without the count, the
// router made this answer (the upstream's own, or a failure it can make
// after a retry). Answers made before the router ran are never retried.
func (s Signals) MayHaveRetried() bool {
	switch {
	case s.Flags&UpstreamRetryLimitExceeded != 0:
		return true
	case s.HasAttempts:
		return s.Attempts > 1
	}
	return routerMayHaveRetried(s)
}

// retryEndings are the flags the router sets on a not-sent ending that
// can follow a retry: a connection failure or overflow of the last attempt
// (streamResetReasonToResponseFlag), the retry circuit breaker's refusal
// (maybeRetryReset: UpstreamOverflow) and a retry without a host
// (sendNoHealthyUpstreamResponse: NoHealthyUpstream).
const retryEndings = NoHealthyUpstream | UpstreamConnectionFailure | UpstreamOverflow

// routerMayHaveRetried reports whether an answer could be the router's
// after a retry: the upstream's own (via_upstream, or no flag without
// details), an early upstream reset, or no_healthy_upstream (which doRetry
// gives too). Answers made before the router ran (no route,
// direct_response, maintenance mode, drop overload, the local replies of
// filters) come before any attempt and cannot follow a retry; the router's
// other failures are maybe-sent already.
func routerMayHaveRetried(s Signals) bool {
	if s.HasDetails {
		_, reset := ResetReason(s.Details, EarlyUpstreamReset)
		return reset || s.Details == "no_healthy_upstream" || s.Details == ViaUpstream
	}
	return s.Flags == 0 || s.Flags&retryEndings != 0
}

func classify(details string, hasDetails bool, flags uint64) idem.Origin {
	if hasDetails {
		switch {
		case details == ViaUpstream:
			return idem.OriginUpstream
		case notSentDetails[details], strings.HasPrefix(details, RBACDeniedPrefix):
			return idem.OriginNotSent
		}
		if r, ok := ResetReason(details, EarlyUpstreamReset); ok && notSentResets[r] {
			return idem.OriginNotSent
		}
		return idem.OriginMaybeSent
	}
	switch {
	case flags == 0:
		return idem.OriginUpstream
	case flags&^notSentFlags == 0:
		return idem.OriginNotSent
	}
	return idem.OriginMaybeSent
}

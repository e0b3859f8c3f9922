package idem

import "strings"

// Origin says who made a response, which decides what it proves about the
// operation's effect.
type Origin uint8

const (
	// OriginUpstream: the application answered; its answer is a real one.
	OriginUpstream Origin = iota + 1
	// OriginNotSent: Envoy answered and the request provably never left it
	// (no route, no healthy host, connect failure, overflow).
	OriginNotSent
	// OriginMaybeSent: Envoy answered after the request may have reached
	// the upstream (timeout, reset): the effect may have happened.
	OriginMaybeSent
)

func (o Origin) String() string {
	switch o {
	case OriginUpstream:
		return "upstream"
	case OriginNotSent:
		return "not_sent"
	case OriginMaybeSent:
		return "maybe_sent"
	}
	return "invalid"
}

// Action is what happens to a reserved record once a response is known.
type Action uint8

const (
	// ActionStore completes the record with the response.
	ActionStore Action = iota + 1
	// ActionRelease deletes the record so a retry runs the operation.
	ActionRelease
	// ActionUnknown marks the outcome unknown.
	ActionUnknown
)

func (a Action) String() string {
	switch a {
	case ActionStore:
		return "store"
	case ActionRelease:
		return "release"
	case ActionUnknown:
		return "unknown"
	}
	return "invalid"
}

// ParseAction reads an action's configuration name.
func ParseAction(s string) (Action, bool) {
	for _, a := range [...]Action{ActionStore, ActionRelease, ActionUnknown} {
		if a.String() == s {
			return a, true
		}
	}
	return 0, false
}

// notSentDetails are Envoy response code details (or their prefixes) that
// Envoy sets only when no byte of the request reached an upstream host.
// They are the values Envoy's StreamInfo::ResponseCodeDetails defines
// (envoy/stream_info/stream_info.h) for those paths.
var notSentDetails = []string{
	"route_not_found",
	"cluster_not_found",
	"no_healthy_upstream",
	"maintenance_mode",
	"direct_response",
	"upstream_reset_before_response_started{overflow",
	"upstream_reset_before_response_started{connection_failure",
	"upstream_reset_before_response_started{connection_timeout",
	"drop_overload",
	"overload",
}

// Envoy's legacy response-flag bits, as the response.flags attribute
// carries them (a CEL int: StreamInfo::legacyResponseFlags(), in the
// CoreResponseFlag order of envoy/stream_info/stream_info.h).
const (
	FlagFailedLocalHealthCheck    uint64 = 1 << 0
	FlagNoHealthyUpstream         uint64 = 1 << 1
	FlagUpstreamRequestTimeout    uint64 = 1 << 2
	FlagLocalReset                uint64 = 1 << 3
	FlagUpstreamRemoteReset       uint64 = 1 << 4
	FlagUpstreamConnectionFailure uint64 = 1 << 5
	FlagUpstreamConnTermination   uint64 = 1 << 6
	FlagUpstreamOverflow          uint64 = 1 << 7
	FlagNoRouteFound              uint64 = 1 << 8
	FlagNoClusterFound            uint64 = 1 << 24
	FlagDropOverload              uint64 = 1 << 27
)

// notSentFlags are the flags Envoy sets only when the request never left
// it.
const notSentFlags = FlagFailedLocalHealthCheck | FlagNoHealthyUpstream | FlagUpstreamConnectionFailure |
	FlagUpstreamOverflow | FlagNoRouteFound | FlagNoClusterFound | FlagDropOverload

// ClassifyOrigin tells who made a response from the response.code_details
// and response.flags attributes Envoy sends when asked through
// response_attributes. The details decide when present; the flags are the
// fallback.
//
// With neither (Envoy not configured to send them) a response is taken to
// be the upstream's: that is what it is in the common case, and Envoy 1.34
// to 1.36 do not pass their own local replies through ext_proc at all
// (DESIGN §4). Configure both attributes so that Envoy's own timeouts are
// told apart.
func ClassifyOrigin(codeDetails string, flags uint64) Origin {
	switch {
	case codeDetails == "via_upstream":
		return OriginUpstream
	case codeDetails != "":
		for _, d := range notSentDetails {
			if strings.HasPrefix(codeDetails, d) {
				return OriginNotSent
			}
		}
		return OriginMaybeSent
	case flags == 0:
		return OriginUpstream
	case flags&^notSentFlags == 0:
		return OriginNotSent
	}
	return OriginMaybeSent
}

// ResponseRule maps responses of one origin and status range to an action.
type ResponseRule struct {
	Origin Origin
	// MinStatus and MaxStatus bound the status, both inclusive.
	MinStatus, MaxStatus int
	Action               Action
}

// DefaultResponseRules are DESIGN §4's defaults: store the application's
// answers, but release on the statuses that ask the client to retry (408,
// 425, 429) and on Envoy replies that prove the request was never sent;
// Envoy replies after the request may have been sent are unknown.
func DefaultResponseRules() []ResponseRule {
	return []ResponseRule{
		{Origin: OriginUpstream, MinStatus: 408, MaxStatus: 408, Action: ActionRelease},
		{Origin: OriginUpstream, MinStatus: 425, MaxStatus: 425, Action: ActionRelease},
		{Origin: OriginUpstream, MinStatus: 429, MaxStatus: 429, Action: ActionRelease},
		{Origin: OriginUpstream, MinStatus: 100, MaxStatus: 599, Action: ActionStore},
		{Origin: OriginNotSent, MinStatus: 0, MaxStatus: 999, Action: ActionRelease},
		{Origin: OriginMaybeSent, MinStatus: 0, MaxStatus: 999, Action: ActionUnknown},
	}
}

// DecideResponse returns the first matching rule's action. A response no
// rule covers is unknown: when in doubt, never allow a second execution.
func DecideResponse(rules []ResponseRule, origin Origin, status int) Action {
	for _, r := range rules {
		if r.Origin == origin && status >= r.MinStatus && status <= r.MaxStatus {
			return r.Action
		}
	}
	return ActionUnknown
}

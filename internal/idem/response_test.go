package idem

import "testing"

func TestClassifyOrigin(t *testing.T) {
	for details, want := range map[string]Origin{
		"":             OriginUpstream, // attribute not configured
		"via_upstream": OriginUpstream,
		"upstream_reset_before_response_started{connection_failure}":                                           OriginNotSent,
		"upstream_reset_before_response_started{connection_failure,delayed_connect_error:_Connection_refused}": OriginNotSent,
		"upstream_reset_before_response_started{overflow}":                                                     OriginNotSent,
		"no_healthy_upstream":      OriginNotSent,
		"route_not_found":          OriginNotSent,
		"cluster_not_found":        OriginNotSent,
		"direct_response":          OriginNotSent,
		"response_timeout":         OriginMaybeSent,
		"upstream_per_try_timeout": OriginMaybeSent,
		"upstream_reset_before_response_started{remote_reset}":           OriginMaybeSent,
		"upstream_reset_before_response_started{connection_termination}": OriginMaybeSent,
		"upstream_reset_after_response_started{remote_reset}":            OriginMaybeSent,
		"something_new_in_a_later_envoy":                                 OriginMaybeSent,
	} {
		if got := ClassifyOrigin(details, 0); got != want {
			t.Errorf("ClassifyOrigin(%q) = %v, want %v", details, got, want)
		}
	}
}

func TestClassifyOriginByFlags(t *testing.T) {
	for _, tc := range []struct {
		details string
		flags   uint64
		want    Origin
	}{
		{"", 0, OriginUpstream},
		{"", FlagUpstreamConnectionFailure, OriginNotSent},
		{"", FlagNoHealthyUpstream | FlagUpstreamOverflow, OriginNotSent},
		{"", FlagUpstreamRequestTimeout, OriginMaybeSent},
		{"", FlagUpstreamConnectionFailure | FlagUpstreamRemoteReset, OriginMaybeSent},
		{"via_upstream", FlagUpstreamRequestTimeout, OriginUpstream}, // the details decide
		{"response_timeout", 0, OriginMaybeSent},
	} {
		if got := ClassifyOrigin(tc.details, tc.flags); got != tc.want {
			t.Errorf("ClassifyOrigin(%q, %#x) = %v, want %v", tc.details, tc.flags, got, tc.want)
		}
	}
}

func TestDefaultResponseRules(t *testing.T) {
	rules := DefaultResponseRules()
	for _, tc := range []struct {
		origin Origin
		status int
		want   Action
	}{
		{OriginUpstream, 200, ActionStore},
		{OriginUpstream, 201, ActionStore},
		{OriginUpstream, 302, ActionStore},
		{OriginUpstream, 400, ActionStore},
		{OriginUpstream, 404, ActionStore},
		{OriginUpstream, 408, ActionRelease},
		{OriginUpstream, 409, ActionStore},
		{OriginUpstream, 425, ActionRelease},
		{OriginUpstream, 429, ActionRelease},
		{OriginUpstream, 500, ActionStore},
		{OriginUpstream, 503, ActionStore},
		{OriginUpstream, 0, ActionUnknown}, // a response without a status is not understood
		{OriginNotSent, 503, ActionRelease},
		{OriginMaybeSent, 504, ActionUnknown},
		{OriginMaybeSent, 503, ActionUnknown},
	} {
		if got := DecideResponse(rules, tc.origin, tc.status); got != tc.want {
			t.Errorf("DecideResponse(%v, %d) = %v, want %v", tc.origin, tc.status, got, tc.want)
		}
	}
}

func TestParseAction(t *testing.T) {
	for _, a := range []Action{ActionStore, ActionRelease, ActionUnknown} {
		got, ok := ParseAction(a.String())
		if !ok || got != a {
			t.Errorf("ParseAction(%q) = %v, %v", a.String(), got, ok)
		}
	}
	if _, ok := ParseAction("keep"); ok {
		t.Error("ParseAction accepted an unknown action")
	}
}

package idem

import "testing"

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

// TestEnumName: a value past an enum's table takes its first name, which
// is "invalid" for the enums that count from one.
func TestEnumName(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Origin(0).String(), "invalid"},
		{OriginMaybeSent.String(), "maybe_sent"},
		{(OriginMaybeSent + 1).String(), "invalid"},
		{HandedOver.String(), "handed_over"},
		{(HandedOver + 1).String(), "invalid"},
		{EnumName(uint8(255), "default", "other"), "default"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

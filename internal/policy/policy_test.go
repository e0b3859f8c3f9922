package policy

import (
	"slices"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// TestDefaultPolicyIsTheContract pins the default policy, which a binary
// started with no policy file runs (docs/design.md §3, docs/configuration.md,
// "The default policy"): literal values, not the constants they
// are built from, so that changing a constant fails here.
func TestDefaultPolicyIsTheContract(t *testing.T) {
	p := Default()
	checks := []struct {
		name      string
		got, want any
	}{
		{"methods", p.Match.Methods, []string{"POST", "PATCH"}},
		{"key header", p.KeyHeader, "idempotency-key"},
		{"key required", p.KeyRequired, false},
		{"scope", p.Scope.Source, ScopeAuthority},
		{"retention", p.Retention, 24 * time.Hour},
		{"lease", p.Lease, 30 * time.Second},
		{"retry-after", p.RetryAfter, time.Second},
		{"max stored body", p.MaxStoredBody, 1 << 20},
		{"failure mode", p.FailureMode, FailClosed},
		{"fingerprint headers", p.FingerprintHeaders, []string{"content-type"}},
		{"fingerprint json", p.FingerprintJSON, false},
		{"stream reset", p.OnStreamReset, idem.ActionUnknown},
		{"lease expiry", p.LeaseExpiry, idem.LeaseExpiryUnknown},
		{"enforcement", p.Enforcement, EnforcementEnforce},
		{"wait for in flight", p.WaitForInFlight, time.Duration(0)},
		{"encrypt", p.Encrypt, false},
	}
	for _, c := range checks {
		equal := false
		switch want := c.want.(type) {
		case []string:
			equal = slices.Equal(c.got.([]string), want)
		default:
			equal = c.got == c.want
		}
		if !equal {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if p.Match.Hosts != nil || p.Match.RouteNames != nil || p.Match.PathExact != "" || p.Match.PathPrefix != "" ||
		p.Match.PathRegex != nil {
		t.Errorf("the default policy matches by method only: %+v", p.Match)
	}
}

package policy

import (
	"slices"
	"strings"
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

// TestDefaultCompresses: the built-in policy compresses answers with the
// built-in dictionary and expands them back.
func TestDefaultCompresses(t *testing.T) {
	c := Default().Compression.Codec
	if c == nil {
		t.Fatal("the default policy has no compression codec")
	}
	r := idem.Response{Status: 201, Body: []byte(strings.Repeat(`{"id":"ord_1","status":"created"},`, 20))}
	z := c.Compress(r)
	if !z.Compressed || len(z.Body) >= len(r.Body) {
		t.Fatalf("not compressed: %d bytes", len(z.Body))
	}
	back, err := c.Expand(z, 1<<20)
	if err != nil || string(back.Body) != string(r.Body) {
		t.Fatalf("expand: %v", err)
	}
}

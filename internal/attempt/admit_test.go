package attempt

import (
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// adoption counts Requested calls by whether a key came.
type adoption struct {
	idem.NopObserver
	withKey, without int
}

func (o *adoption) Requested(_ string, withKey bool) {
	if withKey {
		o.withKey++
	} else {
		o.without++
	}
}

// TestAdmissionTable is docs/design.md §3's first table, the rows about
// the policy and the key: what is decided before any store call.
func TestAdmissionTable(t *testing.T) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	optional := policy.Default()
	optional.KeyRequired = false
	required := policy.Default()
	required.KeyRequired = true
	grace := policy.Default()
	grace.KeyRequired, grace.KeyWarnUntil = true, now.Add(time.Hour)
	graceOver := policy.Default()
	graceOver.KeyRequired, graceOver.KeyWarnUntil = true, now.Add(-time.Hour)
	off := policy.Default()
	off.Enforcement = policy.EnforcementOff
	for _, tc := range []struct {
		name     string
		pol      *policy.Policy
		raw      string
		lines    int
		want     admission
		slug     string // the problem's, for admitRefused
		key      string // for admitKeyed
		bypassed bool   // reported DecisionBypassed
	}{
		{"enforcement off", off, "k", 1, admitBypass, "", "", true},
		{"no key, optional", optional, "", 0, admitBypass, "", "", true},
		{"no key, required, in grace", grace, "", 0, admitGrace, "", "", false},
		{"no key, required, grace over", graceOver, "", 0, admitRefused, problem.KeyMissing.Slug, "", false},
		{"no key, required", required, "", 0, admitRefused, problem.KeyMissing.Slug, "", false},
		{"key on two lines", required, "a", 2, admitRefused, problem.KeyInvalid.Slug, "", false},
		{"key malformed", required, "a,b", 1, admitRefused, problem.KeyInvalid.Slug, "", false},
		{"key valid", required, `"order-1"`, 1, admitKeyed, "", "order-1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &adoption{}
			rep := &reporter{}
			a := New(&Server{Observer: obs}, rep)
			a.Policy = tc.pol
			got, key, prob := a.admitKey(tc.raw, tc.lines, now)
			if got != tc.want || key != tc.key {
				t.Fatalf("admission %v key %q, want %v %q", got, key, tc.want, tc.key)
			}
			if (prob != nil) != (tc.slug != "") || (prob != nil && prob.Slug != tc.slug) {
				t.Fatalf("problem %+v, want %q", prob, tc.slug)
			}
			if b := len(rep.decisions) == 1 && rep.decisions[0] == idem.DecisionBypassed; b != tc.bypassed || len(rep.decisions) > 1 {
				t.Fatalf("decisions %v, want bypassed %v", rep.decisions, tc.bypassed)
			}
			if obs.withKey+obs.without != 1 || (obs.withKey == 1) != (tc.lines > 0) {
				t.Fatalf("adoption counted %+v", obs)
			}
		})
	}
}

// TestAdmitNamesTheRecord: the record's id is the policy's namespace, the
// scope and the key, so two scopes never share a record.
func TestAdmitNamesTheRecord(t *testing.T) {
	a := New(&Server{}, &reporter{})
	a.Policy = policy.Default()
	a.admit("tenant-a", false, "k")
	b := New(&Server{}, &reporter{})
	b.Policy = policy.Default()
	b.admit("tenant-b", false, "k")
	if a.ID == b.ID || a.ID != idem.RecordIDFor(a.Policy.RecordNamespace(), "tenant-a", "k") || a.Scope != "tenant-a" {
		t.Fatalf("ids %s %s", a.ID, b.ID)
	}
}

// TestAdmitScopeTable is §3's "scope source yields nothing" row: a policy
// scoped by a header, metadata or the peer's identity refuses a request
// without one; scoped by authority or not at all, an empty scope is a
// scope.
func TestAdmitScopeTable(t *testing.T) {
	for _, tc := range []struct {
		source  policy.ScopeSource
		scope   string
		refused bool
	}{
		{policy.ScopeNone, "", false},
		{policy.ScopeAuthority, "", false},
		{policy.ScopeHeader, "", true},
		{policy.ScopeMetadata, "", true},
		{policy.ScopePrincipal, "", true},
		{policy.ScopePrincipal, "spiffe://orders", false},
	} {
		a := New(&Server{}, &reporter{})
		a.Policy = policy.Default()
		a.Policy.Scope = policy.Scope{Source: tc.source}
		_, required := a.scopeOf(a.Policy, facts{})
		prob := a.admit(tc.scope, required, "k")
		if (prob != nil) != tc.refused || (prob != nil && prob.Slug != problem.PrincipalMissing.Slug) {
			t.Errorf("source %v scope %q: problem %v, want refused %v", tc.source, tc.scope, prob, tc.refused)
		}
		if (a.ID == "") != tc.refused {
			t.Errorf("source %v scope %q: record %q", tc.source, tc.scope, a.ID)
		}
	}
}

// facts are a request's facts as a test gives them (Facts): headers by
// name, one line each, and nothing else.
type facts struct {
	target  policy.Request
	headers map[string]string
}

func (f facts) Target() policy.Request { return f.target }

func (f facts) Header(name string) (string, int) {
	v, ok := f.headers[name]
	if !ok {
		return "", 0
	}
	return v, 1
}

func (f facts) Headers(names []string) []idem.Header {
	var hs []idem.Header
	for _, n := range names {
		if v, ok := f.headers[n]; ok {
			hs = append(hs, idem.Header{Name: n, Value: v})
		}
	}
	return hs
}

func (facts) HeadersPrefixed(string) []idem.Header    { return nil }
func (facts) Metadata(string, []string) string        { return "" }
func (facts) Peer(string, policy.PeerIdentity) string { return "" }

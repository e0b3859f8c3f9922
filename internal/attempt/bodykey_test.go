package attempt

import (
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

func ptr(t *testing.T, s string) jsonpointer.Pointer {
	t.Helper()
	p, err := jsonpointer.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAdmitKeyFromBody: key.from body, derived and a list of sources, with
// key.required deciding when no source yields a key.
func TestAdmitKeyFromBody(t *testing.T) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	body := func(required bool) *policy.Policy {
		p := policy.Default()
		p.KeyRequired = required
		p.KeySources = []policy.KeySource{policy.KeyFromBody}
		p.KeyPointer = ptr(t, "/idempotency_key")
		return p
	}
	derived := func(required bool, sources ...policy.KeySource) *policy.Policy {
		p := policy.Default()
		p.KeyRequired = required
		p.KeySources = sources
		p.KeyDerive = []jsonpointer.Pointer{ptr(t, "/params/name"), ptr(t, "/params/arguments")}
		return p
	}
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send_email","arguments":{"to":"a"}}}`
	for _, tc := range []struct {
		name         string
		pol          *policy.Policy
		in           keyInput
		want         admission
		slug         string
		detail       string // in the problem's detail
		key          string
		derivedSpace bool
	}{
		{"body key", body(true), keyInput{body: []byte(`{"idempotency_key":"k-1","amount":5}`)}, admitKeyed, "", "", "k-1", false},
		{"body key with a comma is one key", body(true), keyInput{body: []byte(`{"idempotency_key":"a,b"}`)}, admitKeyed, "", "", "a,b", false},
		{"body key missing, required", body(true), keyInput{body: []byte(`{"amount":5}`)}, admitRefused, problem.KeyMissing.Slug, "/idempotency_key", "", false},
		{"body key missing, optional", body(false), keyInput{body: []byte(`{"amount":5}`)}, admitBypass, "", "", "", false},
		{"body not an object, required", body(true), keyInput{body: []byte(`"k-1"`)}, admitRefused, problem.KeyMissing.Slug, "not a JSON object", "", false},
		{"no body, required", body(true), keyInput{}, admitRefused, problem.KeyMissing.Slug, "/idempotency_key", "", false},
		{"body not an object, optional", body(false), keyInput{body: []byte(`"k-1"`)}, admitBypass, "", "", "", false},
		{"no body, optional", body(false), keyInput{body: []byte(" ")}, admitBypass, "", "", "", false},
		// A body that cannot be read may hold the key: refused, required or not.
		{"body not JSON, required", body(true), keyInput{body: []byte(`idempotency_key=k-1`)}, admitRefused, problem.BodyUnreadable.Slug, "cannot be read", "", false},
		{"body not JSON, optional", body(false), keyInput{body: []byte(`idempotency_key=k-1`)}, admitRefused, problem.BodyUnreadable.Slug, "cannot be read", "", false},
		{"body not UTF-8, optional", body(false), keyInput{body: []byte("{\"idempotency_key\":\"k-1\",\"n\":\"\xff\"}")}, admitRefused, problem.BodyUnreadable.Slug, "UTF-8", "", false},
		{"body key not a string, required", body(true), keyInput{body: []byte(`{"idempotency_key":7}`)}, admitRefused, problem.KeyInvalid.Slug, "/idempotency_key", "", false},
		{"body key not a string, optional", body(false), keyInput{body: []byte(`{"idempotency_key":7}`)}, admitBypass, "", "", "", false},
		{"body key too long", body(false), keyInput{body: []byte(`{"idempotency_key":"` + strings.Repeat("k", 256) + `"}`)}, admitRefused, problem.KeyInvalid.Slug, "/idempotency_key", "", false},
		{"body key not visible ASCII", body(false), keyInput{body: []byte(`{"idempotency_key":"a b"}`)}, admitRefused, problem.KeyInvalid.Slug, "/idempotency_key", "", false},
		{"body key empty", body(false), keyInput{body: []byte(`{"idempotency_key":""}`)}, admitRefused, problem.KeyInvalid.Slug, "empty", "", false},
		{"duplicate member", body(false), keyInput{body: []byte(`{"idempotency_key":"a","idempotency_key":"b"}`)}, admitRefused, problem.BodyUnreadable.Slug, "duplicate", "", false},
		{"derived, deep body, optional", derived(false, policy.KeyFromDerived), keyInput{body: []byte(`{"params":{"name":"a","arguments":` + strings.Repeat("[", 250) + strings.Repeat("]", 250) + `}}`)}, admitRefused, problem.BodyUnreadable.Slug, "nested deeper", "", false},
		{"header first, body unread", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), keyInput{headerRaw: "h-2", headerLines: 1, body: []byte(`{"a":1,"a":2}`)}, admitKeyed, "", "", "h-2", false},
		{"derived", derived(true, policy.KeyFromDerived), keyInput{body: []byte(call)}, admitKeyed, "", "", "", true},
		{"derived, no member", derived(true, policy.KeyFromDerived), keyInput{body: []byte(`{"id":1,"method":"x"}`)}, admitRefused, problem.KeyMissing.Slug, "/params/name", "", false},
		{"header first", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), keyInput{headerRaw: "h-1", headerLines: 1, body: []byte(call)}, admitKeyed, "", "", "h-1", false},
		{"no header: derived", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), keyInput{body: []byte(call)}, admitKeyed, "", "", "", true},
		{"header malformed is refused, not derived", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), keyInput{headerRaw: "a,b", headerLines: 1, body: []byte(call)}, admitRefused, problem.KeyInvalid.Slug, "", "", false},
		{"nothing at all, required", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), keyInput{body: []byte(`[1]`)}, admitRefused, problem.KeyMissing.Slug, "no idempotency-key header", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &adoption{}
			a := New(&Server{Observer: obs}, &reporter{})
			a.Policy = tc.pol
			got, key, prob := a.admitKeyFrom(tc.in, now)
			if got != tc.want || (tc.key != "" && key != tc.key) {
				t.Fatalf("admission %v key %q, want %v %q", got, key, tc.want, tc.key)
			}
			if (prob != nil) != (tc.slug != "") || (prob != nil && (prob.Slug != tc.slug || !strings.Contains(prob.Detail, tc.detail))) {
				t.Fatalf("problem %+v, want %q with %q", prob, tc.slug, tc.detail)
			}
			if obs.withKey+obs.without != 1 {
				t.Fatalf("adoption counted %+v", obs)
			}
			if got != admitKeyed {
				return
			}
			if tc.derivedSpace != (a.keySource == policy.KeyFromDerived) {
				t.Fatalf("key source %v", a.keySource)
			}
			if tc.derivedSpace && (len(key) != 64 || strings.Contains(key, "send_email")) {
				t.Fatalf("derived key %q is not a hash", key)
			}
			a.admit("scope", false, key)
			want := idem.RecordIDFor(tc.pol.RecordNamespace(), "scope", key)
			if tc.derivedSpace {
				want = idem.RecordIDFor(tc.pol.RecordNamespace()+policy.DerivedNamespaceSuffix, "scope", key)
			}
			if a.ID != want {
				t.Fatalf("record %s, want %s", a.ID, want)
			}
		})
	}
}

// TestDerivedKeyReadsOnlyItsMembers: a new JSON-RPC id, another member
// order or white space leave the derived key alone; a changed argument or
// a member that turns from absent to null changes it; and it never equals
// the record of a client key with the same text.
func TestDerivedKeyReadsOnlyItsMembers(t *testing.T) {
	members := []jsonpointer.Pointer{ptr(t, "/params/name"), ptr(t, "/params/arguments")}
	key := func(body string) string {
		t.Helper()
		k, miss, err := derivedKey(members, []byte(body))
		if miss != nil || err != nil {
			t.Fatalf("%s: %v %v", body, miss, err)
		}
		return k
	}
	base := key(`{"id":1,"method":"tools/call","params":{"name":"send","arguments":{"to":"a","n":1}}}`)
	if k := key(`{"params":{"arguments":{"n":1, "to":"a"},"name":"send"},"method":"tools/call","id":"retry-2"}`); k != base {
		t.Error("a new id or member order changed the derived key")
	}
	if k := key(`{"id":1,"method":"tools/call","params":{"name":"send","arguments":{"to":"b","n":1}}}`); k == base {
		t.Error("a changed argument kept the derived key")
	}
	absent := key(`{"id":1,"params":{"name":"send"}}`)
	null := key(`{"id":1,"params":{"name":"send","arguments":null}}`)
	if absent == null {
		t.Error("an absent member and a null one derive the same key")
	}
	p := policy.Default()
	a := New(&Server{}, &reporter{})
	a.Policy, a.keySource = p, policy.KeyFromDerived
	a.admit("s", false, base)
	b := New(&Server{}, &reporter{})
	b.Policy = p
	b.admit("s", false, base) // a client sending the derived key's text as its own key
	if a.ID == b.ID {
		t.Fatal("a derived key shares the record of a client key of the same text")
	}
}

// TestAdmitUnreadable: a body that cannot be read under a policy with body
// criteria is refused unless the policy would pass the request whatever
// its body said.
func TestAdmitUnreadable(t *testing.T) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	pol := func(required bool, enf policy.Enforcement, sources ...policy.KeySource) *policy.Policy {
		p := policy.Default()
		p.KeyRequired, p.Enforcement, p.KeySources = required, enf, sources
		if len(sources) > 0 && sources[len(sources)-1] == policy.KeyFromDerived {
			p.KeyDerive = []jsonpointer.Pointer{ptr(t, "/params")}
		}
		return p
	}
	grace := pol(true, policy.EnforcementEnforce)
	grace.KeyWarnUntil = now.Add(time.Hour)
	cause := policy.ErrBodyUnreadable
	for _, tc := range []struct {
		name        string
		pol         *policy.Policy
		headerLines int
		want        admission
	}{
		{"required", pol(true, policy.EnforcementEnforce), 0, admitRefused},
		{"required, shadow (the caller only counts it)", pol(true, policy.EnforcementShadow), 0, admitRefused},
		{"required, off", pol(true, policy.EnforcementOff), 1, admitBypass},
		{"optional, no key", pol(false, policy.EnforcementEnforce), 0, admitBypass},
		{"optional, a header key", pol(false, policy.EnforcementEnforce), 1, admitRefused},
		{"required in its grace period, no key", grace, 0, admitBypass},
		{"required in its grace period, a header key", grace, 1, admitRefused},
		{"optional, key from the body", pol(false, policy.EnforcementEnforce, policy.KeyFromBody), 0, admitRefused},
		{"optional, derived", pol(false, policy.EnforcementEnforce, policy.KeyFromHeader, policy.KeyFromDerived), 0, admitRefused},
		{"optional, body key only, a header line", pol(false, policy.EnforcementEnforce, policy.KeyFromBody), 1, admitRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &adoption{}
			a := New(&Server{Observer: obs}, &reporter{})
			a.Policy = tc.pol
			got, prob := a.admitUnreadable(cause, tc.headerLines, now)
			if got != tc.want || (got == admitRefused) != (prob != nil) || (prob != nil && prob.Slug != problem.BodyUnreadable.Slug) {
				t.Fatalf("admission %v %+v, want %v", got, prob, tc.want)
			}
			if n := obs.withKey + obs.without; (got == admitRefused) != (n == 1) {
				t.Fatalf("adoption counted %+v", obs)
			}
		})
	}
}

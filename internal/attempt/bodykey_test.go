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
		in           KeyInput
		want         Admission
		slug         string
		detail       string // in the problem's detail
		key          string
		derivedSpace bool
	}{
		{"body key", body(true), KeyInput{Body: []byte(`{"idempotency_key":"k-1","amount":5}`)}, Keyed, "", "", "k-1", false},
		{"body key with a comma is one key", body(true), KeyInput{Body: []byte(`{"idempotency_key":"a,b"}`)}, Keyed, "", "", "a,b", false},
		{"body key missing, required", body(true), KeyInput{Body: []byte(`{"amount":5}`)}, Refuse, problem.KeyMissing.Slug, "/idempotency_key", "", false},
		{"body key missing, optional", body(false), KeyInput{Body: []byte(`{"amount":5}`)}, Bypass, "", "", "", false},
		{"body not JSON, required", body(true), KeyInput{Body: []byte(`amount=5`)}, Refuse, problem.KeyMissing.Slug, "not a JSON object", "", false},
		{"no body, required", body(true), KeyInput{}, Refuse, problem.KeyMissing.Slug, "/idempotency_key", "", false},
		{"body not JSON, optional", body(false), KeyInput{Body: []byte(`amount=5`)}, Bypass, "", "", "", false},
		{"body key not a string, required", body(true), KeyInput{Body: []byte(`{"idempotency_key":7}`)}, Refuse, problem.KeyInvalid.Slug, "/idempotency_key", "", false},
		{"body key not a string, optional", body(false), KeyInput{Body: []byte(`{"idempotency_key":7}`)}, Bypass, "", "", "", false},
		{"body key too long", body(false), KeyInput{Body: []byte(`{"idempotency_key":"` + strings.Repeat("k", 256) + `"}`)}, Refuse, problem.KeyInvalid.Slug, "/idempotency_key", "", false},
		{"body key not visible ASCII", body(false), KeyInput{Body: []byte(`{"idempotency_key":"a b"}`)}, Refuse, problem.KeyInvalid.Slug, "/idempotency_key", "", false},
		{"body key empty", body(false), KeyInput{Body: []byte(`{"idempotency_key":""}`)}, Refuse, problem.KeyInvalid.Slug, "empty", "", false},
		{"duplicate member", body(true), KeyInput{Body: []byte(`{"idempotency_key":"a","idempotency_key":"b"}`)}, Refuse, problem.KeyInvalid.Slug, "duplicate", "", false},
		{"derived", derived(true, policy.KeyFromDerived), KeyInput{Body: []byte(call)}, Keyed, "", "", "", true},
		{"derived, no member", derived(true, policy.KeyFromDerived), KeyInput{Body: []byte(`{"id":1,"method":"x"}`)}, Refuse, problem.KeyMissing.Slug, "/params/name", "", false},
		{"header first", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), KeyInput{HeaderRaw: "h-1", HeaderLines: 1, Body: []byte(call)}, Keyed, "", "", "h-1", false},
		{"no header: derived", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), KeyInput{Body: []byte(call)}, Keyed, "", "", "", true},
		{"header malformed is refused, not derived", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), KeyInput{HeaderRaw: "a,b", HeaderLines: 1, Body: []byte(call)}, Refuse, problem.KeyInvalid.Slug, "", "", false},
		{"nothing at all, required", derived(true, policy.KeyFromHeader, policy.KeyFromDerived), KeyInput{Body: []byte(`[1]`)}, Refuse, problem.KeyMissing.Slug, "no idempotency-key header", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &adoption{}
			a := New(&Server{Observer: obs}, &reporter{})
			a.Policy = tc.pol
			got, key, prob := a.AdmitKeyFrom(tc.in, now)
			if got != tc.want || (tc.key != "" && key != tc.key) {
				t.Fatalf("admission %v key %q, want %v %q", got, key, tc.want, tc.key)
			}
			if (prob != nil) != (tc.slug != "") || (prob != nil && (prob.Slug != tc.slug || !strings.Contains(prob.Detail, tc.detail))) {
				t.Fatalf("problem %+v, want %q with %q", prob, tc.slug, tc.detail)
			}
			if obs.withKey+obs.without != 1 {
				t.Fatalf("adoption counted %+v", obs)
			}
			if got != Keyed {
				return
			}
			if tc.derivedSpace != (a.KeySource() == policy.KeyFromDerived) {
				t.Fatalf("key source %v", a.KeySource())
			}
			if tc.derivedSpace && (len(key) != 64 || strings.Contains(key, "send_email")) {
				t.Fatalf("derived key %q is not a hash", key)
			}
			a.Admit("scope", key)
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
		k, miss := derivedKey(members, []byte(body))
		if miss.detail != "" {
			t.Fatalf("%s: %s", body, miss.detail)
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
	a.Admit("s", base)
	b := New(&Server{}, &reporter{})
	b.Policy = p
	b.Admit("s", base) // a client sending the derived key's text as its own key
	if a.ID == b.ID {
		t.Fatal("a derived key shares the record of a client key of the same text")
	}
}

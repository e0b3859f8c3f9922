package idem

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		name, raw, want string
		maxLen          int
		wantErr         bool
	}{
		{name: "bare token", raw: "8e03978e-40d5", want: "8e03978e-40d5"},
		{name: "IETF quoted form", raw: `"8e03978e-40d5"`, want: "8e03978e-40d5"},
		{name: "surrounding whitespace", raw: "  abc\t", want: "abc"},
		{name: "quoted with escapes", raw: `"a\"b\\c"`, want: `a"b\c`},
		{name: "all visible ASCII but the comma", raw: "!~{}()<>@;:/[]?=", want: "!~{}()<>@;:/[]?="},
		{name: "comma inside the quoted form", raw: `"a,b"`, want: "a,b"},
		{name: "bare list", raw: "a,b", wantErr: true},
		{name: "bare list with space", raw: "a, b", wantErr: true},
		{name: "list of quoted strings", raw: `"a", "b"`, wantErr: true},
		{name: "list of quoted strings without space", raw: `"a","b"`, wantErr: true},
		{name: "trailing comma", raw: "a,", wantErr: true},
		{name: "255 characters", raw: strings.Repeat("a", 255), want: strings.Repeat("a", 255)},
		{name: "policy limit", raw: "abcdef", maxLen: 5, wantErr: true},
		{name: "limit above the contract is capped", raw: strings.Repeat("a", 256), maxLen: 1000, wantErr: true},
		{name: "empty", raw: "", wantErr: true},
		{name: "only spaces", raw: "   ", wantErr: true},
		{name: "empty quoted", raw: `""`, wantErr: true},
		{name: "256 characters", raw: strings.Repeat("a", 256), wantErr: true},
		{name: "inner space", raw: "a b", wantErr: true},
		{name: "quoted inner space", raw: `"a b"`, wantErr: true},
		{name: "tab inside", raw: "a\tb", wantErr: true},
		{name: "DEL", raw: "a\x7fb", wantErr: true},
		{name: "NUL", raw: "a\x00b", wantErr: true},
		{name: "UTF-8", raw: "ключ", wantErr: true},
		{name: "unterminated quote", raw: `"abc`, wantErr: true},
		{name: "lone quote", raw: `"`, wantErr: true},
		{name: "bad escape", raw: `"a\nb"`, wantErr: true},
		{name: "escape at end", raw: `"abc\`, wantErr: true},
		{name: "text after closing quote", raw: `"abc";x=1`, wantErr: true},
		{name: "quote inside a bare token is visible ASCII", raw: `ab"c`, want: `ab"c`},
		{name: "same key quoted", raw: `"ab\"c"`, want: `ab"c`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKey(tc.raw, tc.maxLen)
			if tc.wantErr {
				if err == nil || !errors.Is(err, ErrInvalidKey) {
					t.Fatalf("ParseKey(%q) = %q, %v; want ErrInvalidKey", tc.raw, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
			}
		})
	}
}

// TestRecordIDForIsStable pins the derivation: a change would orphan every
// record already stored (its retries would find nothing and run again).
func TestRecordIDForIsStable(t *testing.T) {
	for _, tc := range []struct {
		policy, scope, key string
		want               RecordID
	}{
		{"default", "api.example.com", "8e0f4a4c-2f0e-4f57-9a55-5d1c1f1e2a3b", "e3934d700a0691bf34a05321fb3ab05e"},
		{"", "", "", "709e80c88487a2411e1ee4dfb9f22a86"},
	} {
		if got := RecordIDFor(tc.policy, tc.scope, tc.key); got != tc.want {
			t.Errorf("RecordIDFor(%q, %q, %q) = %s, want %s", tc.policy, tc.scope, tc.key, got, tc.want)
		}
	}
}

func TestRecordIDFor(t *testing.T) {
	a := RecordIDFor("p", "scope", "key")
	if a != RecordIDFor("p", "scope", "key") {
		t.Fatal("not deterministic")
	}
	if len(a) != 32 {
		t.Fatalf("id %q has %d characters, want 32", a, len(a))
	}
	if strings.Contains(string(a), "key") {
		t.Fatal("the id must not reveal the key")
	}
	// Moving bytes between the parts must change the id.
	for _, other := range []RecordID{
		RecordIDFor("p", "scopek", "ey"),
		RecordIDFor("ps", "cope", "key"),
		RecordIDFor("p", "", "scopekey"),
		RecordIDFor("", "p", "scopekey"),
		RecordIDFor("other", "scope", "key"),
	} {
		if other == a {
			t.Fatalf("collision with %q", other)
		}
	}
}

package fingerprint

import (
	"strings"
	"testing"
)

func TestCanonicalJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n \"a\" : [ 1 , 2 ] ,\t\"b\":{\"d\":null,\"c\":true} } ", `{"a":[1,2],"b":{"c":true,"d":null}}`},
		{`"\u0041\u00e9"`, `"Aé"`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{`1.0`, `1.0`},
		{`-0`, `-0`},
		{`1e3`, `1e3`},
		{`false`, `false`},
	} {
		got, ok := canonicalJSON([]byte(tc.in))
		if !ok || string(got) != tc.want {
			t.Errorf("canonicalJSON(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
}

func TestCanonicalJSONDeclines(t *testing.T) {
	for _, in := range []string{
		``, `{`, `{"a":1}{"b":2}`, `{"a":1} x`, `{"a":1,"a":2}`, `[1,]`, `nul`, `{"a" 1}`,
		strings.Repeat("[", 300) + strings.Repeat("]", 300),
	} {
		if got, ok := canonicalJSON([]byte(in)); ok {
			t.Errorf("canonicalJSON(%q) = %q, want a refusal", in, got)
		}
	}
}

func TestJSONFingerprint(t *testing.T) {
	fp := func(body string, jsonMode bool) [32]byte {
		return Compute(Request{Method: "POST", Path: "/o", Body: []byte(body), JSON: jsonMode}, nil)
	}
	same := [][2]string{
		{`{"amount":100,"item":"book"}`, "{ \"item\": \"book\",\n  \"amount\": 100 }"},
		{`{"a":{"y":1,"x":2}}`, `{"a":{"x":2,"y":1}}`},
	}
	for _, p := range same {
		if fp(p[0], true) != fp(p[1], true) {
			t.Errorf("JSON mode: %q and %q should match", p[0], p[1])
		}
		if fp(p[0], false) == fp(p[1], false) {
			t.Errorf("raw mode: %q and %q should differ", p[0], p[1])
		}
	}
	differ := [][2]string{
		{`{"amount":100}`, `{"amount":10000}`},
		{`{"amount":100}`, `{"amount":"100"}`},
		{`{"amount":1}`, `{"amount":1.0}`},
		{`{"a":"x"}`, `{"a":"x "}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":1}`, `{"a":1,"b":null}`},
	}
	for _, p := range differ {
		if fp(p[0], true) == fp(p[1], true) {
			t.Errorf("JSON mode: %q and %q must differ", p[0], p[1])
		}
	}
	// A body that is not JSON is taken as raw bytes in either mode, and
	// never collides with the canonical form of a JSON body.
	if fp(`not json`, true) != fp(`not json`, false) {
		t.Error("non-JSON body should fingerprint as raw bytes")
	}
	if fp(`{"a":1}`, true) == fp(`{"a":1}`, false) {
		t.Error("canonical and raw encodings must not collide")
	}
}

// TestCanonicalJSONDoesNotAllocatePerToken: the canonicaliser writes into
// one buffer, so its allocations do not grow with the number of tokens
// (the one it replaced made about one and a half per token: ~96,000 on
// this 64 KiB body). Counted, not timed, so load cannot flake it.
func TestCanonicalJSONDoesNotAllocatePerToken(t *testing.T) {
	body := benchBody(64 << 10)
	canonicalJSON(body) // warm the pool
	if n := testing.AllocsPerRun(20, func() { canonicalJSON(body) }); n > 32 {
		t.Fatalf("canonicalJSON made %.0f allocations on a 64 KiB body; want at most 32", n)
	}
}

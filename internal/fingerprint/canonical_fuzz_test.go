package fingerprint

import (
	"bytes"
	"testing"
)

// FuzzCanonicalMatchesReference: the streaming canonicaliser accepts
// exactly the bodies the token-by-token one it replaced accepted, and
// writes byte for byte the same canonical form.
func FuzzCanonicalMatchesReference(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":2}`, " {\n \"a\" : [ 1 , 2 ] ,\t\"b\":{\"d\":null,\"c\":true} } ", `"\u0041\u00e9"`,
		`[]`, `{}`, `1.0`, `-0`, `1e3`, `false`, `{"a":1,"a":2}`, `{"a":1}{"b":2}`, `[1,]`, `nul`,
		`{"<&>":"\u2028 \ud800 \u00e9 é \/"}`, "\"\xff\"", `{"a\u0000":1,"a":2}`, `{"é":1,"e":2,"\u00e9":3}`,
		`{"z":{"y":[{"b":1,"a":2}]},"a":0}`, `01`, `1.`, `.5`, `-`, `1e+`, `[1 2]`, `{"a" 1}`, `truex`, "\x7f",
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"send","arguments":{"to":"a@b"},"_meta":{"progressToken":1}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want, wantOK := referenceCanonicalJSON(body)
		got, gotOK := canonicalJSON(body)
		if gotOK != wantOK || !bytes.Equal(got, want) {
			t.Fatalf("canonicalJSON(%q) = %q, %v; reference %q, %v", body, got, gotOK, want, wantOK)
		}
	})
}

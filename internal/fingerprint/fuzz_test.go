package fingerprint

import (
	"slices"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// FuzzComputeIsInjective: two requests get the same fingerprint exactly
// when they agree on method, path, the chosen header's values in order,
// and body. A flaw in the length-prefixed encoding (bytes moving between
// fields unnoticed) would show as two different requests with one digest.
func FuzzComputeIsInjective(f *testing.F) {
	f.Add("POST", "/orders", "application/json", "", []byte(`{"a":1}`), "POST", "/orders", "application/json", "", []byte(`{"a":1}`))
	f.Add("POST", "/orders", "a", "b", []byte("x"), "POST", "/orders", "ab", "", []byte("x"))
	f.Add("POST/", "orders", "", "", []byte(""), "POST", "/orders", "", "", []byte(""))
	f.Add("POST", "/o", "", "", []byte("{}"), "POST", "/o{}", "", "", []byte(""))
	f.Fuzz(func(t *testing.T, m1, p1, h1a, h1b string, b1 []byte, m2, p2, h2a, h2b string, b2 []byte) {
		req := func(m, p, ha, hb string, b []byte) Request {
			var hs []idem.Header
			for _, v := range []string{ha, hb} {
				if v != "" {
					hs = append(hs, idem.Header{Name: "content-type", Value: v})
				}
			}
			hs = append(hs, idem.Header{Name: "x-ignored", Value: ha + hb})
			return Request{Method: m, Path: p, Headers: hs, Body: b}
		}
		values := func(r Request) []string {
			var out []string
			for _, h := range r.Headers {
				if h.Name == "content-type" {
					out = append(out, h.Value)
				}
			}
			return out
		}
		r1, r2 := req(m1, p1, h1a, h1b, b1), req(m2, p2, h2a, h2b, b2)
		same := m1 == m2 && p1 == p2 && slices.Equal(values(r1), values(r2)) && string(b1) == string(b2)
		if got := Compute(r1, ct) == Compute(r2, ct); got != same {
			t.Fatalf("requests %+v and %+v: same fingerprint %v, same operation %v", r1, r2, got, same)
		}
	})
}

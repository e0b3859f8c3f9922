package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

var ct = []string{"content-type"}

func base() Request {
	return Request{
		Method:  "POST",
		Path:    "/orders?x=1",
		Headers: []idem.Header{{Name: "content-type", Value: "application/json"}, {Name: "x-other", Value: "1"}},
		Body:    []byte(`{"a":1}`),
	}
}

func TestComputeDistinguishesOperations(t *testing.T) {
	want := Compute(base(), ct)
	for _, tc := range []struct {
		name   string
		mutate func(*Request)
	}{
		{"method", func(r *Request) { r.Method = "PATCH" }},
		{"path", func(r *Request) { r.Path = "/orders" }},
		{"query", func(r *Request) { r.Path = "/orders?x=2" }},
		{"body", func(r *Request) { r.Body = []byte(`{"a":2}`) }},
		{"body whitespace", func(r *Request) { r.Body = []byte(`{"a": 1}`) }},
		{"empty body", func(r *Request) { r.Body = nil }},
		{"chosen header value", func(r *Request) { r.Headers[0].Value = "text/plain" }},
		{"chosen header absent", func(r *Request) { r.Headers = r.Headers[1:] }},
		{"chosen header repeated", func(r *Request) {
			r.Headers = append(r.Headers, idem.Header{Name: "content-type", Value: "application/json"})
		}},
		{"bytes moved from path to method", func(r *Request) { r.Method, r.Path = "POST/", "orders?x=1" }},
		{"bytes moved from body to path", func(r *Request) { r.Path, r.Body = `/orders?x=1{"a":1}`, nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			r.Headers = append([]idem.Header(nil), r.Headers...)
			tc.mutate(&r)
			if Compute(r, ct) == want {
				t.Fatal("a different operation got the same fingerprint")
			}
		})
	}
}

func TestComputeIgnoresUnchosenHeaders(t *testing.T) {
	r := base()
	r.Headers = append(r.Headers, idem.Header{Name: "x-request-id", Value: "attempt-2"}, idem.Header{Name: "idempotency-key", Value: "k"})
	if Compute(r, ct) != Compute(base(), ct) {
		t.Fatal("headers outside the chosen set changed the fingerprint")
	}
	if Compute(base(), ct) == Compute(base(), Normalize([]string{"content-type", "x-other"})) {
		t.Fatal("choosing another header did not change the fingerprint")
	}
}

// TestComputeIsStable pins the encoding: a change would make every stored
// record mismatch its retries, so it must come with a new version string.
func TestComputeIsStable(t *testing.T) {
	got := Compute(base(), ct)
	const want = "2db45792f839fc35eb2f803c3c7fbff5874b461c4dec33705b5bfe9696524a64"
	if hex.EncodeToString(got[:]) != want {
		t.Fatalf("fingerprint = %x; if the encoding changed on purpose, bump its version and update this value", got)
	}
}

func TestNormalize(t *testing.T) {
	got := Normalize([]string{" X-B ", "content-type", "x-b", "Content-Type"})
	want := []string{"content-type", "x-b"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("Normalize = %q, want %q", got, want)
	}
}

// TestComputeSameAcrossBufferSizes: bodies that fit Compute's stack buffer
// and bodies that do not are hashed alike (the encoding streamed into
// SHA-256 field by field, as specified above Compute).
func TestComputeSameAcrossBufferSizes(t *testing.T) {
	reference := func(r Request, include []string) idem.Fingerprint {
		h := sha256.New()
		uv := func(v uint64) { h.Write(binary.AppendUvarint(nil, v)) }
		str := func(s string) { uv(uint64(len(s))); h.Write([]byte(s)) }
		str(version)
		str(r.Method)
		str(r.Path)
		uv(uint64(len(include)))
		for _, name := range include {
			str(name)
			var vals []string
			for _, hd := range r.Headers {
				if hd.Name == name {
					vals = append(vals, hd.Value)
				}
			}
			uv(uint64(len(vals)))
			for _, v := range vals {
				str(v)
			}
		}
		str("raw")
		uv(uint64(len(r.Body)))
		h.Write(r.Body)
		var fp idem.Fingerprint
		h.Sum(fp[:0])
		return fp
	}
	for _, n := range []int{0, 1, smallEncoding - 200, smallEncoding - 60, smallEncoding - 59, smallEncoding, smallEncoding + 1, 1 << 20} {
		r := base()
		r.Body = []byte(strings.Repeat("b", n))
		if got, want := Compute(r, ct), reference(r, ct); got != want {
			t.Fatalf("body of %d bytes: %x, want %x", n, got, want)
		}
	}
}

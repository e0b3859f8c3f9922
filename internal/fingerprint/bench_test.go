package fingerprint

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
)

// benchBody is a JSON request body of about n bytes.
func benchBody(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"customer":"c-0123456789","currency":"EUR","lines":[`)
	for i := 0; b.Len() < n-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"sku":"sku-` + strconv.Itoa(i) + `","qty":` + strconv.Itoa(i%7+1) + `}`)
	}
	b.WriteString(`],"note":"x"}`)
	return []byte(b.String())
}

func benchRequest(n int, json bool) Request {
	return Request{
		Method: "POST",
		Path:   "/v1/orders?expand=lines",
		Headers: []idem.Header{
			{Name: ":authority", Value: "api.example.com"},
			{Name: "content-type", Value: "application/json"},
			{Name: "idempotency-key", Value: "8e0f4a4c-2f0e-4f57-9a55-5d1c1f1e2a3b"},
			{Name: "x-request-id", Value: "5f0c6f1e-8a53-4d3a-9d2f-2b1d3c4e5f60"},
		},
		Body: benchBody(n),
		JSON: json,
	}
}

// BenchmarkCompute fingerprints a request as the default policy does (raw
// body, content-type), with fingerprint.json, and with JSON pointers
// excluding members as an MCP policy would, from 256 B to 1 MiB.
func BenchmarkCompute(b *testing.B) {
	include := Normalize([]string{"content-type"})
	var exclude []jsonpointer.Pointer
	for _, s := range []string{"/id", "/params/_meta", "/note"} {
		p, err := jsonpointer.Parse(s)
		if err != nil {
			b.Fatal(err)
		}
		exclude = append(exclude, p)
	}
	for _, tc := range []struct {
		name   string
		size   int
		json   bool
		subset bool
	}{
		{"raw_256B", 256, false, false},
		{"raw_1KiB", 1024, false, false},
		{"json_256B", 256, true, false},
		{"json_1KiB", 1024, true, false},
		{"json_64KiB", 64 << 10, true, false},
		{"json_1MiB", 1 << 20, true, false},
		{"json_exclude_1KiB", 1024, true, true},
		{"json_exclude_1MiB", 1 << 20, true, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := benchRequest(tc.size, tc.json)
			if tc.subset {
				r.JSONOptions.Exclude = exclude
			}
			b.SetBytes(int64(len(r.Body)))
			b.ReportAllocs()
			for range b.N {
				Compute(r, include)
			}
		})
	}
}

// canonicalSizes are the body sizes the JSON canonicaliser is measured
// at: a typical request, a large one, and the body limit's order.
var canonicalSizes = []struct {
	name string
	size int
}{{"1KiB", 1 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}}

// BenchmarkCanonicalJSON measures the streaming canonicaliser; run it
// alternately with BenchmarkCanonicalJSONReference for a before/after.
func BenchmarkCanonicalJSON(b *testing.B) {
	for _, tc := range canonicalSizes {
		b.Run(tc.name, func(b *testing.B) {
			body := benchBody(tc.size)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for range b.N {
				if _, ok := canonicalJSON(body); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

// BenchmarkCanonicalJSONReference measures the canonicaliser canonicalJSON
// replaced (reference_test.go).
func BenchmarkCanonicalJSONReference(b *testing.B) {
	for _, tc := range canonicalSizes {
		b.Run(tc.name, func(b *testing.B) {
			body := benchBody(tc.size)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for range b.N {
				if _, ok := referenceCanonicalJSON(body); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

package redisstore

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// FuzzDecodeHeaders: stored header bytes, however corrupt, never panic the
// decoder nor make it allocate without bound, and what it accepts encodes
// and decodes back to the same headers.
func FuzzDecodeHeaders(f *testing.F) {
	f.Add(encodeHeaders([]idem.Header{{Name: "content-type", Value: "application/json"}, {Name: "x", Value: ""}}))
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{2, 1, 'a', 0x80, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := decodeHeaders(b)
		if err != nil {
			return
		}
		again, err := decodeHeaders(encodeHeaders(hs))
		if err != nil || len(again) != len(hs) {
			t.Fatalf("re-encoding %v: %v, %v", hs, again, err)
		}
		for i := range hs {
			if again[i] != hs[i] {
				t.Fatalf("header %d: %v became %v", i, hs[i], again[i])
			}
		}
	})
}

// FuzzHeadersRoundTrip: any headers survive storage byte for byte.
func FuzzHeadersRoundTrip(f *testing.F) {
	f.Add("content-type", "application/json", "x-dup", "\x00\xff\r\n")
	f.Fuzz(func(t *testing.T, n1, v1, n2, v2 string) {
		hs := []idem.Header{{Name: n1, Value: v1}, {Name: n2, Value: v2}, {Name: n1, Value: v2}}
		got, err := decodeHeaders(encodeHeaders(hs))
		if err != nil || len(got) != len(hs) {
			t.Fatalf("round trip of %v: %v, %v", hs, got, err)
		}
		for i := range hs {
			if got[i] != hs[i] {
				t.Fatalf("header %d: %v became %v", i, hs[i], got[i])
			}
		}
	})
}

package redisstore

import (
	"encoding/binary"
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
		// Redis hands the store a string: decoding it must agree.
		fromString, serr := decodeHeaders(string(b))
		if (err == nil) != (serr == nil) || len(fromString) != len(hs) {
			t.Fatalf("string and bytes decode differently: %v, %v / %v, %v", hs, err, fromString, serr)
		}
		for i := range hs {
			if fromString[i] != hs[i] {
				t.Fatalf("header %d: %v from bytes, %v from the string", i, hs[i], fromString[i])
			}
		}
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

// FuzzUvarint: the codec's varint reader accepts and rejects exactly what
// encoding/binary's does.
func FuzzUvarint(f *testing.F) {
	f.Add([]byte{0x80, 0x00})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, rest, err := uvarint(b)
		want, n := binary.Uvarint(b)
		if (err == nil) != (n > 0) || (n > 0 && (v != want || len(rest) != len(b)-n)) {
			t.Fatalf("uvarint(%x) = %d, %d left, %v; encoding/binary says %d, %d bytes", b, v, len(rest), err, want, n)
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

// FuzzDecodeResponse: a stored response, however corrupt, never panics the
// decoder, and what it accepts encodes back to bytes that decode the same.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(testEncodeResponse(&idem.Response{Status: 201, Headers: []idem.Header{{Name: "a", Value: "b"}}, Body: []byte("x")}))
	f.Add([]byte{0xc8, 0x01, 3})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(string(b))
		if err != nil {
			return
		}
		again, err := decodeResponse(testEncodeResponse(r))
		if err != nil || again.Status != r.Status || string(again.Body) != string(r.Body) ||
			len(again.Headers) != len(r.Headers) || again.Sealed != r.Sealed || again.BodyOmitted != r.BodyOmitted {
			t.Fatalf("re-encoding %+v: %+v, %v", r, again, err)
		}
	})
}

package redisstore

import (
	"errors"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

func TestHeadersRoundTrip(t *testing.T) {
	for _, hs := range [][]idem.Header{
		nil,
		{{Name: "content-type", Value: "application/json"}},
		{{Name: "x", Value: ""}, {Name: "x", Value: "2"}, {Name: "bin", Value: "\x00\xff\r\n"}},
	} {
		got, err := decodeHeaders(encodeHeaders(hs))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(hs) {
			t.Fatalf("got %v, want %v", got, hs)
		}
		for i := range hs {
			if got[i] != hs[i] {
				t.Fatalf("header %d = %v, want %v", i, got[i], hs[i])
			}
		}
	}
}

func TestDecodeHeadersRejectsCorruption(t *testing.T) {
	good := encodeHeaders([]idem.Header{{Name: "a", Value: "bc"}})
	for name, b := range map[string][]byte{
		"truncated":        good[:len(good)-1],
		"trailing bytes":   append(append([]byte(nil), good...), 0),
		"huge count":       {0xff, 0xff, 0xff, 0xff, 0x0f},
		"length past end":  {1, 9, 'a'},
		"bad varint":       {0x80},
		"count, no header": {1},
	} {
		if _, err := decodeHeaders(b); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: error %v, want errCorrupt", name, err)
		}
	}
}

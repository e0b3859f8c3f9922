package idem

import (
	"errors"
	"slices"
	"testing"
)

// TestContentsRoundTrip: headers (order and duplicates kept, empty values
// too) and body come back as they went in, and every length that runs
// past the end is refused, never read beyond.
func TestContentsRoundTrip(t *testing.T) {
	for _, r := range []Response{
		{},
		{Body: []byte("body only")},
		{Headers: []Header{{Name: "a", Value: ""}, {Name: "a", Value: "2"}, {Name: "content-type", Value: "application/json"}}},
		{Headers: []Header{{Name: "x", Value: "y"}}, Body: []byte(`{"id":1}`)},
	} {
		b := AppendContents(nil, &r)
		if len(b) != ContentsSize(&r) {
			t.Fatalf("ContentsSize %d, AppendContents wrote %d", ContentsSize(&r), len(b))
		}
		got, err := ParseContents(b)
		if err != nil || string(got.Body) != string(r.Body) || !slices.Equal(got.Headers, r.Headers) {
			t.Fatalf("%+v came back as %+v, %v", r, got, err)
		}
	}
	for name, b := range map[string][]byte{
		"no count":              nil,
		"count past the end":    {5, 1, 'a'},
		"name past the end":     {1, 9, 'a'},
		"value length missing":  {1, 1, 'a'},
		"value past the end":    {1, 1, 'a', 4, 'b'},
		"overlong varint":       {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"huge length in header": {1, 0xff, 0xff, 0xff, 0xff, 0x0f, 'a'},
	} {
		if _, err := ParseContents(b); !errors.Is(err, ErrMalformedContents) {
			t.Errorf("%s: %v, want ErrMalformedContents", name, err)
		}
	}
}

func FuzzParseContents(f *testing.F) {
	f.Add(AppendContents(nil, &Response{Headers: []Header{{Name: "a", Value: "b"}}, Body: []byte("c")}))
	f.Add([]byte{1, 1, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseContents(b)
		if err != nil {
			return
		}
		// A length may be written in more bytes than it needs; what it
		// says is what counts.
		again, err := ParseContents(AppendContents(nil, &r))
		if err != nil || string(again.Body) != string(r.Body) || !slices.Equal(again.Headers, r.Headers) {
			t.Fatalf("%q: %+v written and parsed again is %+v, %v", b, r, again, err)
		}
	})
}

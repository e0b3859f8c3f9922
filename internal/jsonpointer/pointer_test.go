package jsonpointer

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestParse follows RFC 6901 section 5's examples (string form) and its
// escaping rules.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"/foo", []string{"foo"}},
		{"/foo/0", []string{"foo", "0"}},
		{"/", []string{""}},
		{"/a~1b", []string{"a/b"}},
		{"/c%d", []string{"c%d"}},
		{"/m~0n", []string{"m~n"}},
		{"/~01", []string{"~1"}},
		{"/~10", []string{"/0"}},
		{"//", []string{"", ""}},
		{"/params/arguments/client_order_id", []string{"params", "arguments", "client_order_id"}},
		{"/é/\u2028", []string{"é", "\u2028"}},
	} {
		p, err := Parse(tc.in)
		if err != nil || !slices.Equal(p.Tokens(), tc.want) || p.Len() != len(tc.want) || p.String() != tc.in {
			t.Errorf("Parse(%q) = %q (len %d, %q), %v; want %q", tc.in, p.Tokens(), p.Len(), p.String(), err, tc.want)
		}
	}
}

func TestParseErrorsNameThePosition(t *testing.T) {
	for _, tc := range []struct {
		in     string
		offset int
	}{
		{"foo", 0}, {"#/foo", 0}, {"/a~", 2}, {"/a~2", 2}, {"/ok/~x", 4}, {"/~", 1},
	} {
		_, err := Parse(tc.in)
		var pe *ParseError
		if !errors.As(err, &pe) || pe.Offset != tc.offset || pe.Pointer != tc.in {
			t.Errorf("Parse(%q) = %v; want a ParseError at byte %d", tc.in, err, tc.offset)
			continue
		}
		if !strings.Contains(err.Error(), "byte") {
			t.Errorf("error %q does not name the position", err)
		}
	}
}

func TestMatchesIndex(t *testing.T) {
	for _, tc := range []struct {
		tok  string
		i    int
		want bool
	}{
		{"0", 0, true}, {"1", 1, true}, {"10", 10, true}, {"01", 1, false}, {"-", 0, false},
		{"", 0, false}, {"1a", 1, false}, {"2", 1, false}, {"99999999999999999999999", 3, false}, {"+1", 1, false},
	} {
		if got := MatchesIndex(tc.tok, tc.i); got != tc.want {
			t.Errorf("MatchesIndex(%q, %d) = %v", tc.tok, tc.i, got)
		}
	}
}

// FuzzParse: a pointer that parses re-encodes to its own text, and one
// that does not says where.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "/", "/a~1b/~0", "a", "/~2", "/x/0/-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Offset < 0 || pe.Offset >= len(s)+1 {
				t.Fatalf("Parse(%q): %v", s, err)
			}
			return
		}
		var b strings.Builder
		for _, tok := range p.Tokens() {
			b.WriteString("/" + strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1"))
		}
		if b.String() != s {
			t.Fatalf("Parse(%q) re-encodes as %q", s, b.String())
		}
	})
}

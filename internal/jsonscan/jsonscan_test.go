package jsonscan

import "testing"

// TestStringFaults: a string that is not JSON leaves Pos where the text
// stops being JSON, which the pointer finder reports as the offset: the
// control character, the end of an unterminated string, and the start of a
// string whose escape RFC 8259 does not have.
func TestStringFaults(t *testing.T) {
	for _, tc := range []struct {
		text      string
		ok        bool
		pos       int
		escaped   bool
		canonical bool
	}{
		{`"plain"`, true, 7, false, true},
		{`"a\nb"`, true, 6, true, false},
		{`"<b>"`, true, 5, false, false},
		{"\"é\"", true, 4, false, true},
		{"\"\u2028\"", true, 5, false, false},
		{"\"\xff\"", true, 3, false, false},
		{"\"a\x01b\"", false, 2, false, false},
		{`"abc`, false, 4, false, false},
		{`"a\x"`, false, 0, false, false},
		{`"\u12"`, false, 0, false, false},
	} {
		s := Scanner{Data: []byte(tc.text)}
		raw, escaped, canonical, ok := s.String()
		if ok != tc.ok || s.Pos != tc.pos || escaped != tc.escaped || canonical != tc.canonical {
			t.Errorf("%q: ok %v pos %d escaped %v canonical %v, want %v %d %v %v",
				tc.text, ok, s.Pos, escaped, canonical, tc.ok, tc.pos, tc.escaped, tc.canonical)
		}
		if ok && string(raw) != tc.text {
			t.Errorf("%q: raw %q", tc.text, raw)
		}
	}
}

// TestNumbers: RFC 8259 section 6's grammar, and where a number that is
// not one stops.
func TestNumbers(t *testing.T) {
	for _, tc := range []struct {
		text string
		ok   bool
		pos  int
	}{
		{"0", true, 1}, {"-0.5e+10", true, 8}, {"12,", true, 2},
		{"01", true, 1}, // the number is 0; what follows is not the scanner's to judge
		{"-", false, 1}, {"1.", false, 2}, {"1e", false, 2}, {".5", false, 0},
	} {
		s := Scanner{Data: []byte(tc.text)}
		if ok := s.Number(); ok != tc.ok || s.Pos != tc.pos {
			t.Errorf("%q: ok %v pos %d, want %v %d", tc.text, ok, s.Pos, tc.ok, tc.pos)
		}
	}
}

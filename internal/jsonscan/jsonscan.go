// Package jsonscan is the one JSON scanner of the server: the lexical
// reading of a JSON text by RFC 8259 (white space, strings with their
// escapes, numbers, literals, separators) and the one nesting limit, shared
// by the canonicaliser (internal/fingerprint) and the pointer finder
// (internal/jsonpointer), which walk a body's structure each in one pass
// on top of it. A body one of them reads is read the same way by the
// other, and stops at the same depth.
package jsonscan

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// MaxDepth bounds nesting, so that a hostile body cannot exhaust the stack:
// a value nested deeper (the top level is depth 0) is refused.
const MaxDepth = 200

// Scanner reads one JSON text. Data is the text and Pos the offset of the
// next byte to read; after a failure, Pos is where the text stops being
// JSON (for a string whose escape is wrong, where the string starts).
type Scanner struct {
	Data []byte
	Pos  int
}

// SkipSpace steps over white space (RFC 8259 section 2).
func (s *Scanner) SkipSpace() {
	for s.Pos < len(s.Data) {
		switch s.Data[s.Pos] {
		case ' ', '\t', '\n', '\r':
			s.Pos++
		default:
			return
		}
	}
}

// Peek returns the byte at Pos, and false at the end of the text.
func (s *Scanner) Peek() (byte, bool) {
	if s.Pos >= len(s.Data) {
		return 0, false
	}
	return s.Data[s.Pos], true
}

// Consume steps over ch, after white space, and reports whether it was
// there.
func (s *Scanner) Consume(ch byte) bool {
	s.SkipSpace()
	if s.Pos >= len(s.Data) || s.Data[s.Pos] != ch {
		return false
	}
	s.Pos++
	return true
}

// Separator reads what follows an object's member or an array's element,
// after white space: a comma (more follow) or the container's closing byte
// (none do). ok is false for anything else.
func (s *Scanner) Separator(closing byte) (more, ok bool) {
	s.SkipSpace()
	if s.Pos >= len(s.Data) {
		return false, false
	}
	switch s.Data[s.Pos] {
	case ',':
		s.Pos++
		return true, true
	case closing:
		s.Pos++
		return false, true
	}
	return false, false
}

// String reads the string at Pos (its opening quote) and returns its raw
// text, quotes included. escaped says it holds an escape; canonical that
// the raw text is already what encoding/json writes for its decoded value
// (no escape, no '<', '>' or '&', which encoding/json writes as \u003c and
// so on, and valid UTF-8 without U+2028 or U+2029, which it escapes too).
// Escapes are checked against RFC 8259 section 7; Decode gives their
// meaning. ok is false for a string that is not JSON.
func (s *Scanner) String() (raw []byte, escaped, canonical, ok bool) {
	start := s.Pos
	canonical = true
	nonASCII := false
	for i := s.Pos + 1; i < len(s.Data); i++ {
		switch ch := s.Data[i]; {
		case ch == '"':
			raw = s.Data[start : i+1]
			s.Pos = i + 1
			if canonical && nonASCII {
				canonical = utf8.Valid(raw) && !bytes.Contains(raw, lineSep) && !bytes.Contains(raw, paraSep)
			}
			return raw, escaped, canonical, true
		case ch < 0x20:
			s.Pos = i
			return nil, false, false, false
		case ch == '\\':
			escaped, canonical = true, false
			i++
			if !validEscape(s.Data, i) {
				s.Pos = start
				return nil, false, false, false
			}
			if s.Data[i] == 'u' {
				i += 4
			}
		case ch == '<' || ch == '>' || ch == '&':
			canonical = false
		case ch >= utf8.RuneSelf:
			nonASCII = true
		}
	}
	s.Pos = len(s.Data)
	return nil, false, false, false
}

var lineSep, paraSep = []byte("\u2028"), []byte("\u2029")

// validEscape reports whether the escape whose letter is at d[i] is one of
// RFC 8259 section 7's.
func validEscape(d []byte, i int) bool {
	if i >= len(d) {
		return false
	}
	switch d[i] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return true
	case 'u':
		if i+4 >= len(d) {
			return false
		}
		for _, h := range d[i+1 : i+5] {
			if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
				return false
			}
		}
		return true
	}
	return false
}

// Decode returns a string's decoded value as encoding/json decodes it
// (invalid UTF-8 and lone surrogates become U+FFFD); raw is what String
// returned.
func Decode(raw []byte) ([]byte, bool) {
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, false
	}
	return []byte(v), true
}

// Number reads the number at Pos by RFC 8259 section 6:
// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
func (s *Scanner) Number() bool {
	d, i := s.Data, s.Pos
	digits := func() bool {
		n := i
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
		return i > n
	}
	if i < len(d) && d[i] == '-' {
		i++
	}
	if i < len(d) && d[i] == '0' {
		i++
	} else if i >= len(d) || d[i] < '1' || d[i] > '9' || !digits() {
		s.Pos = i
		return false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			s.Pos = i
			return false
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			s.Pos = i
			return false
		}
	}
	s.Pos = i
	return true
}

// Literal reads true, false or null at Pos and returns it; "" when none
// is there.
func (s *Scanner) Literal() string {
	for _, lit := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(s.Data[s.Pos:], []byte(lit)) {
			s.Pos += len(lit)
			return lit
		}
	}
	return ""
}

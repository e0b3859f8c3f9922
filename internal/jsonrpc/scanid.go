package jsonrpc

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// ScanID reads the id of a JSON-RPC request from a body that could not be
// read whole, given as the parts that arrived in order: a body refused
// while it was still arriving (over a limit, cut at a proxy's buffer), or
// one that the pointer finder refuses further in (nesting deeper than the
// reader's limit, a duplicate member name inside params, text that is not
// UTF-8). An answer in the upstream's place then still goes to the
// request's own id: JSON-RPC 2.0 section 5 asks for a null id only when
// there was an error in detecting the id, and the official MCP Go SDK
// client fails its whole connection on a response whose id is null (go-sdk
// v1.8.0 mcp/streamable.go, handleJSON: jsonrpc.DecodeMessage refuses a
// message with neither a method nor a valid id, and the error goes to
// c.fail), where it hands a response with its call's id to that call.
//
// Only the top-level object is read: each member's name, and each value
// skipped by its strings and brackets without looking inside, as a
// reader with no nesting limit would. The id is detected when the bytes
// up to it are such an object's members, it is a JSON string or number of
// valid UTF-8, and no second top-level "id" member was seen (two readers
// may take either one). Anything after the id may be cut short or
// malformed: that is why the body could not be read. ScanID returns a
// copy of the id as sent, or nil when none was detected.
func ScanID(parts ...[]byte) json.RawMessage {
	s := idScanner{}
	for _, part := range parts {
		for _, c := range part {
			if !s.feed(c) {
				return s.result()
			}
		}
	}
	s.stop() // the end of the bytes
	return s.result()
}

// idScanner is ScanID's state: one byte at a time, so that the parts need
// not be joined.
type idScanner struct {
	state scanState
	// name holds the current member name as sent (escapes undecoded), up
	// to maxName bytes; long is set past that: such a name is not "id".
	name []byte
	long bool
	// In a skipped value: nesting depth, inside a string, after a
	// backslash.
	depth            int
	inString, escape bool
	// reading: the value being read is the top-level id's; id holds it.
	reading bool
	id      []byte
	// ids counts the top-level id members; bad is set for one whose value
	// is no string or number, or was cut short.
	ids int
	bad bool
}

type scanState uint8

const (
	scanOpen       scanState = iota // before the top-level '{'
	scanKeyOrClose                  // after '{': a name or '}'
	scanKey                         // after ',': a name
	scanName                        // inside a name
	scanColon                       // after a name
	scanValue                       // after ':'
	scanString                      // inside a string value
	scanNested                      // inside an object or array value
	scanScalar                      // inside a number or literal
	scanAfter                       // after a value: ',' or '}'
	scanDone                        // the object closed, or a fault
)

// maxName bounds the bytes of a member name kept: "id" escaped in full,
// `"\u0069\u0064"`, is 14.
const maxName = 16

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// feed takes one byte; false stops the scan (the object closed, a fault,
// or a second id: nothing later can change the result).
func (s *idScanner) feed(c byte) bool {
	switch s.state {
	case scanName:
		s.feedName(c)
		return true
	case scanValue, scanString, scanNested, scanScalar:
		return s.feedValue(c)
	case scanDone:
		return false
	}
	return s.feedPunctuation(c)
}

// punctuation is, for each state between the object's names and values,
// the one byte that moves the scan on and the state it moves to. Any other
// byte but a space ends the scan: '}' closes the object (after '{' or a
// value), anything else is a fault.
var punctuation = [...]struct {
	want byte
	next scanState
}{
	scanOpen:       {'{', scanKeyOrClose},
	scanKeyOrClose: {'"', scanName},
	scanKey:        {'"', scanName},
	scanColon:      {':', scanValue},
	scanAfter:      {',', scanKey},
}

// feedPunctuation takes a byte between the object's names and values: its
// braces, the colons and the commas.
func (s *idScanner) feedPunctuation(c byte) bool {
	if isSpace(c) {
		return true
	}
	p := punctuation[s.state]
	if c != p.want {
		return s.stop()
	}
	s.state = p.next
	switch p.next {
	case scanName:
		s.name, s.long, s.escape = append(s.name[:0], c), false, false
	case scanValue:
		if s.reading = s.nameIsID(); s.reading {
			if s.ids++; s.ids > 1 {
				return s.stop()
			}
		}
	}
	return true
}

// feedName takes a byte of a member name.
func (s *idScanner) feedName(c byte) {
	if len(s.name) < maxName {
		s.name = append(s.name, c)
	} else {
		s.long = true
	}
	if s.closes(c) {
		s.state = scanColon
	}
}

// closes takes a byte inside a string, a name's or a value's, and reports
// whether it is the quote that closes it.
func (s *idScanner) closes(c byte) bool {
	switch {
	case s.escape:
		s.escape = false
	case c == '\\':
		s.escape = true
	default:
		return c == '"'
	}
	return false
}

// feedValue takes a byte of a member's value; the id's bytes are kept as
// they come.
func (s *idScanner) feedValue(c byte) bool {
	switch s.state {
	case scanValue:
		if isSpace(c) {
			return true
		}
		if s.reading {
			if c != '"' && c != '-' && (c < '0' || c > '9') {
				s.reading, s.bad = false, true // null, an object, an array: no id a request may carry
			} else {
				s.id = append(s.id, c)
			}
		}
		switch {
		case c == '"':
			s.state, s.escape = scanString, false
		case c == '{' || c == '[':
			s.state, s.depth, s.inString, s.escape = scanNested, 1, false, false
		default:
			s.state = scanScalar
		}
	case scanString:
		if s.reading {
			s.id = append(s.id, c)
		}
		if s.closes(c) {
			s.state, s.reading = scanAfter, false
		}
	case scanNested:
		switch {
		case s.inString:
			s.inString = !s.closes(c)
		case c == '"':
			s.inString = true
		case c == '{' || c == '[':
			s.depth++
		case c == '}' || c == ']':
			if s.depth--; s.depth == 0 {
				s.state = scanAfter
			}
		}
	case scanScalar:
		if isSpace(c) || c == ',' || c == '}' {
			s.state, s.reading = scanAfter, false
			return s.feed(c)
		}
		if s.reading {
			s.id = append(s.id, c)
		}
	}
	return true
}

// nameIsID reports whether the name just read, decoded, is "id".
func (s *idScanner) nameIsID() bool {
	if s.long {
		return false
	}
	if string(s.name) == `"id"` {
		return true
	}
	if bytes.IndexByte(s.name, '\\') < 0 {
		return false
	}
	var name string
	return json.Unmarshal(s.name, &name) == nil && name == "id"
}

// stop ends the scan where it is: an id whose value was still being read
// was cut short (a number cut at the end of the bytes may look whole).
func (s *idScanner) stop() bool {
	if s.reading {
		s.reading, s.bad = false, true
	}
	s.state = scanDone
	return false
}

// result is the id detected: one top-level id, a whole string or number
// (validID), of valid UTF-8.
func (s *idScanner) result() json.RawMessage {
	if s.ids != 1 || s.bad || !utf8.Valid(s.id) || !validID(s.id) {
		return nil
	}
	return bytes.Clone(s.id)
}

package jsonpointer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/idem-extproc/idem-extproc/internal/jsonscan"
)

// The errors Find and String return, for a policy's `required` rule to
// map to problems.
var (
	// ErrNotJSON: the body is not exactly one JSON value (RFC 8259); the
	// error is a *SyntaxError naming the byte offset.
	ErrNotJSON = errors.New("body is not JSON")
	// ErrDuplicateMember: an object in the body has two members of one
	// name, whose meaning differs between parsers (RFC 8259 section 4), so
	// the body is refused rather than one of them chosen.
	ErrDuplicateMember = errors.New("body has a duplicate member name")
	// ErrTopLevelArray: the body is a JSON array (a JSON-RPC batch).
	ErrTopLevelArray = errors.New("body is a JSON array")
	// ErrNotObject: the body is a JSON string, number, boolean or null.
	ErrNotObject = errors.New("body is not a JSON object")
	// ErrMissing: the pointer addresses nothing in the body.
	ErrMissing = errors.New("member is missing")
	// ErrNotString: the pointer addresses a value that is not a string.
	ErrNotString = errors.New("member is not a string")
)

// SyntaxError reports where a body stops being JSON. It matches
// ErrNotJSON (or ErrDuplicateMember) under errors.Is.
type SyntaxError struct {
	Offset int
	err    error
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("%v at byte %d", e.err, e.Offset) }
func (e *SyntaxError) Unwrap() error { return e.err }

// Kind is the JSON type of a Value.
type Kind uint8

// The kinds of JSON value; a zero Value (nothing found) has KindNone.
const (
	KindNone Kind = iota
	KindString
	KindNumber
	KindBool
	KindNull
	KindObject
	KindArray
)

// Value is what a pointer addressed: its JSON type and its bytes exactly
// as in the body (Raw aliases the body, from Offset).
type Value struct {
	Kind   Kind
	Raw    []byte
	Offset int
}

// Found reports whether the pointer addressed a value.
func (v Value) Found() bool { return v.Kind != KindNone }

// Text returns a string value decoded (escapes resolved, as
// encoding/json decodes them); ErrMissing or ErrNotString otherwise.
func (v Value) Text() (string, error) {
	switch v.Kind {
	case KindNone:
		return "", ErrMissing
	case KindString:
		if bytes.IndexByte(v.Raw, '\\') < 0 {
			return string(v.Raw[1 : len(v.Raw)-1]), nil
		}
		var s string
		if err := json.Unmarshal(v.Raw, &s); err != nil {
			return "", &SyntaxError{Offset: v.Offset, err: ErrNotJSON}
		}
		return s, nil
	}
	return "", ErrNotString
}

// OneOf reports whether the value is a string equal, once decoded, to one
// of candidates: the body match of a policy (/method is "tools/call",
// /params/name is one of a list). A value of any other type never matches.
func (v Value) OneOf(candidates ...string) bool {
	s, err := v.Text()
	return err == nil && slices.Contains(candidates, s)
}

// String returns the decoded string at p in body: the key drawn from
// /idempotency_key, say. Its errors are Find's, ErrMissing and
// ErrNotString.
func String(body []byte, p Pointer) (string, error) {
	vs, err := Find(body, p)
	if err != nil {
		return "", err
	}
	return vs[0].Text()
}

// Find reads the values at ptrs from body in one pass, without building a
// tree. The body must be a JSON object, and is checked whole: a body that
// is not JSON fails with ErrNotJSON even if the members sought came before
// the fault, an array (a batch) with ErrTopLevelArray, another value with
// ErrNotObject, and a body with a duplicate member name anywhere with
// ErrDuplicateMember. A pointer that addresses nothing yields a Value that
// is not Found. Array elements are addressed by index (RFC 6901 section
// 4; "-" addresses nothing).
func Find(body []byte, ptrs ...Pointer) ([]Value, error) {
	s := scanner{Scanner: jsonscan.Scanner{Data: body}, ptrs: ptrs, found: make([]Value, len(ptrs))}
	s.SkipSpace()
	top := s.Pos
	live := make([]int, len(ptrs))
	for i := range live {
		live[i] = i
	}
	if err := s.value(0, live); err != nil {
		return nil, err
	}
	s.SkipSpace()
	if s.Pos != len(body) {
		return nil, s.fail(ErrNotJSON)
	}
	switch body[top] {
	case '{':
		return s.found, nil
	case '[':
		return nil, ErrTopLevelArray
	}
	return nil, ErrNotObject
}

// errTooDeep is the ErrNotJSON of a body nested deeper than
// jsonscan.MaxDepth, the limit the fingerprint's canonicaliser keeps too:
// it may be JSON to a reader with a higher limit, and the message says why
// this one stopped.
var errTooDeep = fmt.Errorf("%w: nested deeper than %d levels", ErrNotJSON, jsonscan.MaxDepth)

type scanner struct {
	jsonscan.Scanner
	ptrs  []Pointer
	found []Value
	keys  [][]byte // a stack: each open object's member names sit on top
}

func (s *scanner) fail(err error) error { return &SyntaxError{Offset: s.Pos, err: err} }

// value reads the value at s.Pos at depth (top level 0); live are the
// pointers whose first depth tokens lead here.
func (s *scanner) value(depth int, live []int) error {
	if depth > jsonscan.MaxDepth {
		return s.fail(errTooDeep)
	}
	if s.Pos >= len(s.Data) {
		return s.fail(ErrNotJSON)
	}
	start := s.Pos
	var kind Kind
	switch ch := s.Data[s.Pos]; {
	case ch == '{':
		kind = KindObject
		if err := s.object(depth, live); err != nil {
			return err
		}
	case ch == '[':
		kind = KindArray
		if err := s.array(depth, live); err != nil {
			return err
		}
	case ch == '"':
		kind = KindString
		if _, err := s.str(); err != nil {
			return err
		}
	case ch == '-' || ('0' <= ch && ch <= '9'):
		kind = KindNumber
		if !s.Number() {
			return s.fail(ErrNotJSON)
		}
	default:
		switch s.Literal() {
		case "true", "false":
			kind = KindBool
		case "null":
			kind = KindNull
		default:
			return s.fail(ErrNotJSON)
		}
	}
	for _, i := range live {
		if s.ptrs[i].Len() == depth {
			s.found[i] = Value{Kind: kind, Raw: s.Data[start:s.Pos], Offset: start}
		}
	}
	return nil
}

func (s *scanner) next(depth int, live []int, matches func(string) bool) []int {
	var out []int
	for _, i := range live {
		if s.ptrs[i].Len() > depth && matches(s.ptrs[i].tokens[depth]) {
			out = append(out, i)
		}
	}
	return out
}

func (s *scanner) object(depth int, live []int) error {
	s.Pos++ // '{'
	base := len(s.keys)
	defer func() { s.keys = s.keys[:base] }()
	var seen map[string]struct{} // past smallObject members, so a hostile body costs no n² compares
	s.SkipSpace()
	if s.Pos < len(s.Data) && s.Data[s.Pos] == '}' {
		s.Pos++
		return nil
	}
	for {
		s.SkipSpace()
		if s.Pos >= len(s.Data) || s.Data[s.Pos] != '"' {
			return s.fail(ErrNotJSON)
		}
		keyAt := s.Pos
		key, err := s.str()
		if err != nil {
			return err
		}
		if dup := s.duplicate(base, key, &seen); dup {
			s.Pos = keyAt
			return s.fail(ErrDuplicateMember)
		}
		if !s.Consume(':') {
			return s.fail(ErrNotJSON)
		}
		if closed, err := s.element(depth, live, func(tok string) bool { return tok == string(key) }, '}'); closed || err != nil {
			return err
		}
	}
}

// element reads one member's value or one array element, with the
// pointers of live that matches lets into it, and the separator after it;
// it reports whether closing ended the object or array.
func (s *scanner) element(depth int, live []int, matches func(string) bool, closing byte) (closed bool, err error) {
	var childLive []int
	if len(live) > 0 {
		childLive = s.next(depth, live, matches)
	}
	s.SkipSpace()
	if err := s.value(depth+1, childLive); err != nil {
		return false, err
	}
	more, ok := s.Separator(closing)
	if !ok {
		return false, s.fail(ErrNotJSON)
	}
	return !more, nil
}

// smallObject is the member count up to which names are compared one by
// one; past it they go into a set.
const smallObject = 16

// duplicate records key among the names of the object whose names start
// at s.keys[base], and reports whether it was already there.
func (s *scanner) duplicate(base int, key []byte, seen *map[string]struct{}) bool {
	if *seen == nil {
		for _, k := range s.keys[base:] {
			if bytes.Equal(k, key) {
				return true
			}
		}
		s.keys = append(s.keys, key)
		if len(s.keys)-base > smallObject {
			*seen = make(map[string]struct{}, 2*smallObject)
			for _, k := range s.keys[base:] {
				(*seen)[string(k)] = struct{}{}
			}
		}
		return false
	}
	if _, ok := (*seen)[string(key)]; ok {
		return true
	}
	(*seen)[string(key)] = struct{}{}
	return false
}

func (s *scanner) array(depth int, live []int) error {
	s.Pos++ // '['
	s.SkipSpace()
	if s.Pos < len(s.Data) && s.Data[s.Pos] == ']' {
		s.Pos++
		return nil
	}
	for i := 0; ; i++ {
		if closed, err := s.element(depth, live, func(tok string) bool { return MatchesIndex(tok, i) }, ']'); closed || err != nil {
			return err
		}
	}
}

// str reads the string at s.Pos and returns its decoded bytes (aliasing
// the body when it has no escapes).
func (s *scanner) str() ([]byte, error) {
	raw, escaped, _, ok := s.String()
	if !ok {
		return nil, s.fail(ErrNotJSON)
	}
	if !escaped {
		return raw[1 : len(raw)-1], nil
	}
	v, ok := jsonscan.Decode(raw)
	if !ok {
		s.Pos -= len(raw)
		return nil, s.fail(ErrNotJSON)
	}
	return v, nil
}

// Package jsonpointer parses RFC 6901 JSON Pointers and reads the values
// they address from a JSON request body in one pass, without decoding the
// body into a tree.
//
// It is one of the protocol-free parts of the body options (keys and policies from
// the body): a policy's key may be drawn from a body member such as
// /idempotency_key or /params/arguments/client_order_id, a policy may match
// on members such as /method and /params/name of a JSON-RPC request, and
// the fingerprint may include or exclude members by pointer
// (internal/fingerprint). Policies (policy.Policy.MatchBody) and the
// attempt (attempt.admitKeyFrom) read bodies with it (docs/mcp.md).
package jsonpointer

import (
	"fmt"
	"strings"
)

// Pointer is a parsed RFC 6901 JSON Pointer: a sequence of reference
// tokens, each a member name or an array index. The zero Pointer ("")
// addresses the whole document.
type Pointer struct {
	text   string
	tokens []string
}

// ParseError reports a malformed pointer and the byte offset, in the
// pointer's text, of the first byte that is wrong.
type ParseError struct {
	Pointer string
	Offset  int
	Reason  string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("JSON pointer %q: %s at byte %d", e.Pointer, e.Reason, e.Offset)
}

// Parse reads a pointer in its JSON string form (RFC 6901 section 3, not
// the URI fragment form of section 6): "" or a sequence of "/" followed by
// a reference token, where "~0" stands for "~" and "~1" for "/". Any other
// "~" sequence is an error (section 3: "~" must be followed by 0 or 1).
func Parse(s string) (Pointer, error) {
	if s == "" {
		return Pointer{}, nil
	}
	if s[0] != '/' {
		return Pointer{}, &ParseError{Pointer: s, Offset: 0, Reason: `a non-empty pointer must start with "/"`}
	}
	var tokens []string
	start := 1
	for i := 1; i <= len(s); i++ {
		if i < len(s) && s[i] != '/' {
			if s[i] == '~' && (i+1 >= len(s) || (s[i+1] != '0' && s[i+1] != '1')) {
				return Pointer{}, &ParseError{Pointer: s, Offset: i, Reason: `"~" must be followed by "0" or "1"`}
			}
			continue
		}
		tok := s[start:i]
		if strings.IndexByte(tok, '~') >= 0 {
			// Section 4: "~1" is replaced first, then "~0", so "~01"
			// becomes "~1" and not "/".
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		}
		tokens = append(tokens, tok)
		start = i + 1
	}
	return Pointer{text: s, tokens: tokens}, nil
}

// String returns the pointer as it was parsed.
func (p Pointer) String() string { return p.text }

// Tokens returns the decoded reference tokens, outermost first.
func (p Pointer) Tokens() []string { return append([]string(nil), p.tokens...) }

// Len is the number of reference tokens.
func (p Pointer) Len() int { return len(p.tokens) }

// MatchesIndex reports whether the reference token tok selects array
// element i: RFC 6901 section 4 allows only "0" or a decimal without
// leading zeros, and "-" (past the end) selects nothing.
func MatchesIndex(tok string, i int) bool {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return false
	}
	n := 0
	for j := 0; j < len(tok); j++ {
		c := tok[j]
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
		if n > i {
			return false
		}
	}
	return n == i
}

package idem

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyLength is the longest operation key the contract accepts.
const MaxKeyLength = 255

// ErrInvalidKey wraps every reason ParseKey rejects a header value.
var ErrInvalidKey = errors.New("invalid Idempotency-Key")

// ParseKey extracts the operation key from an Idempotency-Key header value.
// It accepts the IETF form, a Structured Field string ("abc", with \" and
// \\ escapes; draft-ietf-httpapi-idempotency-key-header), and the bare token
// many clients send (abc); both name the same key. The key itself must be
// 1 to maxLen characters of visible ASCII (0x21-0x7E).
//
// The field is a single sf-string Item, never a List (the draft, section 2:
// "Idempotency-Key is an Item Structured Header"). RFC 8941 section 4.2
// parses a field sent on several lines as their comma-joined value and
// fails an Item with anything left after it, and RFC 9110 section 5.3 lets
// any intermediary join repeated lines that way. So a bare key holding a
// comma ("a,b", "a, b") cannot be told from two keys joined and is refused;
// a comma inside the quoted form ("a,b") is part of one string and is
// kept. The caller refuses a field that arrives on more than one line.
func ParseKey(raw string, maxLen int) (string, error) {
	if maxLen <= 0 || maxLen > MaxKeyLength {
		maxLen = MaxKeyLength
	}
	v := strings.Trim(raw, " \t") // optional whitespace around a field value
	if strings.HasPrefix(v, `"`) {
		var err error
		if v, err = unquote(v); err != nil {
			return "", err
		}
	} else if strings.Contains(v, ",") {
		return "", fmt.Errorf("%w: a list of values; the field is a single string", ErrInvalidKey)
	}
	if v == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(v) > maxLen {
		return "", fmt.Errorf("%w: %d characters, more than %d", ErrInvalidKey, len(v), maxLen)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("%w: byte 0x%02x at %d is not visible ASCII", ErrInvalidKey, c, i)
		}
	}
	return v, nil
}

// unquote decodes an RFC 8941 sf-string: a quoted string whose only escapes
// are \" and \\. Parameters after the string are not allowed for this field.
func unquote(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%w: bad escape in quoted key", ErrInvalidKey)
			}
			b.WriteByte(v[i])
		case '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: characters after the closing quote", ErrInvalidKey)
			}
			return b.String(), nil
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%w: unterminated quoted key", ErrInvalidKey)
}

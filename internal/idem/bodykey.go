package idem

import "fmt"

// CheckKey applies the key rules to a key that arrived as it is, not as
// a header field (a JSON body member): 1 to maxLen characters
// of visible ASCII (0x21-0x7E), as ParseKey asks of a header's key once
// unquoted. There is no field syntax to undo, so a comma is a character
// like any other.
func CheckKey(v string, maxLen int) error {
	if maxLen <= 0 || maxLen > MaxKeyLength {
		maxLen = MaxKeyLength
	}
	if v == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(v) > maxLen {
		return fmt.Errorf("%w: %d characters, more than %d", ErrInvalidKey, len(v), maxLen)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: byte 0x%02x at %d is not visible ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

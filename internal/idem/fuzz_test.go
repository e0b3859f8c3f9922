package idem

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseKey: no input panics; an accepted key is 1 to 255 bytes of
// visible ASCII; a key reads the same bare (unless it holds a comma) and
// in the IETF quoted form.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"8e03978e-40d5", `"8e03978e-40d5"`, `"a\"b\\c"`, "", `"`, `"abc`, "a b", "ключ",
		strings.Repeat("k", 256), `"abc";x=1`, "\t abc \t", `"a\nb"`, "a,b", `"a,b"`, `"a", "b"`} {
		f.Add(s, 0)
	}
	f.Fuzz(func(t *testing.T, raw string, maxLen int) {
		key, err := ParseKey(raw, maxLen)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err)
			}
			return
		}
		limit := maxLen
		if limit <= 0 || limit > MaxKeyLength {
			limit = MaxKeyLength
		}
		if len(key) == 0 || len(key) > limit {
			t.Fatalf("ParseKey(%q) = %q: %d bytes, limit %d", raw, key, len(key), limit)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q with byte 0x%02x", raw, key, key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := ParseKey(quoted, maxLen); err != nil || again != key {
			t.Fatalf("quoted form %q of %q reads as %q, %v", quoted, key, again, err)
		}
		if key[0] != '"' && !strings.Contains(key, ",") { // a bare comma reads as a list
			if again, err := ParseKey(key, maxLen); err != nil || again != key {
				t.Fatalf("bare form of %q reads as %q, %v", key, again, err)
			}
		}
	})
}

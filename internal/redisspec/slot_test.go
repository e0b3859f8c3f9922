package redisspec

import "testing"

// TestSlot checks the specification's own examples: the CRC16 check value
// of "123456789" is 0x31C3 (cluster-spec, "Key distribution model", the
// reference implementation's comment), and the hash tag rules of
// cluster-spec, "Hash tags".
func TestSlot(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3 % SlotCount},
		{"", 0},
		{"{user1000}.following", Slot("user1000")},
		{"{user1000}.followers", Slot("user1000")},
		{"foo{}{bar}", Slot("foo{}{bar}")}, // an empty tag: the whole key
		{"foo{{bar}}zap", Slot("{bar")},    // the first '{' to the first '}'
		{"foo{bar}{zap}", Slot("bar")},     // only the first tag
	} {
		if got := Slot(tc.key); got != tc.want {
			t.Errorf("Slot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
}

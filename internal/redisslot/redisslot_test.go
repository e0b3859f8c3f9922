package redisslot

import "testing"

// TestOf checks the specification's own examples: the CRC16 check value
// of "123456789" is 0x31C3 (cluster-spec, "Key distribution model", the
// reference implementation's comment), and the hash tag rules of
// cluster-spec, "Hash tags".
func TestOf(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3 % Count},
		{"", 0},
		{"{user1000}.following", Of("user1000")},
		{"{user1000}.followers", Of("user1000")},
		{"foo{}{bar}", Of("foo{}{bar}")}, // an empty tag: the whole key
		{"foo{{bar}}zap", Of("{bar")},    // the first '{' to the first '}'
		{"foo{bar}{zap}", Of("bar")},     // only the first tag
	} {
		if got := Of(tc.key); got != tc.want {
			t.Errorf("Of(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
}

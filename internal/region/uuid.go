package region

import (
	"encoding/hex"
	"time"
)

// newerThan reports whether key is a UUIDv7 (RFC 9562 §5.7) whose time
// proves it was made after since: later than since by more than skew,
// the clock difference allowed between its maker and this server, and
// not later than now by more than skew (a key from the future proves
// nothing). Any other key proves nothing.
func newerThan(key string, since time.Time, skew time.Duration, now time.Time) bool {
	ms, ok := uuidv7Time(key)
	if !ok {
		return false
	}
	t := time.UnixMilli(ms)
	return t.After(since.Add(skew)) && !t.After(now.Add(skew))
}

// uuidv7Time is the Unix time in milliseconds of a UUIDv7 in its 8-4-4-4-12
// text form (RFC 9562 §4 and §5.7: unix_ts_ms is the first 48 bits, the
// version nibble is 7, the variant bits 10).
func uuidv7Time(s string) (int64, bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return 0, false
	}
	var b [16]byte
	hexs := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(b[:], []byte(hexs)); err != nil {
		return 0, false
	}
	if b[6]>>4 != 7 || b[8]>>6 != 0b10 {
		return 0, false
	}
	var ms int64
	for _, x := range b[:6] {
		ms = ms<<8 | int64(x)
	}
	return ms, true
}

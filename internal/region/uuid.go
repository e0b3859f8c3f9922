package region

import (
	"time"

	"github.com/google/uuid"
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

// uuidv7Time is the Unix time in milliseconds of a UUIDv7 (RFC 9562 §5.7:
// unix_ts_ms is its first 48 bits; version 7, the RFC variant), in the
// forms google/uuid's Parse reads.
func uuidv7Time(s string) (int64, bool) {
	u, err := uuid.Parse(s)
	if err != nil || u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		return 0, false
	}
	sec, nsec := u.Time().UnixTime()
	return sec*1000 + nsec/int64(time.Millisecond), true
}

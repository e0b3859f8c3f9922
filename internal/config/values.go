package config

import (
	"strconv"
	"strings"
	"time"
)

// oneOf reads a value that must be one of names, returning the matching
// value of values (same order).
func oneOf[T any](b *builder, v scalar, path string, names []string, values []T) T {
	for i, n := range names {
		if v.Value == n {
			return values[i]
		}
	}
	b.errorf(v.Line, path, "%q is not one of %s", v.Value, strings.Join(names, ", "))
	var zero T
	return zero
}

func (b *builder) boolean(v scalar, path string) bool {
	x, err := strconv.ParseBool(v.Value)
	if err != nil {
		b.errorf(v.Line, path, "%q is not true or false", v.Value)
	}
	return x
}

func (b *builder) duration(v scalar, path string, min time.Duration) time.Duration {
	d, err := time.ParseDuration(v.Value)
	switch {
	case err != nil:
		b.errorf(v.Line, path, "%q is not a duration (such as 30s, 5m, 24h; the largest unit is h: write 7 days as 168h)", v.Value)
	case d < min || d < 0:
		b.errorf(v.Line, path, "%v is below the minimum %v", d, min)
	}
	return d
}

// date reads an RFC 3339 date-time, or a full date meaning its first
// instant in UTC.
func (b *builder) date(v scalar, path string) time.Time {
	s := strings.TrimSpace(v.Value)
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t
	}
	b.errorf(v.Line, path, "%q is not an RFC 3339 date (2026-03-01) or date-time (2026-03-01T09:00:00Z)", v.Value)
	return time.Time{}
}

// size reads a byte count: a number, or a number with KiB, MiB or GiB, or
// with Ki, Mi or Gi as Kubernetes writes the same units.
func (b *builder) size(v scalar, path string) int {
	s := strings.TrimSpace(v.Value)
	mult := 1
	for suffix, m := range map[string]int{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = strings.TrimSpace(n), m
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > (1<<31)/mult {
		b.errorf(v.Line, path, "%q is not a size (a byte count, or with KiB, MiB or GiB, or Ki, Mi, Gi; up to 2GiB)", v.Value)
		return 0
	}
	return n * mult
}

// shortDuration writes d as a file would: 2h, 1h30m, 90s, not 2h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

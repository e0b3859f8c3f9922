package asynclog

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"
)

// hostileStrings are strings slog escapes: quotes and backslashes, every
// control character, invalid UTF-8, U+2028/U+2029, DEL, HTML characters
// (not escaped by slog), multi-byte runes, U+FFFD itself.
var hostileStrings = []string{
	"", "plain", `quote " and back \ slash`, "new\nline\r\ttab", "\x00\x01\x07\x08\x0b\x0c\x1b\x1f",
	"bad \xff utf8 \xc3", "\xe2\x80", "line\u2028sep\u2029para", "del\x7f", "<b>&amp;</b>'",
	"héllo 世界 🙂", "\ufffd", "\xed\xa0\x80 surrogate", strings.Repeat("a\"", 300),
}

// jsonLineRecords are records shaped like the server's lines (attempt.LogAt:
// policy, key_hash, scope, request_id, attempt, latency_ms, then the line's
// own: decision, outcome, the empty Attr of attempt.errAttr, an error's
// text, shadow_decision, warn_until, body), at levels and times the
// appender must write as slog does.
func jsonLineRecords() []slog.Record {
	at := time.Date(2026, 12, 1, 11, 0, 0, 123456789, time.UTC)
	zone := time.FixedZone("x", -(3*3600 + 30*60))
	times := []time.Time{at, time.Now(), {}, at.In(zone), time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 1000, time.UTC)}
	levels := []slog.Level{slog.LevelInfo, slog.LevelDebug, slog.LevelWarn, slog.LevelError, slog.LevelInfo + 2, -8, 12}
	attempt := func(extra ...slog.Attr) []slog.Attr {
		return append([]slog.Attr{slog.String("policy", "orders"),
			slog.String("key_hash", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
			slog.String("scope", "tenant-a"), slog.String("request_id", "5f0c6f1e-8a53-4d3a-9d2f-2b1d3c4e5f60"),
			slog.Int("attempt", 2), slog.Float64("latency_ms", 0.123)}, extra...)
	}
	attrSets := [][]slog.Attr{
		attempt(slog.String("decision", "reserved")),
		attempt(slog.String("outcome", "stored"), slog.Attr{}),
		attempt(slog.String("outcome", "unknown"), slog.String("error", "context deadline exceeded")),
		attempt(slog.String("shadow_decision", "would_replay")),
		attempt(slog.Time("warn_until", at.In(zone))),
		{slog.Float64("latency_ms", 1.5)},
		nil,
		{slog.Int64("neg", math.MinInt64), slog.Uint64("big", math.MaxUint64), slog.Bool("t", true), slog.Bool("f", false),
			slog.Duration("d", -1500*time.Millisecond), slog.Duration("max", math.MaxInt64), slog.Time("zero", time.Time{}),
			slog.Time("mono", time.Now()), slog.Time("y10000", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))},
		{{Key: "", Value: slog.StringValue("empty key")}, {Key: "", Value: slog.Int64Value(0)}, slog.Attr{}, slog.Attr{}},
		// left to slog: Any, groups, a LogValuer
		{slog.Any("err", errors.New("dial tcp: refused")), slog.Any("m", map[string]int{"n": 1}), slog.Any("nil", nil)},
		{slog.Group("g", slog.String("a", "b")), slog.Group("", slog.Int("inline", 1)), slog.Group("empty")},
		{slog.Any("lv", slog.StringValue("resolved"))},
	}
	for _, f := range []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 1e-6, 9.99e-7, 1e-7, 1.5e-300, 5e-324, 1e20, 1e21,
		-1e21, 123456789.125, math.MaxFloat64, math.SmallestNonzeroFloat64, math.NaN(), math.Inf(1), math.Inf(-1)} {
		attrSets = append(attrSets, []slog.Attr{slog.Float64("f", f), slog.String("after", "x")})
	}
	for _, s := range hostileStrings {
		attrSets = append(attrSets, []slog.Attr{slog.String(s, s), slog.String("k", s)})
	}
	var recs []slog.Record
	for i, as := range attrSets {
		r := slog.NewRecord(times[i%len(times)], levels[i%len(levels)], hostileStrings[i%len(hostileStrings)], 0)
		r.AddAttrs(as...)
		recs = append(recs, r)
	}
	for _, tm := range times {
		r := slog.NewRecord(tm, slog.LevelInfo, "decision", 0)
		r.AddAttrs(attempt(slog.String("decision", "replayed"))...)
		recs = append(recs, r)
	}
	return recs
}

// slogLine is what slog.JSONHandler writes for r.
func slogLine(t testing.TB, r slog.Record) string {
	var b bytes.Buffer
	if err := slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: slog.Level(-100)}).Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestJSONLineWritesWhatSlogWrites: every record, decision lines and
// hostile ones, is written byte for byte as slog.JSONHandler writes it,
// through Handle and through appendRecord (the batch's path); the records
// of the server's own lines take the appender's path, not slog's.
func TestJSONLineWritesWhatSlogWrites(t *testing.T) {
	fast := 0
	for i, r := range jsonLineRecords() {
		want := slogLine(t, r)
		var b bytes.Buffer
		h := NewJSONLineHandler(&b, &slog.HandlerOptions{Level: slog.Level(-100)})
		if err := h.Handle(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		if b.String() != want {
			t.Errorf("record %d: Handle wrote\n%s\nslog writes\n%s", i, b.String(), want)
		}
		line, ok := h.(*jsonLineHandler).appendRecord([]byte("before"), r)
		if !ok {
			if string(line) != "before" {
				t.Errorf("record %d: refused, yet appended %q", i, line)
			}
			continue
		}
		fast++
		if string(line) != "before"+want {
			t.Errorf("record %d: appendRecord wrote\n%s\nslog writes\n%s", i, line[len("before"):], want)
		}
	}
	if fast < 35 {
		t.Fatalf("only %d records took the appender's path", fast)
	}
	for _, r := range jsonLineRecords()[:5] {
		if _, ok := appendJSONLine(nil, r); !ok && !r.Time.IsZero() && r.Time.Year() < 10000 && r.Time.Year() >= 0 {
			t.Errorf("a server line (%s) was left to slog", r.Message)
		}
	}
}

// TestJSONLineDerivedHandlersAreSlogs: a logger's own attributes and groups
// are slog's (the appender writes none of them).
func TestJSONLineDerivedHandlersAreSlogs(t *testing.T) {
	var got, want bytes.Buffer
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	for _, l := range []*slog.Logger{slog.New(NewJSONLineHandler(&got, opts)), slog.New(slog.NewJSONHandler(&want, opts))} {
		r := slog.NewRecord(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), slog.LevelInfo, "m", 0)
		r.AddAttrs(slog.String("a", "b"))
		_ = l.With(slog.String("component", "admin")).WithGroup("req").Handler().Handle(context.Background(), r)
		_ = l.WithGroup("g").Handler().Handle(context.Background(), r)
		if l.Handler().Enabled(context.Background(), slog.LevelDebug) {
			t.Error("debug enabled at info")
		}
	}
	if got.String() != want.String() {
		t.Fatalf("got\n%s\nwant\n%s", got.String(), want.String())
	}
}

// FuzzJSONLine holds the appender to slog.JSONHandler over arbitrary
// messages, keys, strings, numbers, times and levels.
func FuzzJSONLine(f *testing.F) {
	for i, s := range hostileStrings {
		f.Add(s, s, "v", int64(i), uint64(i), float64(i)/7, i%2 == 0, int64(i)*1e9, int64(1764586800+i), int64(i*1234567), i-4)
	}
	f.Add("decision", "latency_ms", "reserved", int64(1), uint64(0), 0.123, true, int64(0), int64(0), int64(0), 0)
	f.Add("m", "k", "\u2028", int64(-1), uint64(1<<63), 1e-7, false, int64(-1), int64(253402300800), int64(0), 9)
	f.Add("m", "k", "\xff", int64(0), uint64(0), math.Inf(1), false, int64(0), int64(-62135596801), int64(-5), -9)
	f.Fuzz(func(t *testing.T, msg, key, s string, i int64, u uint64, fl float64, b bool, d, sec, nsec int64, level int) {
		tm := time.Unix(sec, nsec).UTC()
		if sec%3 == 0 {
			tm = tm.In(time.FixedZone("z", int(nsec%86400)))
		}
		r := slog.NewRecord(tm, slog.Level(level), msg, 0)
		r.AddAttrs(slog.String(key, s), slog.Int64("i", i), slog.Uint64(s, u), slog.Float64("f", fl), slog.Bool("b", b),
			slog.Duration("d", time.Duration(d)), slog.Time(key, tm), slog.Attr{}, slog.String("latency_ms", msg))
		want := slogLine(t, r)
		var got bytes.Buffer
		if err := NewJSONLineHandler(&got, &slog.HandlerOptions{Level: slog.Level(-100)}).Handle(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		if got.String() != want {
			t.Fatalf("got\n%q\nwant\n%q", got.String(), want)
		}
	})
}

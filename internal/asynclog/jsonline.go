package asynclog

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// jsonLineHandler writes exactly the bytes slog.JSONHandler writes for a
// record whose attributes are strings, integers, finite floats, booleans,
// durations, times and empty attributes (the kinds of the server's decision
// lines), without slog's general machinery (handle state, buffer pools, a
// json.Encoder for every float). Any other record, and every handler derived
// by WithAttrs or WithGroup, is slog.JSONHandler's own.
//
// It is built only for the Queue, which owns its writer (the batch, or
// one line's buffer): its writes are not serialized with those of the
// handlers derived from it, as slog.JSONHandler's are by their shared mutex.
//
// Each rule below follows log/slog's source (Go 1.26, handler.go
// commonHandler.handle and handleState.appendAttr/appendKey/appendString;
// json_handler.go appendJSONValue, appendJSONTime, appendEscapedJSONString)
// and encoding/json's floatEncoder.encode for floats; the differential and
// fuzz tests in jsonline_test.go hold it to slog.JSONHandler's output.
type jsonLineHandler struct {
	json slog.Handler // slog.JSONHandler over the same writer and options
	w    io.Writer
}

// NewJSONLineHandler returns a handler that writes what
// slog.NewJSONHandler(w, opts) writes. With a ReplaceAttr or AddSource it is
// slog's handler itself: the appender implements neither.
func NewJSONLineHandler(w io.Writer, opts *slog.HandlerOptions) slog.Handler {
	json := slog.NewJSONHandler(w, opts)
	if opts != nil && (opts.ReplaceAttr != nil || opts.AddSource) {
		return json
	}
	return &jsonLineHandler{json: json, w: w}
}

func (h *jsonLineHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.json.Enabled(ctx, level)
}

func (h *jsonLineHandler) WithAttrs(as []slog.Attr) slog.Handler { return h.json.WithAttrs(as) }

func (h *jsonLineHandler) WithGroup(name string) slog.Handler { return h.json.WithGroup(name) }

var jsonLinePool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Handle writes the line in one call to the writer, as slog.JSONHandler
// does.
func (h *jsonLineHandler) Handle(ctx context.Context, r slog.Record) error {
	bp := jsonLinePool.Get().(*[]byte)
	defer jsonLinePool.Put(bp)
	line, ok := appendJSONLine((*bp)[:0], r)
	*bp = line[:0]
	if !ok {
		return h.json.Handle(ctx, r)
	}
	_, err := h.w.Write(line)
	return err
}

// appendRecord appends r's line to dst, or returns dst unchanged and false
// when r holds something the appender leaves to slog.
func (h *jsonLineHandler) appendRecord(dst []byte, r slog.Record) ([]byte, bool) {
	return appendJSONLine(dst, r)
}

// appendJSONLine appends the line slog.JSONHandler (no ReplaceAttr, no
// AddSource, no WithAttrs or WithGroup) writes for r, or returns dst and
// false when r has an attribute of another kind (Any, a LogValuer, a
// group), a float that is not finite (json.Marshal fails on it and slog
// writes an error in its place), or a time whose year is outside
// [0, 9999] (slog writes an error before it).
func appendJSONLine(dst []byte, r slog.Record) ([]byte, bool) {
	start := len(dst)
	dst = append(dst, '{')
	// commonHandler.handle: the time when not zero, stripped of its
	// monotonic reading; the level; then the message.
	if !r.Time.IsZero() {
		var ok bool
		dst = append(dst, `"time":`...)
		if dst, ok = appendJSONTime(dst, r.Time.Round(0)); !ok {
			return dst[:start], false
		}
		dst = append(dst, ',')
	}
	dst = append(dst, `"level":`...)
	dst = appendJSONString(dst, r.Level.String())
	dst = append(dst, `,"msg":`...)
	dst = appendJSONString(dst, r.Message)
	ok := true
	r.Attrs(func(a slog.Attr) bool {
		dst, ok = appendJSONAttr(dst, a)
		return ok
	})
	if !ok {
		return dst[:start], false
	}
	return append(dst, '}', '\n'), true
}

// appendJSONAttr appends ,"key":value for a, nothing for the empty Attr
// (handleState.appendAttr elides it: a zero key and a zero value), or
// reports false for a value the appender leaves to slog.
func appendJSONAttr(dst []byte, a slog.Attr) ([]byte, bool) {
	v := a.Value
	if v.Kind() == slog.KindAny && a.Key == "" && v.Any() == nil {
		return dst, true
	}
	switch v.Kind() {
	case slog.KindString, slog.KindInt64, slog.KindUint64, slog.KindFloat64,
		slog.KindBool, slog.KindDuration, slog.KindTime:
	default:
		return dst, false
	}
	dst = append(dst, ',')
	dst = appendJSONString(dst, a.Key)
	dst = append(dst, ':')
	switch v.Kind() {
	case slog.KindString:
		dst = appendJSONString(dst, v.String())
	case slog.KindInt64:
		dst = strconv.AppendInt(dst, v.Int64(), 10)
	case slog.KindUint64:
		dst = strconv.AppendUint(dst, v.Uint64(), 10)
	case slog.KindFloat64:
		return appendJSONFloat(dst, v.Float64())
	case slog.KindBool:
		dst = strconv.AppendBool(dst, v.Bool())
	case slog.KindDuration:
		dst = strconv.AppendInt(dst, int64(v.Duration()), 10)
	case slog.KindTime:
		return appendJSONTime(dst, v.Time())
	}
	return dst, true
}

// appendJSONTime is slog's appendJSONTime: RFC 3339 with nanoseconds,
// quoted, for a year in [0, 9999].
func appendJSONTime(dst []byte, t time.Time) ([]byte, bool) {
	if y := t.Year(); y < 0 || y >= 10000 {
		return dst, false
	}
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"'), true
}

// appendJSONFloat is encoding/json's float64 encoding (floatEncoder.encode),
// which slog calls through json.Marshal: the shortest 'f' form, or the 'e'
// form below 1e-6 and from 1e21 on with an exponent not padded to two
// digits. json.Marshal fails on NaN and the infinities.
func appendJSONFloat(dst []byte, f float64) ([]byte, bool) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return dst, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// e-09 becomes e-9
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst, true
}

// appendJSONString appends s quoted and escaped as slog's
// appendEscapedJSONString does: `\"`, `\\`, `\n`, `\r`, `\t`, \u00XX for the
// other bytes below 0x20, U+FFFD for each byte of invalid UTF-8, and
// \u2028 and \u2029 escaped; everything else as it is (no HTML escaping).
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

const hexDigits = "0123456789abcdef"

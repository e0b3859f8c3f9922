package attempt

import (
	"context"
	"log/slog"
	"time"
)

// maxLogAttrs is room for an attempt's fields (attemptAttrs) and a line's
// own, gathered on the stack before they reach the record.
const maxLogAttrs = 12

// LogAt writes one line about this attempt at level: its fields
// (attemptAttrs), then extra. A decision's line is on the hot path, so
// nothing is built when the level is off, and the record goes to the
// handler directly: Logger.LogAttrs would also walk the stack for a
// source position the handler never prints. The attributes are added in one
// call: a record holds five inline and grows its overflow slice at each
// call past them, so adding them piecemeal allocated twice per line.
func (a *Attempt) LogAt(ctx context.Context, level slog.Level, msg string, extra ...slog.Attr) {
	h := a.srv.Log.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	var buf [maxLogAttrs]slog.Attr
	attrs := append(a.attemptAttrs(buf[:0]), extra...)
	r.AddAttrs(attrs...)
	_ = h.Handle(ctx, r)
}

// attemptAttrs appends the fields that trace one attempt to a log line:
// the hashed key (record id, never the raw key), scope, policy, request id
// and attempt number, and the latency so far.
func (a *Attempt) attemptAttrs(attrs []slog.Attr) []slog.Attr {
	if a.Policy != nil {
		attrs = append(attrs, slog.String("policy", a.Policy.Name))
	}
	if a.ID != "" {
		attrs = append(attrs, slog.String("key_hash", string(a.ID)), slog.String("scope", a.Scope))
	}
	if a.RequestID != "" {
		attrs = append(attrs, slog.String("request_id", a.RequestID))
	}
	if a.Number > 0 {
		attrs = append(attrs, slog.Int("attempt", a.Number))
	}
	return append(attrs, slog.Float64("latency_ms", float64(time.Since(a.Started).Microseconds())/1000))
}

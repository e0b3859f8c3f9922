package attempt

import (
	"context"
	"log/slog"
	"time"
)

// LogAt writes one line about this attempt at level: its fields
// (addLogAttrs), then extra. A decision's line is on the hot path, so
// nothing is built when the level is off, and the record goes to the
// handler directly: Logger.LogAttrs would also walk the stack for a
// source position the handler never prints.
func (a *Attempt) LogAt(ctx context.Context, level slog.Level, msg string, extra ...slog.Attr) {
	h := a.srv.Log.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	a.addLogAttrs(&r)
	r.AddAttrs(extra...)
	_ = h.Handle(ctx, r)
}

// addLogAttrs adds the fields that trace one attempt to a log record: the
// hashed key (record id, never the raw key), scope, policy, request id and
// attempt number, and the latency so far.
func (a *Attempt) addLogAttrs(r *slog.Record) {
	if a.Policy != nil {
		r.AddAttrs(slog.String("policy", a.Policy.Name))
	}
	if a.ID != "" {
		r.AddAttrs(slog.String("key_hash", string(a.ID)), slog.String("scope", a.Scope))
	}
	if a.RequestID != "" {
		r.AddAttrs(slog.String("request_id", a.RequestID))
	}
	if a.Number > 0 {
		r.AddAttrs(slog.Int("attempt", a.Number))
	}
	r.AddAttrs(slog.Float64("latency_ms", float64(time.Since(a.Started).Microseconds())/1000))
}

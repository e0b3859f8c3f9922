package asynclog

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// BenchmarkDecisionLog times what a request's goroutine spends on one
// decision line (attempt.LogAt's record, handed to the handler), with the
// output discarded.
func BenchmarkDecisionLog(b *testing.B) {
	cfg := logConfig{level: slog.LevelInfo, format: "json"}
	at := time.Now()
	// callerTime logs b.N lines from one goroutine and reports the time
	// spent inside Handle (caller-ns/op): the request path's share, apart
	// from the writer goroutine's work on the other CPU.
	callerTime := func(b *testing.B, h slog.Handler) {
		b.ReportAllocs()
		var spent time.Duration
		for b.Loop() {
			r := benchRecord(at)
			t0 := time.Now()
			_ = h.Handle(context.Background(), r)
			spent += time.Since(t0)
		}
		b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N), "caller-ns/op")
	}
	b.Run("async_handler", func(b *testing.B) {
		q, l := New(io.Discard, cfg.queued)
		defer q.Close()
		callerTime(b, l.Handler())
	})
	// The writer goroutine's work per line: slog's JSON handler against
	// jsonLineHandler's appender, into a batch that is reset when full.
	b.Run("format_slog", func(b *testing.B) {
		b.ReportAllocs()
		var w batchSink
		h := cfg.slogLogger(&w).Handler()
		r := benchRecord(at)
		for b.Loop() {
			_ = h.Handle(context.Background(), r)
			w.reset()
		}
	})
	b.Run("format_appender", func(b *testing.B) {
		b.ReportAllocs()
		h := NewJSONLineHandler(io.Discard, &slog.HandlerOptions{Level: cfg.level}).(*jsonLineHandler)
		var batch []byte
		r := benchRecord(at)
		for b.Loop() {
			batch, _ = h.appendRecord(batch, r)
			if len(batch) >= maxBatchBytes {
				batch = batch[:0]
			}
		}
	})
}

// batchSink gathers writes as batchWriter does.
type batchSink struct{ b []byte }

func (s *batchSink) Write(p []byte) (int, error) { s.b = append(s.b, p...); return len(p), nil }

func (s *batchSink) reset() {
	if len(s.b) >= maxBatchBytes {
		s.b = s.b[:0]
	}
}

// benchRecord is decisionRecord with its strings made once.
func benchRecord(at time.Time) slog.Record {
	r := slog.NewRecord(at, slog.LevelInfo, "decision", 0)
	r.AddAttrs(slog.String("policy", "orders"), slog.String("key_hash", benchKeyHash),
		slog.String("scope", ""), slog.String("request_id", "5f0c6f1e-8a53-4d3a-9d2f-2b1d3c4e5f60"),
		slog.Int("attempt", 1), slog.Float64("latency_ms", 0.123), slog.String("decision", "reserved"))
	return r
}

const benchKeyHash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

package asynclog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// logConfig is a daemon's log settings, as the daemon builds its handlers
// from them (daemon.NewLogger, the queue's format).
type logConfig struct {
	level  slog.Level
	format string
}

// slogLogger is slog's own handler for the settings: what the queue's
// output is held to.
func (c logConfig) slogLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.level}
	if c.format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// queued is the format the queue writes with, as the daemon gives it:
// JSON lines by NewJSONLineHandler, text by slog.
func (c logConfig) queued(w io.Writer) slog.Handler {
	if c.format == "text" {
		return c.slogLogger(w).Handler()
	}
	return NewJSONLineHandler(w, &slog.HandlerOptions{Level: c.level})
}

// decisionRecord is a record shaped like attempt.LogAt's decision line:
// more attributes than a Record holds inline, strings, an int and a float.
func decisionRecord(t time.Time, i int) slog.Record {
	r := slog.NewRecord(t, slog.LevelInfo, "decision", 0)
	r.AddAttrs(slog.String("policy", "orders"), slog.String("key_hash", fmt.Sprintf("%064x", i)),
		slog.String("scope", "tenant \"a\"\n"), slog.String("request_id", fmt.Sprintf("req-%d", i)),
		slog.Int("attempt", 1), slog.Float64("latency_ms", 0.123), slog.String("decision", "reserved"))
	return r
}

// TestAsyncLogWritesWhatTheHandlerWrites: every field of every line, in
// both formats, is what the daemon's handler (NewLogger: slog's own) writes
// when called directly, though the daemon's Queue formats JSON lines with
// jsonLineHandler:
// decision lines, a logger's own attributes and groups, and a record with
// a value that is formatted on its caller's goroutine (an error in
// slog.Any), in the order logged.
func TestAsyncLogWritesWhatTheHandlerWrites(t *testing.T) {
	at := time.Date(2026, 12, 1, 11, 0, 0, 123456789, time.UTC)
	logAll := func(l *slog.Logger) {
		for i := range 20 {
			_ = l.Handler().Handle(context.Background(), decisionRecord(at, i))
		}
		l.With(slog.String("component", "admin")).WithGroup("req").Info("action",
			slog.Group("who", slog.String("token", "a")), slog.Duration("took", time.Second), slog.Bool("ok", true))
		l.Warn("store failed", slog.Any("error", errors.New("dial tcp: refused")), slog.Uint64("n", 7))
		l.Debug("not at this level")
		_ = l.Handler().Handle(context.Background(), decisionRecord(at, 99))
	}
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			cfg := logConfig{level: slog.LevelInfo, format: format}
			var want bytes.Buffer
			logAll(cfg.slogLogger(&want))
			var got syncBuffer
			q, l := New(&got, cfg.queued) // as Main does
			logAll(l)
			_ = q.Close()
			// slog stamps records made by Logger methods with time.Now;
			// compare those lines without their time.
			if g, w := dropTimes(got.String()), dropTimes(want.String()); g != w {
				t.Fatalf("async output differs\n got: %s\nwant: %s", g, w)
			}
			if n := strings.Count(got.String(), "\n"); n != 23 {
				t.Fatalf("%d lines, want 23", n)
			}
		})
	}
}

// TestAsyncLogFormatsChangingValuesAtOnce: a value that is not plain data
// is written as it was when logged, not as it is when the goroutine gets
// to it, and in its turn among the queued lines.
func TestAsyncLogFormatsChangingValuesAtOnce(t *testing.T) {
	release := make(chan struct{})
	out := &blockingWriter{release: release}
	q, l := New(out, textFormat)
	l.Info("before")
	counts := map[string]int{"n": 1}
	l.With(slog.String("c", "x")).Info("counts", slog.Any("counts", counts))
	counts["n"] = 2
	l.Info("after")
	close(release)
	_ = q.Close()
	if want := "msg=before\nmsg=counts c=x counts=map[n:1]\nmsg=after\n"; out.String() != want {
		t.Fatalf("output %q, want %q", out.String(), want)
	}
}

// dropTimes blanks the time of the lines not stamped with the fixed test
// time.
func dropTimes(s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if !strings.Contains(line, "2026-12-01T11:00:00.123") {
			if i := strings.Index(line, "level"); i > 0 {
				line = line[i:]
			}
		}
		b.WriteString(line)
	}
	return b.String()
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// slowWriter records each write call and takes its time, as a busy disk
// or a full pipe would.
type slowWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	delay  time.Duration
}

func (s *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(s.delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.buf.Write(p)
}

func (s *slowWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func textFormat(w io.Writer) slog.Handler {
	return slog.NewTextHandler(w, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == slog.LevelKey {
				return slog.Attr{}
			}
			return a
		},
	})
}

// TestAsyncLogKeepsEveryLineInOrder: lines from many goroutines all arrive
// whole, each goroutine's in its own order, and lines that queued while a
// write was under way share the next write.
func TestAsyncLogKeepsEveryLineInOrder(t *testing.T) {
	out := &slowWriter{delay: time.Millisecond}
	q, l := New(out, textFormat)
	const writers, lines = 8, 200
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range lines {
				l.Info("line", slog.Int("g", g), slog.Int("i", i))
			}
		}()
	}
	wg.Wait()
	_ = q.Close()
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(got) != writers*lines {
		t.Fatalf("%d lines, want %d", len(got), writers*lines)
	}
	next := make([]int, writers)
	for _, line := range got {
		var g, i int
		if _, err := fmt.Sscanf(line, "msg=line g=%d i=%d", &g, &i); err != nil {
			t.Fatalf("mangled line %q", line)
		}
		if i != next[g] {
			t.Fatalf("writer %d: line %d after %d", g, i, next[g]-1)
		}
		next[g]++
	}
	if out.writes >= writers*lines {
		t.Errorf("%d writes for %d lines: nothing batched", out.writes, writers*lines)
	}
}

// TestAsyncLogWritesAtOnceWhenQuiet: a line is written without waiting for
// more, and lines after Close go straight to the output.
func TestAsyncLogWritesAtOnceWhenQuiet(t *testing.T) {
	out := &slowWriter{}
	q, l := New(out, textFormat)
	l.Info("first")
	testwait.Until(t, "the line written", func() bool { return out.String() == "msg=first\n" })
	_ = q.Close()
	l.Info("after close")
	if out.String() != "msg=first\nmsg=\"after close\"\n" {
		t.Fatalf("output %q", out.String())
	}
}

// TestAsyncLogWaitsWhenFullAndLosesNothing: with the output stuck, callers
// wait once maxQueuedRecords are queued (and the waits are counted)
// instead of holding ever more or dropping any, and every line is written
// once the output moves again.
func TestAsyncLogWaitsWhenFullAndLosesNothing(t *testing.T) {
	release := make(chan struct{})
	out := &blockingWriter{release: release}
	q, l := New(out, textFormat)
	const total = 3 * maxQueuedRecords
	logged := make(chan int)
	go func() {
		n := 0
		for i := range total {
			l.Info("line", slog.Int("i", i))
			n++
		}
		logged <- n
	}()
	testwait.Until(t, "a caller waiting for room", func() bool { return q.Waits() > 0 })
	select {
	case n := <-logged:
		t.Fatalf("%d lines logged while the output was stuck", n)
	default:
	}
	q.mu.Lock()
	queued := len(q.pending)
	q.mu.Unlock()
	if queued > maxQueuedRecords {
		t.Fatalf("%d records queued, bound %d", queued, maxQueuedRecords)
	}
	close(release)
	<-logged
	_ = q.Close()
	if got := strings.Count(out.String(), "\n"); got != total {
		t.Fatalf("%d lines written, want %d", got, total)
	}
}

type blockingWriter struct {
	release chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	<-b.release
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *blockingWriter) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestAsyncLogDefersDecisionLines: the lines the request path writes are
// formatted on the writer, not on the caller. The settled line carries an
// empty Attr when there is no error (attempt.errAttr); it once sent every
// settled line down the caller's formatting path.
func TestAsyncLogDefersDecisionLines(t *testing.T) {
	for name, attrs := range map[string][]slog.Attr{
		"decision":          {slog.String("policy", "default"), slog.Int("attempt", 1), slog.Float64("latency_ms", 0.4)},
		"settled, no error": {slog.String("outcome", "stored"), {}},
		"group":             {slog.Group("g", slog.String("a", "b"))},
	} {
		r := slog.NewRecord(time.Now(), slog.LevelInfo, name, 0)
		r.AddAttrs(attrs...)
		if !deferrable(r) {
			t.Errorf("%s: formatted on the caller", name)
		}
	}
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "changing", 0)
	r.AddAttrs(slog.Any("m", map[string]int{}))
	if deferrable(r) {
		t.Error("a record with a map value was deferred: it may change before it is written")
	}
}

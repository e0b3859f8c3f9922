// Package asynclog is the server's log pipeline: a slog handler that takes
// records off the request path into a bounded queue, and one goroutine that
// formats them in batches (Queue), with a JSON line formatter that writes
// slog.JSONHandler's bytes for the server's own lines at a fraction of its
// cost (NewJSONLineHandler).
package asynclog

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// maxQueuedRecords bounds the records a Queue holds: past it, a caller
// waits for the writer goroutine to take them (and the wait is counted), so
// a log output slower than the server slows the server instead of losing
// lines or growing memory without end.
const maxQueuedRecords = 4096

// maxBatchBytes is how much formatted output the writer goroutine gathers
// before one write to the output.
const maxBatchBytes = 256 << 10

// Queue takes log records off the request path: a request's goroutine
// only copies the record into a bounded queue (slog.Record.Clone, no
// allocation), and one goroutine formats the queued records with the
// daemon's JSON or text handler and writes what it formatted in one call.
// Formatting a decision line (the time, the float latency, the escaping)
// and a write system call per line were a twentieth and a tenth of the
// server's CPU on the request path under load.
//
// Woken by the first record of a batch, the goroutine lets records gather
// for logLinger, then formats and writes them all: at most one wake-up and
// one write per logLinger, however many requests a second the server
// takes, and none from a request's goroutine while records keep coming (a
// wake-up per line and a write per line cost a server at one request in
// flight a tenth of its CPU; docs/performance.md, "History of changes"). A
// caller that finds the queue full cuts the wait short.
// Lines keep the order in which their records were queued. Close formats
// and writes everything queued at once; later records are written on their
// caller's goroutine. A crash loses at most the records queued since the
// goroutine last wrote.
//
// A record whose values are not plain data (slog.Any, a LogValuer) could
// change between the call and the formatting, so it is formatted on its
// caller's goroutine, by a handler of its own, and the line queued in its
// turn; the server's own logs use typed attributes only.
type Queue struct {
	out io.Writer

	mu      sync.Mutex
	room    *sync.Cond // signalled when the goroutine takes the queue
	pending []queuedRecord
	spare   []queuedRecord
	closed  bool
	// formatted is the output being gathered, written to by the handlers
	// (through batchWriter) only by the goroutine, or once it is done by
	// whoever holds mu.
	formatted []byte

	waits atomic.Uint64

	wake    chan struct{}
	full    chan struct{} // a caller waits for room: the goroutine stops lingering
	closing chan struct{} // closed by Close: the goroutine stops lingering
	done    chan struct{}
}

// logLinger is how long the writer goroutine lets records gather once the
// first of a batch is queued: one wake-up and one write per batch instead
// of one per line on a server not busy enough to batch by itself. A line
// reaches the output at most this late.
const logLinger = 5 * time.Millisecond

// queuedRecord is a record to format with h, or a line already formatted.
type queuedRecord struct {
	h    slog.Handler
	r    slog.Record
	line []byte
}

// New starts the writer goroutine of out, and returns the queue and the
// logger that feeds it. format builds the
// handler that formats records; it must write each record in one call to
// the writer it is given, as slog's JSON and text handlers do, and must not
// read the context (queued records are formatted with
// context.Background()).
func New(out io.Writer, format func(io.Writer) slog.Handler) (*Queue, *slog.Logger) {
	q := &Queue{out: out, wake: make(chan struct{}, 1), full: make(chan struct{}, 1), closing: make(chan struct{}), done: make(chan struct{})}
	q.room = sync.NewCond(&q.mu)
	go q.run()
	return q, slog.New(&asyncHandler{q: q, inner: format(batchWriter{q}), format: format})
}

// recordAppender is a handler that can append a record's line to the batch
// itself (jsonLineHandler), saving the copy through batchWriter; false
// leaves the record to its Handle.
type recordAppender interface {
	appendRecord(dst []byte, r slog.Record) ([]byte, bool)
}

// batchWriter appends the handlers' output to the batch being gathered.
type batchWriter struct{ q *Queue }

func (w batchWriter) Write(p []byte) (int, error) {
	w.q.formatted = append(w.q.formatted, p...)
	return len(p), nil
}

// Waits returns how many times a caller found the queue full and waited.
func (q *Queue) Waits() uint64 { return q.waits.Load() }

func (q *Queue) enqueue(item queuedRecord) error {
	q.mu.Lock()
	if len(q.pending) >= maxQueuedRecords && !q.closed {
		q.waits.Add(1)
		select {
		case q.full <- struct{}{}:
		default: // already hurried
		}
		for len(q.pending) >= maxQueuedRecords && !q.closed {
			q.room.Wait()
		}
	}
	if q.closed {
		q.mu.Unlock()
		return q.writeNow(item)
	}
	q.pending = append(q.pending, item)
	select {
	case q.wake <- struct{}{}:
	default: // already woken
	}
	q.mu.Unlock()
	return nil
}

// writeNow formats and writes item on the caller's goroutine once the
// goroutine has written everything queued (after Close).
func (q *Queue) writeNow(item queuedRecord) error {
	<-q.done
	q.mu.Lock()
	defer q.mu.Unlock()
	err := item.write(q)
	q.flush()
	return err
}

func (item *queuedRecord) write(q *Queue) error {
	if item.line != nil {
		q.formatted = append(q.formatted, item.line...)
		return nil
	}
	if a, ok := item.h.(recordAppender); ok {
		var done bool
		if q.formatted, done = a.appendRecord(q.formatted, item.r); done {
			return nil
		}
	}
	return item.h.Handle(context.Background(), item.r)
}

// flush writes what was formatted; the caller owns formatted (the
// goroutine, or mu once it is done).
func (q *Queue) flush() {
	if len(q.formatted) > 0 {
		_, _ = q.out.Write(q.formatted)
	}
	if cap(q.formatted) > 2*maxBatchBytes {
		q.formatted = nil
	} else {
		q.formatted = q.formatted[:0]
	}
}

func (q *Queue) run() {
	defer close(q.done)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for range q.wake {
		// Let the records of the next logLinger join this batch. A record
		// queued meanwhile leaves a wake token, taken right after the
		// write: under steady load the goroutine runs on its timer alone,
		// and no request's goroutine has to wake it.
		linger.Reset(logLinger)
		select {
		case <-linger.C:
		case <-q.full:
			linger.Stop()
		case <-q.closing:
			linger.Stop()
		}
		q.writeQueued()
	}
	q.writeQueued() // nothing is queued once closed; this is for certainty
}

// writeQueued formats and writes the records queued so far.
func (q *Queue) writeQueued() {
	q.mu.Lock()
	batch := q.pending
	q.pending, q.spare = q.spare[:0], nil
	q.room.Broadcast()
	q.mu.Unlock()
	for i := range batch {
		_ = batch[i].write(q)
		batch[i] = queuedRecord{} // drop the record's strings
		if len(q.formatted) >= maxBatchBytes {
			q.flush()
		}
	}
	q.flush()
	q.mu.Lock()
	q.spare = batch[:0]
	q.mu.Unlock()
}

// Close formats and writes every queued record; records logged later are
// written on their caller's goroutine.
func (q *Queue) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	close(q.closing)
	close(q.wake) // the goroutine takes what is queued, then ends
	q.room.Broadcast()
	q.mu.Unlock()
	<-q.done
	return nil
}

// asyncHandler is the slog.Handler of a Queue: inner formats, q
// queues. format and with rebuild inner over another writer, for a record
// formatted on its caller's goroutine.
type asyncHandler struct {
	q      *Queue
	inner  slog.Handler
	format func(io.Writer) slog.Handler
	with   []func(slog.Handler) slog.Handler
}

func (h *asyncHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *asyncHandler) Handle(ctx context.Context, r slog.Record) error {
	if deferrable(r) {
		return h.q.enqueue(queuedRecord{h: h.inner, r: r.Clone()})
	}
	var line bytes.Buffer
	own := h.format(&line)
	for _, w := range h.with {
		own = w(own)
	}
	if err := own.Handle(ctx, r); err != nil {
		return err
	}
	return h.q.enqueue(queuedRecord{line: line.Bytes()})
}

// WithAttrs and WithGroup are formatted at once by the inner handler (slog's
// handlers pre-format them), so only records are deferred.
func (h *asyncHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return h.derive(func(inner slog.Handler) slog.Handler { return inner.WithAttrs(as) })
}

func (h *asyncHandler) WithGroup(name string) slog.Handler {
	return h.derive(func(inner slog.Handler) slog.Handler { return inner.WithGroup(name) })
}

func (h *asyncHandler) derive(w func(slog.Handler) slog.Handler) slog.Handler {
	return &asyncHandler{q: h.q, inner: w(h.inner), format: h.format,
		with: append(h.with[:len(h.with):len(h.with)], w)}
}

// deferrable reports whether r may be formatted later, on the writer: every
// attribute is plain data, or the empty Attr, which handlers ignore
// (log/slog's Handler contract: "If an Attr's key and value are both the
// zero value, ignore the Attr") and which a line's optional field leaves
// when absent (attempt's settled line without an error).
func deferrable(r slog.Record) bool {
	plain := true
	r.Attrs(func(a slog.Attr) bool {
		plain = a.Equal(slog.Attr{}) || plainValue(a.Value)
		return plain
	})
	return plain
}

// plainValue reports whether v is data that cannot change after the call
// (strings, numbers, booleans, durations, times, and groups of them).
func plainValue(v slog.Value) bool {
	switch v.Kind() {
	case slog.KindString, slog.KindInt64, slog.KindUint64, slog.KindFloat64,
		slog.KindBool, slog.KindDuration, slog.KindTime:
		return true
	case slog.KindGroup:
		for _, a := range v.Group() {
			if !plainValue(a.Value) {
				return false
			}
		}
		return true
	}
	return false
}

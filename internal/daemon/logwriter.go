package daemon

import (
	"io"
	"sync"
)

// maxPendingLog bounds the log bytes a lineWriter holds: past it, writers
// wait for the output, as they would writing to it directly.
const maxPendingLog = 1 << 20

// lineWriter hands log lines to one goroutine that writes them to the
// output. Each decision is a log line (two for a first write), and a write
// system call per line was a tenth of the server's CPU under load; the
// goroutine writes whatever lines have queued since its last write in one
// call. It never waits on a timer: a line is written as soon as the
// goroutine runs, so a quiet server writes each line at once, and only a
// busy one batches. Order is kept. Close writes what is left. A crash loses
// at most the lines queued since the goroutine last ran.
type lineWriter struct {
	out io.Writer

	mu      sync.Mutex
	drained *sync.Cond // signalled when pending is taken
	pending []byte
	spare   []byte
	closed  bool

	wake chan struct{}
	done chan struct{}
}

func newLineWriter(out io.Writer) *lineWriter {
	w := &lineWriter{out: out, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.drained = sync.NewCond(&w.mu)
	go w.run()
	return w
}

// Write queues p (one log line: slog writes each record in one call).
func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	for len(w.pending) >= maxPendingLog && !w.closed {
		w.drained.Wait()
	}
	if w.closed {
		w.mu.Unlock()
		return w.writeClosed(p)
	}
	w.pending = append(w.pending, p...)
	select {
	case w.wake <- struct{}{}:
	default: // already woken
	}
	w.mu.Unlock()
	return len(p), nil
}

// writeClosed writes p directly once the goroutine is gone, after any line
// still queued.
func (w *lineWriter) writeClosed(p []byte) (int, error) {
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writePendingLocked()
	return w.out.Write(p)
}

func (w *lineWriter) writePendingLocked() {
	if len(w.pending) > 0 {
		_, _ = w.out.Write(w.pending)
		w.pending = w.pending[:0]
	}
}

func (w *lineWriter) run() {
	defer close(w.done)
	for range w.wake {
		w.mu.Lock()
		batch := w.pending
		w.pending, w.spare = w.spare[:0], nil
		w.drained.Broadcast()
		w.mu.Unlock()
		if len(batch) > 0 {
			_, _ = w.out.Write(batch) // only this goroutine writes until it is done
		}
		if cap(batch) <= maxPendingLog {
			w.mu.Lock()
			w.spare = batch[:0]
			w.mu.Unlock()
		}
	}
}

// Close writes every queued line; later lines are written directly.
func (w *lineWriter) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.wake)
	w.drained.Broadcast()
	w.mu.Unlock()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writePendingLocked()
	return nil
}

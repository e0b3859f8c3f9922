package daemon

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/testwait"
)

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

// TestLineWriterKeepsEveryLineInOrder: lines from many goroutines all
// arrive whole, each writer's in its own order, and lines that queued
// while a write was under way share the next write.
func TestLineWriterKeepsEveryLineInOrder(t *testing.T) {
	out := &slowWriter{delay: time.Millisecond}
	w := newLineWriter(out)
	const writers, lines = 8, 200
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range lines {
				if _, err := fmt.Fprintf(w, "g%d %d\n", g, i); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(got) != writers*lines {
		t.Fatalf("%d lines, want %d", len(got), writers*lines)
	}
	next := make([]int, writers)
	for _, line := range got {
		var g, i int
		if _, err := fmt.Sscanf(line, "g%d %d", &g, &i); err != nil {
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

// TestLineWriterWritesAtOnceWhenQuiet: a line is written without waiting
// for more, and lines after Close go straight to the output.
func TestLineWriterWritesAtOnceWhenQuiet(t *testing.T) {
	out := &slowWriter{}
	w := newLineWriter(out)
	fmt.Fprintln(w, "first")
	testwait.Until(t, "the line written", func() bool { return out.String() == "first\n" })
	_ = w.Close()
	fmt.Fprintln(w, "after close")
	if out.String() != "first\nafter close\n" {
		t.Fatalf("output %q", out.String())
	}
}

// TestLineWriterBoundsWhatItHolds: with the output stuck, writers wait once
// a megabyte is queued instead of holding ever more.
func TestLineWriterBoundsWhatItHolds(t *testing.T) {
	release := make(chan struct{})
	out := &blockingWriter{release: release}
	w := newLineWriter(out)
	line := []byte(strings.Repeat("x", 1023) + "\n")
	wrote := make(chan int)
	go func() {
		n := 0
		for range 3 * maxPendingLog / len(line) {
			_, _ = w.Write(line)
			n++
		}
		wrote <- n
	}()
	select {
	case n := <-wrote:
		t.Fatalf("%d KiB queued while the output was stuck", n)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	<-wrote
	_ = w.Close()
	if out.n != 3*maxPendingLog/len(line)*len(line) {
		t.Fatalf("%d bytes written", out.n)
	}
}

type blockingWriter struct {
	release chan struct{}
	mu      sync.Mutex
	n       int
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	<-b.release
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n += len(p)
	return len(p), nil
}

package redisstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// panicking is a client whose scripts panic once gate is closed, and
// whose pipelines panic at once: what a bug under a store call would do.
type panicking struct {
	redis.UniversalClient // nil: any other method panics too
	gate                  chan struct{}
}

func (p panicking) EvalSha(context.Context, string, []string, ...any) *redis.Cmd {
	<-p.gate
	panic("script panicked")
}

func (p panicking) Pipeline() redis.Pipeliner { panic("pipeline panicked") }

// TestPanicUnderAStoreCallFailsThatCall: a panic under a call, on the
// caller's goroutine or on the batcher's, fails the calls it concerns
// with a PanicError, logged once with its stack; the batch slot it held is
// freed, and the process goes on.
func TestPanicUnderAStoreCallFailsThatCall(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
	gate := make(chan struct{})
	s := New(panicking{gate: gate}, Options{BatchSlots: 1, Logger: log})
	r := idem.Reservation{ID: "id", Token: idem.NewToken(), Lease: time.Minute, Retention: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make(chan error, 3)
	// The first call takes the only slot and waits in its script; two
	// more queue behind it, for a batch.
	go func() { _, err := s.Reserve(ctx, r); errs <- err }()
	testwait.Until(t, "the first call in its slot", func() bool { busy, _ := Batching(s); return busy == 1 })
	for range 2 {
		go func() { errs <- s.Release(ctx, r.ID, r.Token) }()
	}
	testwait.Until(t, "two calls queued", func() bool { _, queued := Batching(s); return queued == 2 })
	close(gate)
	for range 3 {
		var pe *PanicError
		if err := <-errs; !errors.As(err, &pe) {
			t.Errorf("err = %v, want a PanicError", err)
		}
	}
	// The slot was freed: the next call runs, and fails the same way.
	var pe *PanicError
	if _, err := s.Reserve(ctx, r); !errors.As(err, &pe) {
		t.Errorf("after the panics: err = %v, want a PanicError", err)
	}
	mu.Lock()
	defer mu.Unlock()
	// One line for each panic: the first call's, the batch's (one for
	// both its calls), the last call's; each with the stack that raised it.
	if n := strings.Count(logs.String(), "redis store call panicked"); n != 3 {
		t.Errorf("%d panics logged, want 3:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "panic_test.go") {
		t.Errorf("no stack in the log:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

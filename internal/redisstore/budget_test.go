package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// slack is what the test allows past a budget for the scheduler of a
// loaded CI machine running the race detector: three quarters of the
// budget, at least 200 ms. With the 400 ms budget of the standalone test
// a call outliving its budget by a whole retry (twice the budget) is still
// caught, while scheduling noise is not; a call that hangs is caught
// everywhere.
func slack(budget time.Duration) time.Duration { return max(budget*3/4, 200*time.Millisecond) }

// timed runs call and returns how long it took, and how late a timer of
// budget, started with it, woke its goroutine: on a machine busier than
// the slack allows for (a load of 8 on 2 vCPUs, the race detector) the
// process itself runs late, and a call whose own deadline fired on time
// returns late by as much. A call that outlives its budget by a retry or
// hangs is late by more than the timer.
func timed(budget time.Duration, call func()) (took, late time.Duration) {
	woke := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		time.Sleep(budget)
		woke <- time.Since(start) - budget
	}()
	call()
	took = time.Since(start)
	return took, <-woke
}

// wantWithinBudget calls every store method while Redis (or the key's
// primary) hangs, and checks that each fails within the per-call budget:
// no call, retries and redirections included, outlives it.
func wantWithinBudget(t *testing.T, s *redisstore.Store, budget time.Duration, hang, resume func()) {
	t.Helper()
	r := durableReservation()
	r.WaitReplicas = 0
	if _, err := s.Reserve(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	durable := durableReservation(withID(r.ID))
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"reserve", func(ctx context.Context) error { _, err := s.Reserve(ctx, r); return err }},
		{"reserve durable", func(ctx context.Context) error { _, err := s.Reserve(ctx, durable); return err }},
		{"renew", func(ctx context.Context) error { return s.Renew(ctx, r.ID, r.Token, time.Minute) }},
		{"complete", func(ctx context.Context) error {
			return s.Complete(ctx, r.ID, r.Token, idem.Response{Status: 200}, time.Hour)
		}},
		{"mark unknown", func(ctx context.Context) error { return s.MarkUnknown(ctx, r.ID, r.Token, time.Hour) }},
		{"release", func(ctx context.Context) error { return s.Release(ctx, r.ID, r.Token) }},
		{"get", func(ctx context.Context) error { _, err := s.Get(ctx, r.ID); return err }},
		{"ping", func(ctx context.Context) error { return s.Ping(ctx) }},
	}
	hang()
	defer resume()
	for _, c := range calls {
		// The caller's context has no deadline: the store's budget must
		// bound the call on its own.
		var err error
		took, late := timed(budget, func() { err = c.call(context.Background()) })
		if err == nil {
			t.Errorf("%s succeeded against a hung Redis", c.name)
		}
		if took > budget+slack(budget)+late {
			t.Errorf("%s took %v, budget %v (a timer of the budget woke %v late)", c.name, took, budget, late)
		}
	}
}

// TestCallsStayWithinBudget: with Redis hung (SIGSTOP: connections are
// accepted, nothing answers), every call gives up within its budget.
func TestCallsStayWithinBudget(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	const budget = 400 * time.Millisecond
	s := redistest.OpenStore(t, srv.URL(), budget)
	wantWithinBudget(t, s, budget, srv.Freeze, srv.Thaw)
	// And it recovers by itself.
	testwait.For(t, func() bool { return s.Ping(context.Background()) == nil })
}

package attempt

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// late is a store whose reservations time out at the caller, as over a
// slow link: each one either lands before its reply is lost (landed) or is
// kept back (inFlight) until the test delivers it. Its Cancel can be
// blocked, or made to fail.
type late struct {
	idem.Store
	landed bool
	// pass is how many reservations are answered in time first.
	pass int

	mu       sync.Mutex
	inFlight []idem.Reservation
	cancels  []idem.Token
	holds    []time.Duration
	// cancelErr, when set, is every Cancel's answer; block, when set,
	// holds every Cancel until it is closed.
	cancelErr error
	block     chan struct{}
}

var errTimeout = context.DeadlineExceeded

func (l *late) Reserve(ctx context.Context, r idem.Reservation) (idem.ReserveResult, error) {
	l.mu.Lock()
	pass := l.pass > 0
	l.pass--
	l.mu.Unlock()
	if pass {
		return l.Store.Reserve(ctx, r)
	}
	if l.landed {
		if _, err := l.Store.Reserve(ctx, r); err != nil {
			return idem.ReserveResult{}, err
		}
	} else {
		l.mu.Lock()
		l.inFlight = append(l.inFlight, r)
		l.mu.Unlock()
	}
	return idem.ReserveResult{}, errTimeout
}

// deliver lets the reservations kept back reach the store now.
func (l *late) deliver(t *testing.T) []error {
	l.mu.Lock()
	rs := l.inFlight
	l.inFlight = nil
	l.mu.Unlock()
	var errs []error
	for _, r := range rs {
		_, err := l.Store.Reserve(context.Background(), r)
		errs = append(errs, err)
	}
	return errs
}

func (l *late) Cancel(ctx context.Context, id idem.RecordID, tok idem.Token, hold time.Duration) (idem.CancelResult, error) {
	l.mu.Lock()
	l.cancels = append(l.cancels, tok)
	l.holds = append(l.holds, hold)
	block, cerr := l.block, l.cancelErr
	l.mu.Unlock()
	if block != nil {
		<-block
	}
	if cerr != nil {
		return 0, cerr
	}
	return l.Store.Cancel(ctx, id, tok, hold)
}

// Watch lets duplicates wait through l (the in-memory store watches).
func (l *late) Watch(ctx context.Context, id idem.RecordID) (<-chan struct{}, func(), error) {
	return l.Store.(idem.Watcher).Watch(ctx, id)
}

func (l *late) cancelled() []idem.Token {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]idem.Token(nil), l.cancels...)
}

// cancelObserver hands over each cancel's outcome.
type cancelObserver struct {
	idem.NopObserver
	outcomes chan idem.CancelOutcome
}

func (o *cancelObserver) ReservationCancelled(_ string, c idem.CancelOutcome) { o.outcomes <- c }

// lateDecider is a decider whose store is l over a fresh in-memory store.
func lateDecider(t *testing.T, pol *policy.Policy, l *late) (*decider, *cancelObserver) {
	t.Helper()
	d := newDecider(t, pol)
	l.Store = d.store
	obs := &cancelObserver{outcomes: make(chan idem.CancelOutcome, 8)}
	d.srv.Store, d.srv.Observer = l, obs
	return d, obs
}

func wantOutcome(t *testing.T, obs *cancelObserver, want idem.CancelOutcome) {
	t.Helper()
	select {
	case got := <-obs.outcomes:
		if got != want {
			t.Fatalf("cancel ended %v, want %v", got, want)
		}
	case <-time.After(testwait.Bound):
		t.Fatalf("no cancel ended within %v; want %v", testwait.Bound, want)
	}
}

// TestGivenUpReservationLandedFirst: the reservation reached the store,
// its reply did not reach the attempt in time, the request is refused; the
// attempt's cancel releases it and the next attempt runs the operation.
func TestGivenUpReservationLandedFirst(t *testing.T) {
	l := &late{landed: true}
	d, obs := lateDecider(t, policy.Default(), l)
	a := d.attempt(d.conv)
	if _, err := a.decide(context.Background(), fp1); !errors.Is(err, errTimeout) {
		t.Fatalf("decide: %v, want the store's timeout", err)
	}
	wantOutcome(t, obs, idem.CancelOutcomeReleased)
	if got := l.cancelled(); len(got) != 1 || got[0] != a.token || l.holds[0] != cancelHold {
		t.Fatalf("cancels %v (holds %v), want one of the attempt's token for %v", got, l.holds, cancelHold)
	}
	d.srv.Store = d.store
	if res, err := d.attempt(d.conv).decide(context.Background(), fp1); err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("the next attempt: %v %v, want reserved", res.Outcome, err)
	}
}

// TestGivenUpReservationLandsAfterTheCancel: the reservation is still on
// its way when the attempt's cancel runs; when it arrives it is refused,
// and the key stays free.
func TestGivenUpReservationLandsAfterTheCancel(t *testing.T) {
	l := &late{}
	d, obs := lateDecider(t, policy.Default(), l)
	if _, err := d.attempt(d.conv).decide(context.Background(), fp1); !errors.Is(err, errTimeout) {
		t.Fatalf("decide: %v", err)
	}
	wantOutcome(t, obs, idem.CancelOutcomeNotHeld)
	errs := l.deliver(t)
	if len(errs) != 1 || !errors.Is(errs[0], idem.ErrCancelled) {
		t.Fatalf("the late reservation: %v, want ErrCancelled", errs)
	}
	d.srv.Store = d.store
	if res, err := d.attempt(d.conv).decide(context.Background(), fp1); err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("the next attempt: %v %v, want reserved", res.Outcome, err)
	}
}

// TestGivenUpWhileWaiting: a duplicate waits for the attempt in flight
// (wait_for_in_flight), which releases the record; the duplicate's own
// reservation then fails, so it is answered 409 as when the wait began,
// and what that reservation may still make is cancelled.
func TestGivenUpWhileWaiting(t *testing.T) {
	pol := policy.Default()
	pol.WaitForInFlight = 30 * time.Second
	l := &late{landed: true, pass: 2} // the first attempt's, and the duplicate's first
	d, obs := lateDecider(t, pol, l)
	first := d.first(t, fp1)
	d.conv.beforeWait = func() { first.settle(context.Background(), idem.ActionRelease) }
	dup := d.attempt(d.conv)
	res, err := d.conv.decideAndWait(context.Background(), dup, fp1)
	if err != nil || res.Outcome != idem.InFlight || len(d.conv.waits) != 1 {
		t.Fatalf("the duplicate: %v %v after %d waits, want in flight (409) after one", res.Outcome, err, len(d.conv.waits))
	}
	wantOutcome(t, obs, idem.CancelOutcomeReleased)
	if got := l.cancelled(); len(got) != 1 || got[0] != dup.token {
		t.Fatalf("cancels %v, want the duplicate's token", got)
	}
	if _, err := d.store.Get(context.Background(), dup.ID); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record after the cancel: %v, want none", err)
	}
}

// TestNoCancelWhenTheRequestGoesOn: under fail_open the request runs
// unprotected after the failed reservation, and a shadow policy lets it
// on whatever happens: the upstream is called, so a reservation that
// lands is left alone (it turns unknown, which is true: the effect may
// have happened). A store error that proves nothing was written needs no
// cancel either.
func TestNoCancelWhenTheRequestGoesOn(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		pol    func(p *policy.Policy)
		shadow bool
		store  func(d *decider, l *late) idem.Store
	}{
		{"fail_open", func(p *policy.Policy) { p.FailureMode = policy.FailOpen }, false, nil},
		{"shadow", func(p *policy.Policy) { p.Enforcement = policy.EnforcementShadow }, true, nil},
		{"refused by the store", func(*policy.Policy) {}, false, func(*decider, *late) idem.Store {
			full := memstore.New(memstore.Options{MaxRecords: 1})
			t.Cleanup(func() { _ = full.Close() })
			_, _ = full.Reserve(ctx, idem.Reservation{ID: "other", Token: idem.NewToken(), Lease: time.Minute, Retention: time.Minute})
			return full
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := policy.Default()
			tc.pol(pol)
			l := &late{landed: true, block: make(chan struct{})}
			t.Cleanup(func() { close(l.block) })
			d, _ := lateDecider(t, pol, l)
			if tc.store != nil {
				d.srv.Store = tc.store(d, l)
			}
			a := d.attempt(d.conv)
			var err error
			if tc.shadow {
				_, err = a.decideShadow(ctx, fp1)
			} else {
				_, err = a.decide(ctx, fp1)
			}
			if err == nil {
				t.Fatal("decide succeeded")
			}
			// A cancel is counted before decide returns, and blocks in the
			// store until cleanup: none may be running.
			if n := d.srv.cancelling.Load(); n != 0 {
				t.Fatalf("%d cancels started", n)
			}
		})
	}
}

// TestCancelsAreBounded: past maxCancelling running at once, a cancel is
// not tried, and that is counted.
func TestCancelsAreBounded(t *testing.T) {
	l := &late{landed: true}
	d, obs := lateDecider(t, policy.Default(), l)
	d.srv.cancelling.Store(maxCancelling)
	if _, err := d.attempt(d.conv).decide(context.Background(), fp1); err == nil {
		t.Fatal("decide succeeded")
	}
	wantOutcome(t, obs, idem.CancelOutcomeDropped)
	if got := l.cancelled(); len(got) != 0 {
		t.Fatalf("%d cancels tried past the bound", len(got))
	}
	if n := d.srv.cancelling.Load(); n != maxCancelling {
		t.Fatalf("running cancels %d, want %d", n, maxCancelling)
	}
}

// TestCancelKeepsTryingWithinItsTime: a store that cannot be asked is
// asked again, within SettleAtEndTimeout; then the cancel counts as
// failed.
func TestCancelKeepsTryingWithinItsTime(t *testing.T) {
	l := &late{landed: true, cancelErr: errDown}
	d, obs := lateDecider(t, policy.Default(), l)
	d.srv.SettleAtEndTimeout = 200 * time.Millisecond
	if _, err := d.attempt(d.conv).decide(context.Background(), fp1); err == nil {
		t.Fatal("decide succeeded")
	}
	wantOutcome(t, obs, idem.CancelOutcomeFailed)
	if got := l.cancelled(); len(got) < 2 {
		t.Fatalf("the cancel was tried %d times, want it retried", len(got))
	}
	testwait.Until(t, "no cancel running once the last ended", func() bool { return d.srv.cancelling.Load() == 0 })
}

// TestWaitForCancels: a shutdown's Wait returns only once the cancels
// under way have ended, and says so when its time runs out first.
func TestWaitForCancels(t *testing.T) {
	l := &late{landed: true, block: make(chan struct{})}
	d, obs := lateDecider(t, policy.Default(), l)
	if _, err := d.attempt(d.conv).decide(context.Background(), fp1); err == nil {
		t.Fatal("decide succeeded")
	}
	testwait.Until(t, "the cancel asked the store", func() bool { return len(l.cancelled()) == 1 })
	short, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.srv.Wait(short); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancel blocked: %v, want the context's error", err)
	}
	close(l.block)
	if err := d.srv.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	wantOutcome(t, obs, idem.CancelOutcomeReleased)
}

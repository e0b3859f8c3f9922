package attempt

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// conv is a Conversation with a hook that runs the moment a duplicate
// starts waiting (decideAndWait), with nothing racing it.
type conv struct {
	reporter
	beforeWait func()
	waits      []time.Duration
}

// decideAndWait is decide, then the wait Request would ask for (waits,
// awaitFirst), with the hook run between them.
func (c *conv) decideAndWait(ctx context.Context, a *Attempt, fp idem.Fingerprint) (idem.ReserveResult, error) {
	res, err := a.decide(ctx, fp)
	if err != nil {
		return res, err
	}
	d, ok := a.waits(res)
	if !ok {
		return res, nil
	}
	c.waits = append(c.waits, d)
	if c.beforeWait != nil {
		c.beforeWait()
	}
	return a.awaitFirst(ctx, fp, res)
}

// down is a store that cannot be asked.
type down struct{ idem.Store }

func (down) Reserve(context.Context, idem.Reservation) (idem.ReserveResult, error) {
	return idem.ReserveResult{}, errDown
}

// sealer seals by marking and opens only what it marked.
type sealer struct{}

func (sealer) Seal(_ idem.RecordID, r idem.Response) (idem.Response, error) {
	r.Sealed = true
	return r, nil
}

func (sealer) Open(_ idem.RecordID, r idem.Response) (idem.Response, error) {
	if string(r.Body) == "tampered" {
		return idem.Response{}, errors.New("seal: does not open")
	}
	r.Sealed = false
	return r, nil
}

// decider is a store with an attempt on it and a way to make the attempt
// that came first.
type decider struct {
	store idem.Store
	srv   *Server
	pol   *policy.Policy
	conv  *conv
}

func newDecider(t *testing.T, pol *policy.Policy) *decider {
	t.Helper()
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	d := &decider{store: ms, pol: pol, conv: &conv{}}
	d.srv = &Server{Store: ms, Observer: idem.NopObserver{}, Log: slog.New(slog.DiscardHandler),
		StoreTimeout: time.Second, SettleAtEndTimeout: time.Second}
	return d
}

// attempt is a new attempt of the request under key "k".
func (d *decider) attempt(c Conversation) *Attempt {
	a := New(d.srv, c)
	a.Policy = d.pol
	a.admit("tenant", false, "k")
	return &a
}

// first runs a first attempt of fp to the upstream and returns it, holding
// the record.
func (d *decider) first(t *testing.T, fp idem.Fingerprint) *Attempt {
	t.Helper()
	a := d.attempt(&d.conv.reporter)
	res, err := a.decide(context.Background(), fp)
	if err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("first attempt: %v %v", res.Outcome, err)
	}
	a.reserved()
	t.Cleanup(func() { stopRenewing(a) })
	return a
}

var fp1, fp2 = idem.Fingerprint{1}, idem.Fingerprint{2}

// TestRequestDecisionTable is docs/design.md §3's table of what the
// reservation finds, played on attempts against the in-memory store.
func TestRequestDecisionTable(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, d *decider) // the record's history
		fp     idem.Fingerprint
		want   idem.Outcome
		number int // the attempt's number; a duplicate is counted too
	}{
		{"none: reserved", func(*testing.T, *decider) {}, fp1, idem.Reserved, 1},
		{"in flight, same: 409", func(t *testing.T, d *decider) { d.first(t, fp1) }, fp1, idem.InFlight, 2},
		{"in flight, differs: 422", func(t *testing.T, d *decider) { d.first(t, fp1) }, fp2, idem.Mismatch, 0},
		{"completed, same: replay", func(t *testing.T, d *decider) {
			d.first(t, fp1).settleStored(ctx, idem.Response{Status: 201})
		}, fp1, idem.Completed, 2},
		{"completed, differs: 422", func(t *testing.T, d *decider) {
			d.first(t, fp1).settleStored(ctx, idem.Response{Status: 201})
		}, fp2, idem.Mismatch, 0},
		{"unknown, same: 409 outcome-unknown", func(t *testing.T, d *decider) {
			d.first(t, fp1).settle(ctx, idem.ActionUnknown)
		}, fp1, idem.Unknown, 2},
		// The record is gone with its count: the next attempt is a first.
		{"released: the next attempt runs", func(t *testing.T, d *decider) {
			d.first(t, fp1).settle(ctx, idem.ActionRelease)
		}, fp1, idem.Reserved, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDecider(t, policy.Default())
			tc.before(t, d)
			a := d.attempt(d.conv)
			res, err := d.conv.decideAndWait(ctx, a, tc.fp)
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != tc.want || a.Number != tc.number {
				t.Fatalf("outcome %v attempt %d, want %v attempt %d", res.Outcome, a.Number, tc.want, tc.number)
			}
			if tc.want == idem.Completed && (res.Response == nil || res.Response.Status != 201) {
				t.Fatalf("replay of %+v", res.Response)
			}
			if len(d.conv.waits) != 0 {
				t.Fatalf("waited %v without wait_for_in_flight", d.conv.waits)
			}
		})
	}
}

// TestWaitForFirstTable is §3's table for a duplicate that waits
// (wait_for_in_flight): it answers from what the first attempt did while
// it waited.
func TestWaitForFirstTable(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// settle is what the first attempt does once the duplicate waits;
		// nil: nothing, the wait runs out.
		settle func(first *Attempt)
		want   idem.Outcome
	}{
		{"completed: replay", func(f *Attempt) { f.settleStored(ctx, idem.Response{Status: 201}) }, idem.Completed},
		{"released: this attempt reserves", func(f *Attempt) { f.settle(ctx, idem.ActionRelease) }, idem.Reserved},
		{"unknown: 409 outcome-unknown", func(f *Attempt) { f.settle(ctx, idem.ActionUnknown) }, idem.Unknown},
		{"still in flight: 409", nil, idem.InFlight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := policy.Default()
			pol.WaitForInFlight = 30 * time.Second
			if tc.settle == nil {
				pol.WaitForInFlight = 20 * time.Millisecond // only a bound: nothing will wake it
			}
			d := newDecider(t, pol)
			first := d.first(t, fp1)
			if tc.settle != nil {
				d.conv.beforeWait = func() { tc.settle(first) }
			}
			res, err := d.conv.decideAndWait(ctx, d.attempt(d.conv), fp1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != tc.want {
				t.Fatalf("outcome %v, want %v", res.Outcome, tc.want)
			}
			if want := pol.WaitForInFlight + 3*d.srv.StoreTimeout; len(d.conv.waits) != 1 || d.conv.waits[0] != want {
				t.Fatalf("waits announced %v, want [%v]", d.conv.waits, want)
			}
		})
	}
}

// TestStoreCannotBeUsed: §3's rows where the store cannot be asked (the
// policy's failure_mode decides) or its answer cannot be used (always
// refused).
func TestStoreCannotBeUsed(t *testing.T) {
	ctx := context.Background()
	t.Run("unreachable", func(t *testing.T) {
		d := newDecider(t, policy.Default())
		d.srv.Store = down{d.store}
		_, err := d.attempt(d.conv).decide(ctx, fp1)
		if !errors.Is(err, errDown) || !unreachable(err) {
			t.Fatalf("err %v, unreachable %v", err, unreachable(err))
		}
	})
	t.Run("encrypt without a key ring", func(t *testing.T) {
		pol := policy.Default()
		pol.Encrypt = true
		d := newDecider(t, pol)
		_, err := d.attempt(d.conv).decide(ctx, fp1)
		if err == nil || unreachable(err) || err.Error() != "policy asks for encryption and the server has no key ring" {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("sealed response opens", func(t *testing.T) {
		pol := policy.Default()
		pol.Encrypt = true
		d := newDecider(t, pol)
		d.srv.Sealer = sealer{}
		d.first(t, fp1).settleStored(ctx, idem.Response{Status: 201, Body: []byte("ok")})
		res, err := d.attempt(d.conv).decide(ctx, fp1)
		if err != nil || res.Outcome != idem.Completed || res.Response.Sealed || string(res.Response.Body) != "ok" {
			t.Fatalf("res %+v err %v", res.Response, err)
		}
	})
	t.Run("sealed response does not open", func(t *testing.T) {
		pol := policy.Default()
		pol.Encrypt = true
		d := newDecider(t, pol)
		d.srv.Sealer = sealer{}
		d.first(t, fp1).settleStored(ctx, idem.Response{Status: 201, Body: []byte("tampered")})
		_, err := d.attempt(d.conv).decide(ctx, fp1)
		if err == nil || unreachable(err) {
			t.Fatalf("err %v", err)
		}
	})
}

// TestShadowDecisionTable: a shadow policy's attempt reports what
// enforcement would have done, and never waits.
func TestShadowDecisionTable(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, d *decider)
		fp     idem.Fingerprint
		down   bool
		want   idem.ShadowDecision
	}{
		{"first", func(*testing.T, *decider) {}, fp1, false, idem.ShadowWouldReserve},
		{"in flight", func(t *testing.T, d *decider) { d.first(t, fp1) }, fp1, false, idem.ShadowWouldConflict},
		{"differs", func(t *testing.T, d *decider) { d.first(t, fp1) }, fp2, false, idem.ShadowWouldMismatch},
		{"completed", func(t *testing.T, d *decider) {
			d.first(t, fp1).settleStored(ctx, idem.Response{Status: 201})
		}, fp1, false, idem.ShadowWouldReplay},
		{"unknown", func(t *testing.T, d *decider) {
			d.first(t, fp1).settle(ctx, idem.ActionUnknown)
		}, fp1, false, idem.ShadowWouldUnknown},
		{"store down", func(*testing.T, *decider) {}, fp1, true, idem.ShadowStoreError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := policy.Default()
			pol.Enforcement, pol.WaitForInFlight = policy.EnforcementShadow, time.Minute
			d := newDecider(t, pol)
			tc.before(t, d)
			if tc.down {
				d.srv.Store = down{d.store}
			}
			got, err := d.attempt(d.conv).decideShadow(ctx, tc.fp)
			if got != tc.want || (err != nil) != tc.down {
				t.Fatalf("shadow decision %v (err %v), want %v", got, err, tc.want)
			}
			if len(d.conv.waits) != 0 {
				t.Fatalf("a shadow attempt waited %v", d.conv.waits)
			}
		})
	}
}

// Package storetest is the contract suite every idem.Store must pass. The
// in-memory store and the Redis store (standalone, Sentinel, Cluster) all
// run it, so they cannot drift apart.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// NewStore returns a fresh, empty store for one subtest.
type NewStore func(t *testing.T) idem.Store

// Timing is how long the suite waits for leases and retention to pass.
// Stores judge time by their own clock (Redis TIME), so the suite sleeps
// rather than injecting a clock; the margins are wide so a loaded machine
// does not make it flaky.
const (
	shortLease = 150 * time.Millisecond
	pastLease  = 400 * time.Millisecond
	longLease  = time.Minute
	retention  = time.Hour
)

var (
	fpA = idem.Fingerprint{1}
	fpB = idem.Fingerprint{2}
)

func reservation(id idem.RecordID, fp idem.Fingerprint, tok idem.Token, lease time.Duration) idem.Reservation {
	return idem.Reservation{ID: id, Fingerprint: fp, Token: tok, Lease: lease, Retention: retention}
}

var idSeq atomic.Int64

func newID() idem.RecordID {
	return idem.RecordIDFor("contract", "scope", fmt.Sprintf("key-%d-%d", time.Now().UnixNano(), idSeq.Add(1)))
}

// Run runs the contract suite against stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newStore(t))
		})
	}
}

type contractCase struct {
	name string
	run  func(t *testing.T, s idem.Store)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustReserve(t *testing.T, s idem.Store, r idem.Reservation, want idem.Outcome, wantAttempt int) idem.ReserveResult {
	t.Helper()
	res, err := s.Reserve(ctx(t), r)
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	if res.Outcome != want || res.Attempt != wantAttempt {
		t.Fatalf("Reserve = %v attempt %d, want %v attempt %d", res.Outcome, res.Attempt, want, wantAttempt)
	}
	return res
}

// cancelHold is the hold the suite's cancels ask for, unless a case is
// about its end.
const cancelHold = time.Minute

func mustCancel(t *testing.T, s idem.Store, id idem.RecordID, tok idem.Token, want idem.CancelResult) {
	t.Helper()
	got, err := s.Cancel(ctx(t), id, tok, cancelHold)
	if err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if got != want {
		t.Fatalf("Cancel = %v, want %v", got, want)
	}
}

func wantErr(t *testing.T, op string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %v, want %v", op, err, want)
	}
}

func sampleResponse() idem.Response {
	return idem.Response{
		Status: 201,
		Headers: []idem.Header{
			{Name: "content-type", Value: "application/json"},
			{Name: "x-dup", Value: "1"},
			{Name: "x-dup", Value: "2"},
			{Name: "x-empty", Value: ""},
			{Name: "location", Value: "/orders/42"},
		},
		// Binary and NUL bytes must survive storage unchanged.
		Body: []byte("{\"id\":42}\x00\xff\xfe binary tail"),
	}
}

var cases = []contractCase{
	{"first reserve wins and is attempt 1", func(t *testing.T, s idem.Store) {
		id := newID()
		res := mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Reserved, 1)
		if res.CreatedAt.IsZero() {
			t.Error("CreatedAt not set")
		}
		rec, err := s.Get(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateInFlight || rec.Fingerprint != fpA || rec.Attempts != 1 {
			t.Fatalf("record = %+v", rec)
		}
		if !rec.LeaseUntil.After(time.Now().Add(longLease / 2)) {
			t.Errorf("lease until %v, want about a minute ahead", rec.LeaseUntil)
		}
	}},
	{"same token again is still reserved", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
	}},
	{"second attempt while in flight", func(t *testing.T, s idem.Store) {
		id := newID()
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Reserved, 1)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.InFlight, 2)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.InFlight, 3)
	}},
	{"different fingerprint is a mismatch in every state", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		mustReserve(t, s, reservation(id, fpB, idem.NewToken(), longLease), idem.Mismatch, 0)
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		res := mustReserve(t, s, reservation(id, fpB, idem.NewToken(), longLease), idem.Mismatch, 0)
		if res.Response != nil {
			t.Fatal("a mismatch must not carry the stored response")
		}
		rec, _ := s.Get(ctx(t), id)
		if rec.Attempts != 1 {
			t.Fatalf("attempts = %d: a mismatch is not an attempt of the operation", rec.Attempts)
		}
		id2, tok2 := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id2, fpA, tok2, longLease), idem.Reserved, 1)
		if err := s.MarkUnknown(ctx(t), id2, tok2, retention); err != nil {
			t.Fatal(err)
		}
		mustReserve(t, s, reservation(id2, fpB, idem.NewToken(), longLease), idem.Mismatch, 0)
	}},
	{"completed record replays byte for byte", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		want := sampleResponse()
		if err := s.Complete(ctx(t), id, tok, want, retention); err != nil {
			t.Fatal(err)
		}
		for attempt := 2; attempt <= 3; attempt++ {
			res := mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, attempt)
			assertResponse(t, res.Response, want)
		}
		rec, err := s.Get(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateCompleted || rec.Attempts != 3 {
			t.Fatalf("record = %v, %d attempts", rec.State, rec.Attempts)
		}
		assertResponse(t, rec.Response, want)
	}},
	{"empty, omitted, sealed and compressed bodies are kept apart", func(t *testing.T, s idem.Store) {
		for _, want := range []idem.Response{
			{Status: 204},
			{Status: 200, Headers: []idem.Header{{Name: "content-type", Value: "text/plain"}}, BodyOmitted: true},
			{Status: 201, Body: []byte("\x01sealed-envelope"), Sealed: true},
			{Status: 201, Body: []byte("\x01sealed-headers-only"), Sealed: true, BodyOmitted: true},
			{Status: 201, Body: []byte("\x01compressed-frame"), Compressed: true},
			{Status: 201, Body: []byte("\x02sealed-compressed"), Sealed: true, Compressed: true},
		} {
			id, tok := newID(), idem.NewToken()
			mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
			if err := s.Complete(ctx(t), id, tok, want, retention); err != nil {
				t.Fatal(err)
			}
			res := mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, 2)
			assertResponse(t, res.Response, want)
		}
	}},
	{"complete is token checked and repeatable", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		wantErr(t, "Complete of a missing record", s.Complete(ctx(t), id, tok, sampleResponse(), retention), idem.ErrNotFound)
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		wantErr(t, "Complete by another token", s.Complete(ctx(t), id, idem.NewToken(), sampleResponse(), retention), idem.ErrNotHolder)
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		other := idem.Response{Status: 500}
		if err := s.Complete(ctx(t), id, tok, other, retention); err != nil {
			t.Fatalf("repeated Complete: %v", err)
		}
		res := mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, 2)
		assertResponse(t, res.Response, sampleResponse()) // the first completion stands
	}},
	// The Redis client retries a call whose reply was lost (docs/redis.md,
	// "Budgets and retries"): each transition, repeated by its own token,
	// must change nothing more.
	{"renew and mark unknown are repeatable", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		for i := range 2 {
			if err := s.Renew(ctx(t), id, tok, longLease); err != nil {
				t.Fatalf("Renew %d: %v", i+1, err)
			}
		}
		for i := range 2 {
			if err := s.MarkUnknown(ctx(t), id, tok, retention); err != nil {
				t.Fatalf("MarkUnknown %d: %v", i+1, err)
			}
		}
		rec, err := s.Get(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateUnknown || rec.Attempts != 1 || rec.Token != tok {
			t.Fatalf("after repeated transitions: state %v, attempts %d", rec.State, rec.Attempts)
		}
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Unknown, 2)
	}},
	{"release frees the key for the next attempt", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		wantErr(t, "Release by another token", s.Release(ctx(t), id, idem.NewToken()), idem.ErrNotHolder)
		if err := s.Release(ctx(t), id, tok); err != nil {
			t.Fatal(err)
		}
		wantErr(t, "Get after Release", getErr(t, s, id), idem.ErrNotFound)
		wantErr(t, "second Release", s.Release(ctx(t), id, tok), idem.ErrNotFound)
		mustReserve(t, s, reservation(id, fpB, idem.NewToken(), longLease), idem.Reserved, 1)
	}},
	{"a completed record is never released or marked unknown", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		wantErr(t, "Release", s.Release(ctx(t), id, tok), idem.ErrNotHolder)
		wantErr(t, "MarkUnknown", s.MarkUnknown(ctx(t), id, tok, retention), idem.ErrNotHolder)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, 2)
	}},
	{"mark unknown answers unknown to later attempts", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		wantErr(t, "MarkUnknown by another token", s.MarkUnknown(ctx(t), id, idem.NewToken(), retention), idem.ErrNotHolder)
		if err := s.MarkUnknown(ctx(t), id, tok, retention); err != nil {
			t.Fatal(err)
		}
		if err := s.MarkUnknown(ctx(t), id, tok, retention); err != nil {
			t.Fatalf("repeated MarkUnknown: %v", err)
		}
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Unknown, 2)
		wantErr(t, "Renew of an unknown record", s.Renew(ctx(t), id, tok, longLease), idem.ErrNotHolder)
		// The attempt that held it may still report the answer it got.
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, 3)
	}},
	{"an expired lease is not a free key", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, shortLease), idem.Reserved, 1)
		time.Sleep(pastLease)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Unknown, 2)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Unknown, 3)
		rec, err := s.Get(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateUnknown {
			t.Fatalf("state = %v, want unknown", rec.State)
		}
		// The original holder's late answer still completes it.
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, 4)
	}},
	{"an expired lease can be taken over when the policy re-executes", func(t *testing.T, s idem.Store) {
		id, old := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, old, shortLease), idem.Reserved, 1)
		time.Sleep(pastLease)
		r := reservation(id, fpA, idem.NewToken(), longLease)
		r.LeaseExpiry = idem.LeaseExpiryReexecute
		mustReserve(t, s, r, idem.Reserved, 2)
		wantErr(t, "Complete by the replaced token", s.Complete(ctx(t), id, old, sampleResponse(), retention), idem.ErrNotHolder)
		wantErr(t, "Renew by the replaced token", s.Renew(ctx(t), id, old, longLease), idem.ErrNotHolder)
		if err := s.Complete(ctx(t), id, r.Token, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
	}},
	{"a live lease is not taken over even when the policy re-executes", func(t *testing.T, s idem.Store) {
		id := newID()
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Reserved, 1)
		r := reservation(id, fpA, idem.NewToken(), longLease)
		r.LeaseExpiry = idem.LeaseExpiryReexecute
		mustReserve(t, s, r, idem.InFlight, 2)
	}},
	{"renew keeps a lease alive", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		wantErr(t, "Renew of a missing record", s.Renew(ctx(t), id, tok, longLease), idem.ErrNotFound)
		mustReserve(t, s, reservation(id, fpA, tok, shortLease), idem.Reserved, 1)
		wantErr(t, "Renew by another token", s.Renew(ctx(t), id, idem.NewToken(), longLease), idem.ErrNotHolder)
		if err := s.Renew(ctx(t), id, tok, longLease); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pastLease)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.InFlight, 2)
	}},
	{"retention ends a record", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		r := reservation(id, fpA, tok, longLease)
		mustReserve(t, s, r, idem.Reserved, 1)
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), 150*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pastLease)
		wantErr(t, "Get after retention", getErr(t, s, id), idem.ErrNotFound)
		mustReserve(t, s, reservation(id, fpB, idem.NewToken(), longLease), idem.Reserved, 1)
	}},
	{"records are independent", func(t *testing.T, s idem.Store) {
		a, b := newID(), newID()
		tokA := idem.NewToken()
		mustReserve(t, s, reservation(a, fpA, tokA, longLease), idem.Reserved, 1)
		mustReserve(t, s, reservation(b, fpA, idem.NewToken(), longLease), idem.Reserved, 1)
		wantErr(t, "Complete of b with a's token", s.Complete(ctx(t), b, tokA, sampleResponse(), retention), idem.ErrNotHolder)
	}},
	{"concurrent reservations have one winner", func(t *testing.T, s idem.Store) {
		id := newID()
		const n = 50
		var wg sync.WaitGroup
		var reserved, inFlight atomic.Int32
		errs := make(chan error, n)
		for range n {
			wg.Go(func() {
				res, err := s.Reserve(ctx(t), reservation(id, fpA, idem.NewToken(), longLease))
				switch {
				case err != nil:
					errs <- err
				case res.Outcome == idem.Reserved:
					reserved.Add(1)
				case res.Outcome == idem.InFlight:
					inFlight.Add(1)
				default:
					errs <- fmt.Errorf("outcome %v", res.Outcome)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if reserved.Load() != 1 || inFlight.Load() != n-1 {
			t.Fatalf("reserved %d, in flight %d; want 1 and %d", reserved.Load(), inFlight.Load(), n-1)
		}
		rec, _ := s.Get(ctx(t), id)
		if rec.Attempts != n {
			t.Fatalf("attempts = %d, want %d", rec.Attempts, n)
		}
	}},
	// Cancel: an attempt gave up on its Reserve without knowing whether it
	// reached the store, and never let its request through. Whichever
	// arrives first, no reservation by its token may remain.
	{"cancel before the reservation arrives refuses it", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustCancel(t, s, id, tok, idem.CancelNotHeld)
		mustCancel(t, s, id, tok, idem.CancelNotHeld) // repeatable
		_, err := s.Reserve(ctx(t), reservation(id, fpA, tok, longLease))
		wantErr(t, "Reserve after its Cancel", err, idem.ErrCancelled)
		wantErr(t, "Get after a refused Reserve", getErr(t, s, id), idem.ErrNotFound)
		// The next attempt, with its own token, runs the operation.
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Reserved, 1)
	}},
	{"cancel after the reservation arrived releases it", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		mustCancel(t, s, id, tok, idem.CancelReleased)
		wantErr(t, "Get after Cancel", getErr(t, s, id), idem.ErrNotFound)
		// A second copy of the same reservation (a client's retry of the
		// command) arriving now changes nothing either.
		_, err := s.Reserve(ctx(t), reservation(id, fpA, tok, longLease))
		wantErr(t, "Reserve after its Cancel", err, idem.ErrCancelled)
		mustCancel(t, s, id, tok, idem.CancelNotHeld)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Reserved, 1)
	}},
	{"cancel never touches another token's record", func(t *testing.T, s idem.Store) {
		id, holder, other := newID(), idem.NewToken(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, holder, longLease), idem.Reserved, 1)
		mustCancel(t, s, id, other, idem.CancelNotHeld)
		rec, err := s.Get(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateInFlight || rec.Token != holder || rec.Attempts != 1 {
			t.Fatalf("after another token's Cancel: state %v, attempts %d, holder kept %v", rec.State, rec.Attempts, rec.Token == holder)
		}
		// Only the cancelled token is refused; the holder goes on.
		_, err = s.Reserve(ctx(t), reservation(id, fpA, other, longLease))
		wantErr(t, "Reserve by the cancelled token", err, idem.ErrCancelled)
		mustReserve(t, s, reservation(id, fpA, holder, longLease), idem.Reserved, 1)
		if err := s.Complete(ctx(t), id, holder, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, 2)
	}},
	{"cancel of a completed record does nothing", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		mustCancel(t, s, id, tok, idem.CancelNotHeld)
		res := mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, 2)
		assertResponse(t, res.Response, sampleResponse())
	}},
	{"cancel releases a record its lease turned unknown", func(t *testing.T, s idem.Store) {
		// The reservation landed after its attempt gave up; nobody renewed
		// it, and the next attempt found its lease over. Nothing ran.
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, shortLease), idem.Reserved, 1)
		time.Sleep(pastLease)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Unknown, 2)
		mustCancel(t, s, id, tok, idem.CancelReleased)
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Reserved, 1)
	}},
	{"a cancel's hold ends", func(t *testing.T, s idem.Store) {
		// The hold bounds what a cancelled token costs the store, and how
		// late a reservation may arrive and still be refused.
		id, tok := newID(), idem.NewToken()
		if _, err := s.Cancel(ctx(t), id, tok, shortLease); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pastLease)
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
	}},
	{"watch wakes when an in-flight record settles", func(t *testing.T, s idem.Store) {
		w, ok := s.(idem.Watcher)
		if !ok {
			t.Fatal("every store must implement idem.Watcher")
		}
		settle := map[string]func(idem.Store, idem.RecordID, idem.Token) error{
			"complete": func(s idem.Store, id idem.RecordID, tok idem.Token) error {
				return s.Complete(ctx(t), id, tok, sampleResponse(), retention)
			},
			"release": func(s idem.Store, id idem.RecordID, tok idem.Token) error { return s.Release(ctx(t), id, tok) },
			"cancel": func(s idem.Store, id idem.RecordID, tok idem.Token) error {
				_, err := s.Cancel(ctx(t), id, tok, longLease)
				return err
			},
			"mark unknown": func(s idem.Store, id idem.RecordID, tok idem.Token) error {
				return s.MarkUnknown(ctx(t), id, tok, retention)
			},
		}
		for name, f := range settle {
			id, tok := newID(), idem.NewToken()
			mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
			changed, stop, err := w.Watch(ctx(t), id)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-changed:
				t.Fatalf("%s: woke before anything happened", name)
			case <-time.After(50 * time.Millisecond):
			}
			// A renewal is not a settlement.
			if err := s.Renew(ctx(t), id, tok, longLease); err != nil {
				t.Fatal(err)
			}
			if err := f(s, id, tok); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			select {
			case <-changed:
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: the watch did not wake", name)
			}
			stop()
		}
		// A record already settled, or absent, wakes at once.
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		for _, target := range []idem.RecordID{id, newID()} {
			changed, stop, err := w.Watch(ctx(t), target)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-changed:
			case <-time.After(5 * time.Second):
				t.Fatal("a settled or absent record must wake at once")
			}
			stop()
		}
		// Many watchers of one record all wake.
		id, tok = newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		var chans []<-chan struct{}
		for range 10 {
			changed, stop, err := w.Watch(ctx(t), id)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			chans = append(chans, changed)
		}
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		for i, c := range chans {
			select {
			case <-c:
			case <-time.After(5 * time.Second):
				t.Fatalf("watcher %d did not wake", i)
			}
		}
	}},
	{"an operator purges and resolves records", func(t *testing.T, s idem.Store) {
		a, ok := s.(idem.Admin)
		if !ok {
			t.Fatal("every store must implement idem.Admin")
		}
		// Purge works in any state.
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		if err := a.Purge(ctx(t), id); err != nil {
			t.Fatal(err)
		}
		wantErr(t, "Purge of a missing record", a.Purge(ctx(t), id), idem.ErrNotFound)
		wantErr(t, "Complete after Purge", s.Complete(ctx(t), id, tok, sampleResponse(), retention), idem.ErrNotFound)
		// Resolve applies to unknown records only.
		id, tok = newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		wantErr(t, "Resolve of an in-flight record", a.Resolve(ctx(t), id, nil, retention), idem.ErrNotUnknown)
		wantErr(t, "Resolve of a missing record", a.Resolve(ctx(t), newID(), nil, retention), idem.ErrNotFound)
		if err := s.MarkUnknown(ctx(t), id, tok, retention); err != nil {
			t.Fatal(err)
		}
		want := sampleResponse()
		if err := a.Resolve(ctx(t), id, &want, retention); err != nil {
			t.Fatal(err)
		}
		res := mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Completed, 2)
		assertResponse(t, res.Response, want)
		wantErr(t, "Resolve of a completed record", a.Resolve(ctx(t), id, nil, retention), idem.ErrNotUnknown)
		// Released by the operator: the next attempt runs.
		id, tok = newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		if err := s.MarkUnknown(ctx(t), id, tok, retention); err != nil {
			t.Fatal(err)
		}
		if err := a.Resolve(ctx(t), id, nil, retention); err != nil {
			t.Fatal(err)
		}
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), longLease), idem.Reserved, 1)
	}},
	{"a hand-over leaves a tombstone that sends later reservations on", func(t *testing.T, s idem.Store) {
		id := newID()
		hand := reservation(id, fpA, idem.NewToken(), longLease)
		hand.HandOverTo = "region-b"
		res, err := s.Reserve(ctx(t), hand)
		if err != nil || res.Outcome != idem.HandedOver || res.Home != "region-b" {
			t.Fatalf("hand-over of an absent key = %+v, %v; want handed_over to region-b", res, err)
		}
		// A server still on the older map: sent on, nothing reserved.
		tok := idem.NewToken()
		res, err = s.Reserve(ctx(t), reservation(id, fpB, tok, longLease))
		if err != nil || res.Outcome != idem.Moved || res.Home != "region-b" {
			t.Fatalf("reserve after the hand-over = %+v, %v; want moved to region-b", res, err)
		}
		rec, err := s.Get(ctx(t), id)
		if err != nil || rec.State != idem.StateMoved || rec.Home != "region-b" {
			t.Fatalf("Get of the tombstone = %+v, %v", rec, err)
		}
		// The tombstone is nobody's reservation.
		wantErr(t, "Complete on a tombstone", s.Complete(ctx(t), id, tok, sampleResponse(), retention), idem.ErrNotHolder)
		wantErr(t, "Release on a tombstone", s.Release(ctx(t), id, tok), idem.ErrNotHolder)
		wantErr(t, "MarkUnknown on a tombstone", s.MarkUnknown(ctx(t), id, tok, retention), idem.ErrNotHolder)
		wantErr(t, "Renew on a tombstone", s.Renew(ctx(t), id, tok, longLease), idem.ErrNotHolder)
		mustCancel(t, s, id, tok, idem.CancelNotHeld)
		// The same hand-over again (a retry, or another attempt): harmless.
		hand.Token = idem.NewToken()
		if res, err = s.Reserve(ctx(t), hand); err != nil || res.Outcome != idem.HandedOver {
			t.Fatalf("second hand-over = %+v, %v; want handed_over", res, err)
		}
		// A hand-over to a third region is refused: the maps disagree.
		hand.HandOverTo = "region-c"
		if res, err = s.Reserve(ctx(t), hand); err != nil || res.Outcome != idem.Moved || res.Home != "region-b" {
			t.Fatalf("hand-over to another region = %+v, %v; want moved to region-b", res, err)
		}
	}},
	{"a hand-over reports the record it finds and leaves it", func(t *testing.T, s idem.Store) {
		id, tok := newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		hand := reservation(id, fpA, idem.NewToken(), longLease)
		hand.HandOverTo = "region-b"
		mustReserve(t, s, hand, idem.InFlight, 2)
		mismatch := hand
		mismatch.Fingerprint = fpB
		mustReserve(t, s, mismatch, idem.Mismatch, 0)
		// The holder is still the holder: its answer completes the record
		// where it was reserved.
		if err := s.Complete(ctx(t), id, tok, sampleResponse(), retention); err != nil {
			t.Fatal(err)
		}
		res := mustReserve(t, s, hand, idem.Completed, 3)
		assertResponse(t, res.Response, sampleResponse())
		// An unknown record stays unknown.
		id, tok = newID(), idem.NewToken()
		mustReserve(t, s, reservation(id, fpA, tok, longLease), idem.Reserved, 1)
		if err := s.MarkUnknown(ctx(t), id, tok, retention); err != nil {
			t.Fatal(err)
		}
		hand.ID = id
		mustReserve(t, s, hand, idem.Unknown, 2)
	}},
	{"a hand-over of an expired lease follows the lease expiry rule", func(t *testing.T, s idem.Store) {
		// Under LeaseExpiryUnknown the record turns unknown, as for a
		// reservation; under LeaseExpiryReexecute the key is free, so the
		// tombstone takes its place.
		id := newID()
		mustReserve(t, s, reservation(id, fpA, idem.NewToken(), shortLease), idem.Reserved, 1)
		reexec := newID()
		mustReserve(t, s, reservation(reexec, fpA, idem.NewToken(), shortLease), idem.Reserved, 1)
		time.Sleep(2 * shortLease)
		hand := reservation(id, fpA, idem.NewToken(), longLease)
		hand.HandOverTo = "region-b"
		mustReserve(t, s, hand, idem.Unknown, 2)
		hand.ID, hand.LeaseExpiry = reexec, idem.LeaseExpiryReexecute
		res, err := s.Reserve(ctx(t), hand)
		if err != nil || res.Outcome != idem.HandedOver {
			t.Fatalf("hand-over of a free key = %+v, %v; want handed_over", res, err)
		}
	}},
	{"ping answers", func(t *testing.T, s idem.Store) {
		if err := s.Ping(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}},
}

func getErr(t *testing.T, s idem.Store, id idem.RecordID) error {
	_, err := s.Get(ctx(t), id)
	return err
}

func assertResponse(t *testing.T, got *idem.Response, want idem.Response) {
	t.Helper()
	if got == nil {
		t.Fatal("no response")
	}
	if got.Status != want.Status || got.BodyOmitted != want.BodyOmitted || got.Sealed != want.Sealed ||
		got.Compressed != want.Compressed || string(got.Body) != string(want.Body) {
		t.Fatalf("response = %d %q omitted=%v sealed=%v compressed=%v, want %d %q omitted=%v sealed=%v compressed=%v",
			got.Status, got.Body, got.BodyOmitted, got.Sealed, got.Compressed,
			want.Status, want.Body, want.BodyOmitted, want.Sealed, want.Compressed)
	}
	if len(got.Headers) != len(want.Headers) {
		t.Fatalf("headers = %v, want %v", got.Headers, want.Headers)
	}
	for i := range want.Headers {
		if got.Headers[i] != want.Headers[i] {
			t.Fatalf("header %d = %v, want %v", i, got.Headers[i], want.Headers[i])
		}
	}
}

package attempt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// unusable is a store the attempt can reach but not use: the policy seals
// and the server has no key ring, or a stored response does not open. The
// request is then refused whatever the policy's failure_mode: fail_open is
// for a store that cannot be asked, not for one whose answer cannot be
// trusted. Its text is the cause's, as logged.
type unusable struct{ err error }

func (e unusable) Error() string { return e.err.Error() }
func (e unusable) Unwrap() error { return e.err }

// Unreachable reports whether an error from Decide means the store could
// not be asked (so fail_open may pass the request), rather than that it
// could not be used.
func Unreachable(err error) bool {
	var u unusable
	return !errors.As(err, &u)
}

var errNoKeyRing = errors.New("policy asks for encryption and the server has no key ring")

// Decide is the request-time decision (docs/design.md §3) for a complete
// request's fingerprint: it reserves the record for a new token; a
// completed record's response is opened when sealed. A duplicate of an
// attempt in flight is returned as such: whether it waits for that attempt
// is Request's to say (waits), and the wait is awaitFirst. An error means
// no answer: the store could not be asked or used (Unreachable tells
// which).
//
// After an error the request goes on only under a policy that fails open
// (and only when Unreachable): otherwise the caller refuses it (503), and
// Decide has already started undoing the reservation the failed call may
// still make (cancel.go). Under fail_open the request runs unprotected, so
// such a reservation is left to turn unknown: the effect may have
// happened.
func (a *Attempt) Decide(ctx context.Context, fp idem.Fingerprint) (idem.ReserveResult, error) {
	a.Token = idem.NewToken()
	if a.Policy.Encrypt && a.srv.Sealer == nil {
		// The response could not be stored as the policy demands: refuse
		// before anything runs. (The daemon refuses such a configuration;
		// this guards other embeddings.)
		return idem.ReserveResult{}, unusable{errNoKeyRing}
	}
	res, err := a.reserve(ctx, fp)
	if err == nil {
		err = homeElsewhere(res)
	}
	if err != nil {
		if a.Policy.FailureMode != policy.FailOpen {
			a.giveUp(ctx, err)
		}
		return res, err
	}
	a.Number = res.Attempt
	return a.opened(res)
}

// waits reports whether a duplicate of an attempt in flight waits for it
// (wait_for_in_flight, with a store that can watch), and for how long the
// proxy must then give the request's message: the wait plus two store
// calls.
func (a *Attempt) waits(res idem.ReserveResult) (time.Duration, bool) {
	if res.Outcome != idem.InFlight || a.Policy.WaitForInFlight <= 0 {
		return 0, false
	}
	if _, ok := a.store.(idem.Watcher); !ok {
		return 0, false
	}
	return a.Policy.WaitForInFlight + 2*a.budget, true
}

// opened gives a completed record's response as it is replayed: opened
// when sealed, then expanded when compressed (it is compressed before it
// is sealed). A stored response that does not open (tampered, or its key
// left the ring) or does not expand is never replayed, and the key is not
// free.
func (a *Attempt) opened(res idem.ReserveResult) (idem.ReserveResult, error) {
	if res.Outcome != idem.Completed {
		return res, nil
	}
	if res.Response.Sealed {
		opened, err := a.open(*res.Response)
		if err != nil {
			return res, unusable{err}
		}
		res.Response = &opened
	}
	if res.Response.Compressed {
		expanded, err := a.expand(*res.Response)
		if err != nil {
			return res, unusable{err}
		}
		res.Response = &expanded
	}
	return res, nil
}

// expand gives back the headers and body a compressed record holds.
func (a *Attempt) expand(r idem.Response) (idem.Response, error) {
	c := a.Policy.Compression.Codec
	if c == nil {
		return idem.Response{}, errors.New("a stored response is compressed and the policy has no compression codec")
	}
	return c.Expand(r, a.Policy.MaxExpanded())
}

// homeElsewhere turns the outcomes of a store that no longer arbitrates
// the key into an error: without a finder that follows the key to its
// new home (Server.Homes), this server cannot ask the store that does.
func homeElsewhere(res idem.ReserveResult) error {
	if res.Outcome == idem.Moved || res.Outcome == idem.HandedOver {
		return fmt.Errorf("the key is arbitrated in region %q, which this server's store does not reach", res.Home)
	}
	return nil
}

func (a *Attempt) open(r idem.Response) (idem.Response, error) {
	if a.srv.Sealer == nil {
		return idem.Response{}, errors.New("a stored response is sealed and the server has no key ring")
	}
	return a.srv.Sealer.Open(a.ID, r)
}

// reserve asks the store for the record, with the policy's lease,
// retention and durability.
func (a *Attempt) reserve(ctx context.Context, fp idem.Fingerprint) (idem.ReserveResult, error) {
	sctx, cancel := a.StoreCtx(ctx)
	defer cancel()
	waitReplicas, waitTimeout := a.Policy.WaitReplicas()
	return a.store.Reserve(sctx, idem.Reservation{
		ID:           a.ID,
		Fingerprint:  fp,
		Token:        a.Token,
		Lease:        a.Policy.Lease,
		Retention:    a.Policy.Retention,
		LeaseExpiry:  a.Policy.LeaseExpiry,
		WaitReplicas: waitReplicas,
		WaitTimeout:  waitTimeout,
	})
}

// awaitFirst lets a duplicate wait, up to the policy's wait_for_in_flight,
// for the attempt that holds the record to settle, woken by the store
// rather than polling it. It returns what the duplicate should be told:
// the replay once the first attempt completed (opened when sealed), a
// fresh reservation if it was released, or the outcome found when the wait
// ends.
func (a *Attempt) awaitFirst(ctx context.Context, fp idem.Fingerprint, first idem.ReserveResult) (idem.ReserveResult, error) {
	w := a.store.(idem.Watcher) // waits checked it
	wctx, cancel := context.WithTimeout(ctx, a.Policy.WaitForInFlight)
	defer cancel()
	for {
		changed, stop, err := w.Watch(wctx, a.ID)
		if err != nil {
			return first, nil
		}
		select {
		case <-changed:
		case <-wctx.Done():
		}
		stop()
		if res, done := a.reread(ctx, fp, first); done {
			return a.opened(res)
		}
		if wctx.Err() != nil {
			return first, nil // still in flight when the wait ran out: 409
		}
	}
}

// reread reads the record a duplicate waits for once the store said it
// may have settled, and reports what to answer if it did.
func (a *Attempt) reread(ctx context.Context, fp idem.Fingerprint, first idem.ReserveResult) (idem.ReserveResult, bool) {
	sctx, scancel := a.StoreCtx(ctx)
	rec, err := a.store.Get(sctx, a.ID)
	scancel()
	switch {
	case errors.Is(err, idem.ErrNotFound):
		// Released (the upstream asked for a retry): this attempt may run
		// the operation now.
		res, err := a.reserve(ctx, fp)
		if err != nil {
			// The duplicate is answered 409, as when the wait began; a
			// reservation this call may still make is undone.
			a.giveUp(ctx, err)
			return first, true
		}
		return res, true
	case err != nil:
		return first, true
	case rec.Fingerprint != fp:
		return idem.ReserveResult{Outcome: idem.Mismatch}, true
	case rec.State == idem.StateCompleted:
		return idem.ReserveResult{Outcome: idem.Completed, Attempt: first.Attempt, Response: rec.Response, CreatedAt: rec.CreatedAt}, true
	case rec.State == idem.StateMoved:
		return first, true // handed over meanwhile: the first answer stands
	case rec.State == idem.StateUnknown:
		return idem.ReserveResult{Outcome: idem.Unknown, Attempt: first.Attempt, CreatedAt: rec.CreatedAt}, true
	}
	return first, false
}

// DecideShadow makes the decision an enforcing policy would make, against
// the shadow key space (policy.RecordNamespace), and reports it: the
// request goes on whatever it is (docs/design.md §9).
//
// A first attempt holds its reservation as an enforced one does (the
// caller calls Hold), so its response completes the record and later
// duplicates are measured against it. A duplicate holds nothing: the
// upstream runs it again (that is what shadow means) and its own response
// stores nothing, so it never overwrites the first one's record. It does
// not wait for an attempt in flight either (wait_for_in_flight): shadow
// adds no latency beyond the reservation. A store that cannot be asked or
// used is ShadowStoreError, with the error; the request goes on all the
// same, so a reservation the failed call may still make is not cancelled
// (cancel.go): the upstream ran.
func (a *Attempt) DecideShadow(ctx context.Context, fp idem.Fingerprint) (idem.ShadowDecision, error) {
	a.Token = idem.NewToken()
	if a.Policy.Encrypt && a.srv.Sealer == nil {
		return idem.ShadowStoreError, errNoKeyRing
	}
	res, err := a.reserve(ctx, fp)
	if err == nil {
		err = homeElsewhere(res)
	}
	if err != nil {
		return idem.ShadowStoreError, err
	}
	a.Number = res.Attempt
	return idem.ShadowDecisionFor(res.Outcome), nil
}

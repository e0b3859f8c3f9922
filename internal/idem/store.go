package idem

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound: no record exists under the id.
var ErrNotFound = errors.New("idem: record not found")

// ErrNotHolder: the token no longer holds the record (it was taken over,
// completed, released or purged). The caller's transition was not applied.
var ErrNotHolder = errors.New("idem: reservation not held by this token")

// ErrNotDurable: the store made the reservation but could not confirm it
// reached the replicas the Reservation asked for (WaitReplicas), so a
// failover could lose it. The store has released it again (or tried to);
// the caller must treat the call like a store failure and never let the
// request through as protected.
var ErrNotDurable = errors.New("idem: reservation not confirmed by enough replicas")

// ErrCancelled: the reservation's token was cancelled (Store.Cancel)
// before the reservation reached the store. Nothing was reserved; the
// attempt that asked had given up on it already.
var ErrCancelled = errors.New("idem: reservation cancelled by its own attempt before it reached the store")

// ErrRefused wraps a store error that proves the call changed nothing and
// never will: the store refused it before acting (the in-memory store when
// full or when the caller's context had ended). A Reserve that failed so
// leaves nothing to cancel.
var ErrRefused = errors.New("idem: refused before any change")

// ErrDamaged wraps a store error that says the value under the record's
// id is none the store writes: cut short, of another type, or not
// decodable. It tells nothing about the request, so it is never answered
// as a mismatch or replayed; a Reserve that met it reserved nothing.
var ErrDamaged = errors.New("idem: stored record is damaged")

// LeaseExpiry says what an expired lease means.
type LeaseExpiry uint8

const (
	// LeaseExpiryUnknown turns an in-flight record whose lease passed into
	// StateUnknown: its holder vanished and nobody knows if the effect
	// happened. This is the safe default.
	LeaseExpiryUnknown LeaseExpiry = iota
	// LeaseExpiryReexecute lets the next attempt take the record over and
	// run again. Only for operations the upstream can safely repeat.
	LeaseExpiryReexecute
)

// Reservation asks a store to reserve a record for one attempt.
type Reservation struct {
	ID          RecordID
	Fingerprint Fingerprint
	Token       Token
	// Lease bounds how long the reservation stands without renewal.
	Lease time.Duration
	// Retention bounds how long the record is kept at all.
	Retention   time.Duration
	LeaseExpiry LeaseExpiry
	// WaitReplicas, when positive, makes a store with replicas confirm a
	// new reservation on that many of them, within WaitTimeout, before
	// reporting Reserved; otherwise Reserve fails with ErrNotDurable. A
	// store without replicas of its own (in memory) ignores it.
	WaitReplicas int
	WaitTimeout  time.Duration
	// HandOverTo, when set, names the region that arbitrates the key from
	// now on, and makes this store the key's former home: the call
	// reserves nothing. It reports the record the store holds as a
	// reservation would (Mismatch, InFlight, Completed, Unknown, with the
	// same lease expiry rules), and where there is none, or the lease
	// expiry would free the record for a new attempt, it leaves a
	// tombstone (StateMoved) naming HandOverTo for Retention and reports
	// HandedOver. From then on a Reserve without HandOverTo reports Moved.
	HandOverTo string
}

// Outcome is what a reservation attempt found.
type Outcome uint8

const (
	// Reserved: the caller holds the record now and may run the operation.
	Reserved Outcome = iota + 1
	// Mismatch: the key is in use by a different request.
	Mismatch
	// InFlight: another attempt holds a live lease.
	InFlight
	// Completed: the operation finished; ReserveResult.Response holds it.
	Completed
	// Unknown: the operation's outcome is unknown.
	Unknown
	// Moved: the key is arbitrated in another region's store now
	// (ReserveResult.Home); nothing was reserved here.
	Moved
	// HandedOver: a hand-over (Reservation.HandOverTo) found no record
	// that holds the key here; a tombstone names the new home, which may
	// reserve the key now.
	HandedOver
)

func (o Outcome) String() string {
	return EnumName(o, "invalid", "reserved", "mismatch", "in_flight", "completed", "unknown", "moved", "handed_over")
}

// CancelResult is what Store.Cancel found.
type CancelResult uint8

const (
	// CancelReleased: the token's reservation had reached the store and
	// is deleted.
	CancelReleased CancelResult = iota + 1
	// CancelNotHeld: the token held no record (its reservation had not
	// reached the store, or found the record taken or settled); there was
	// nothing of its own to undo.
	CancelNotHeld
)

// String is the outcome's name (CancelOutcomeOf), the metric's label.
func (c CancelResult) String() string {
	if c != CancelReleased && c != CancelNotHeld {
		return "invalid"
	}
	return string(CancelOutcomeOf(c))
}

// ReserveResult is the answer to a Reservation.
type ReserveResult struct {
	Outcome Outcome
	// Attempt is this attempt's number for the operation (1 for the first).
	// It is zero for Mismatch, which is not an attempt of the operation.
	Attempt int
	// Response is set when Outcome is Completed.
	Response *Response
	// CreatedAt is when the record was first reserved (zero for Mismatch).
	CreatedAt time.Time
	// Home is the region that arbitrates the key, for Moved and
	// HandedOver.
	Home string
}

// Store keeps idempotency records. Every method is atomic with respect to
// the others on the same id. Errors other than ErrNotFound, ErrNotHolder
// and ErrCancelled mean the store could not be asked (it is unreachable,
// slow or broken): callers must then assume nothing about the record,
// unless the error wraps ErrRefused. A call that timed out may still reach
// the store later; Cancel exists for the Reserve calls among them.
type Store interface {
	// Reserve creates the record for r.Token unless one exists, and reports
	// what it found. Repeating a Reserve with the same token is harmless,
	// so a call whose reply was lost may be retried.
	Reserve(ctx context.Context, r Reservation) (ReserveResult, error)
	// Renew extends an in-flight record's lease, from the store's clock.
	Renew(ctx context.Context, id RecordID, tok Token, lease time.Duration) error
	// Complete stores resp as the operation's result. It succeeds for the
	// token's in-flight or unknown record, and again for its completed one.
	Complete(ctx context.Context, id RecordID, tok Token, resp Response, retention time.Duration) error
	// Release deletes the token's not-yet-completed record, so the next
	// attempt runs the operation.
	Release(ctx context.Context, id RecordID, tok Token) error
	// MarkUnknown turns the token's in-flight record into StateUnknown.
	MarkUnknown(ctx context.Context, id RecordID, tok Token, retention time.Duration) error
	// Cancel undoes a Reserve whose caller gave up without knowing whether
	// it reached the store, and never let its request through: whichever
	// comes first, the reservation or the cancel, no reservation by tok
	// remains. If the token holds the record (in flight, or turned unknown
	// when its lease ran out) the record is deleted, as Release does; a
	// completed record, or one another token holds, is left alone. Either
	// way, for hold from now, a Reserve with tok changes nothing and fails
	// with ErrCancelled: a reservation still on its way is refused when it
	// arrives. Repeating a Cancel is harmless.
	Cancel(ctx context.Context, id RecordID, tok Token, hold time.Duration) (CancelResult, error)
	// Get reads a record without changing it.
	Get(ctx context.Context, id RecordID) (Record, error)
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
}

// Watcher is implemented by stores that can say when an in-flight record
// settles, so that a duplicate can wait for the first attempt's answer
// without polling the store.
type Watcher interface {
	// Watch returns a channel that is closed once id's record may have
	// left StateInFlight (completed, released, marked unknown, taken over):
	// at once if it already has. Wake-ups may be spurious; read the record
	// again to know. stop releases the watch and must be called.
	Watch(ctx context.Context, id RecordID) (changed <-chan struct{}, stop func(), err error)
}

// ErrNotUnknown: Resolve applies only to a record whose outcome is unknown.
var ErrNotUnknown = errors.New("idem: record is not in state unknown")

// Admin is implemented by stores that let an operator act on a record
// outside any attempt's token, after checking the domain by hand.
type Admin interface {
	// Purge deletes the record, whatever its state.
	Purge(ctx context.Context, id RecordID) error
	// Resolve settles an unknown record: with resp nil it is released (the
	// next attempt runs the operation), otherwise it completes with resp
	// and is kept for retention.
	Resolve(ctx context.Context, id RecordID, resp *Response, retention time.Duration) error
}

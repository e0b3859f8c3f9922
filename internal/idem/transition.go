package idem

import "time"

// Change is the effect of one transition on a stored record.
type Change struct {
	// Next is the record to store; nil with Delete unset means "no change".
	Next *Record
	// Delete removes the record.
	Delete bool
	// TTL, when positive, restarts the record's time to live.
	TTL time.Duration
}

// ApplyReserve decides a Reservation against the current record (nil when
// none exists) at the store's time now. It is the reference statement of
// the reserve rules; reserve.lua implements the same.
func ApplyReserve(cur *Record, now time.Time, r Reservation) (Change, ReserveResult) {
	if r.HandOverTo != "" {
		return applyHandOver(cur, now, r)
	}
	if cur != nil && cur.State == StateMoved {
		return Change{}, ReserveResult{Outcome: Moved, Home: cur.Home}
	}
	if cur == nil {
		next := &Record{
			State:       StateInFlight,
			Fingerprint: r.Fingerprint,
			Token:       r.Token,
			LeaseUntil:  now.Add(r.Lease),
			CreatedAt:   now,
			Attempts:    1,
		}
		return Change{Next: next, TTL: r.Retention}, ReserveResult{Outcome: Reserved, Attempt: 1, CreatedAt: now}
	}
	if cur.Fingerprint != r.Fingerprint {
		return Change{}, ReserveResult{Outcome: Mismatch}
	}
	if cur.State == StateInFlight && cur.Token == r.Token {
		// The same attempt asking again (its first reply was lost).
		return Change{}, ReserveResult{Outcome: Reserved, Attempt: cur.Attempts, CreatedAt: cur.CreatedAt}
	}
	next := *cur
	next.Attempts++
	res := ReserveResult{Attempt: next.Attempts, CreatedAt: cur.CreatedAt}
	switch cur.State {
	case StateCompleted:
		res.Outcome = Completed
		res.Response = cur.Response
		return Change{Next: &next}, res
	case StateUnknown:
		res.Outcome = Unknown
		return Change{Next: &next}, res
	}
	// In flight under another token.
	if now.Before(cur.LeaseUntil) {
		res.Outcome = InFlight
		return Change{Next: &next}, res
	}
	if r.LeaseExpiry == LeaseExpiryReexecute {
		next.Token = r.Token
		next.LeaseUntil = now.Add(r.Lease)
		res.Outcome = Reserved
		return Change{Next: &next, TTL: r.Retention}, res
	}
	// The holder stopped vouching for the attempt: its effect is unknown.
	next.State = StateUnknown
	next.LeaseUntil = time.Time{}
	res.Outcome = Unknown
	return Change{Next: &next, TTL: r.Retention}, res
}

// applyHandOver is ApplyReserve for a hand-over (Reservation.HandOverTo):
// where a reservation would be made, a tombstone is left instead.
func applyHandOver(cur *Record, now time.Time, r Reservation) (Change, ReserveResult) {
	if cur != nil && cur.State == StateMoved {
		if cur.Home != r.HandOverTo {
			// Handed over to another region already: two maps disagree
			// on the key's home, and neither may reserve it.
			return Change{}, ReserveResult{Outcome: Moved, Home: cur.Home}
		}
		return Change{}, ReserveResult{Outcome: HandedOver, Home: cur.Home}
	}
	home := r.HandOverTo
	r.HandOverTo = ""
	ch, res := ApplyReserve(cur, now, r)
	if res.Outcome != Reserved {
		return ch, res
	}
	tomb := &Record{State: StateMoved, Home: home, CreatedAt: now}
	return Change{Next: tomb, TTL: r.Retention}, ReserveResult{Outcome: HandedOver, Home: tomb.Home, CreatedAt: now}
}

// ApplyRenew extends the lease of tok's in-flight record.
func ApplyRenew(cur *Record, now time.Time, tok Token, lease time.Duration) (Change, error) {
	if err := holds(cur, tok); err != nil {
		return Change{}, err
	}
	if cur.State != StateInFlight {
		return Change{}, ErrNotHolder
	}
	next := *cur
	next.LeaseUntil = now.Add(lease)
	return Change{Next: &next}, nil
}

// ApplyComplete stores resp in tok's record. A record that turned unknown
// because its lease ran out may still be completed by its own token: the
// upstream did answer, which is better knowledge than "unknown".
func ApplyComplete(cur *Record, tok Token, resp Response, retention time.Duration) (Change, error) {
	if err := holds(cur, tok); err != nil {
		return Change{}, err
	}
	if cur.State == StateCompleted {
		return Change{}, nil // a repeated completion by the same attempt
	}
	next := *cur
	next.State = StateCompleted
	next.LeaseUntil = time.Time{}
	next.Response = &resp
	return Change{Next: &next, TTL: retention}, nil
}

// ApplyRelease deletes tok's record unless it completed.
func ApplyRelease(cur *Record, tok Token) (Change, error) {
	if err := holds(cur, tok); err != nil {
		return Change{}, err
	}
	if cur.State == StateCompleted {
		return Change{}, ErrNotHolder
	}
	return Change{Delete: true}, nil
}

// ApplyCancel undoes tok's reservation for an attempt that gave up on it
// before letting its request through: the record is deleted when tok holds
// it and it did not complete (in flight, or turned unknown when its lease
// ran out while nobody ran the operation). Anything else is left as it is.
// The store also keeps, for the hold Cancel was given, the fact that tok
// was cancelled, and refuses a later Reserve with it (ErrCancelled) before
// ApplyReserve is consulted.
func ApplyCancel(cur *Record, tok Token) (Change, CancelResult) {
	if cur == nil || cur.Token != tok || cur.State == StateCompleted {
		return Change{}, CancelNotHeld
	}
	return Change{Delete: true}, CancelReleased
}

// ApplyMarkUnknown turns tok's in-flight record into StateUnknown.
func ApplyMarkUnknown(cur *Record, tok Token, retention time.Duration) (Change, error) {
	if err := holds(cur, tok); err != nil {
		return Change{}, err
	}
	switch cur.State {
	case StateUnknown:
		return Change{}, nil
	case StateCompleted:
		return Change{}, ErrNotHolder
	}
	next := *cur
	next.State = StateUnknown
	next.LeaseUntil = time.Time{}
	return Change{Next: &next, TTL: retention}, nil
}

func holds(cur *Record, tok Token) error {
	if cur == nil {
		return ErrNotFound
	}
	if cur.Token != tok || cur.State == StateMoved {
		return ErrNotHolder
	}
	return nil
}

// ApplyResolve settles an unknown record by an operator's word.
func ApplyResolve(cur *Record, resp *Response, retention time.Duration) (Change, error) {
	if cur == nil {
		return Change{}, ErrNotFound
	}
	if cur.State != StateUnknown {
		return Change{}, ErrNotUnknown
	}
	if resp == nil {
		return Change{Delete: true}, nil
	}
	next := *cur
	next.State = StateCompleted
	next.Response = resp
	return Change{Next: &next, TTL: retention}, nil
}

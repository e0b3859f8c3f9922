package attempt

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// A reservation whose call failed may still reach the store: the call ran
// past its budget with the command already written (the bytes are in
// flight, or Redis is busy), or its reply was lost. The attempt has then
// told the client "nothing reserved: retry the same key" and never let the
// request through, so such a reservation must not stand: nobody would
// settle it, and the key would answer request-in-progress until its lease
// ended, then outcome-unknown for the whole retention, although nothing
// ran. The attempt's own server undoes it (Store.Cancel): the token proves
// the reservation is this attempt's and no other's, and the attempt knows
// the upstream was never called. Whether the reservation arrives before
// the cancel or after it, none remains.

// cancelHold is how long a cancelled token's reservation is refused if it
// arrives after the cancel: how late a reservation may reach the store and
// still be undone. A reservation later than that stands as before the
// cancel existed.
//
// The lateness comes from the network and from Redis, not from the
// server's budget (100 ms by default, after which the client gives up and
// closes the connection):
//
//   - A closed connection's kernel keeps retransmitting what it had not
//     got acknowledged: on Linux, for an orphaned socket, tcp_orphan_retries
//     retries (8 when the sysctl is 0, its default), which "corresponds to
//     >100 seconds with minimal RTO of 200msec" (net/ipv4/tcp_timer.c,
//     tcp_orphan_retries; retransmits_timed_out models it as
//     (2^9 - 1) × 200 ms ≈ 102 s). A partition that heals within that
//     window delivers the command.
//   - Redis runs what reached its socket once it is free again: after a
//     long command or script, a fork's pause, a slow disk under
//     appendfsync always: seconds, rarely more.
//
// Five minutes covers the first about three times over and the second
// with room. What it costs is one small key per cancelled reservation
// (docs/redis.md), only for reservations that ran past the budget. Proxies
// between the server and Redis (TLS terminators, load balancers) may hold
// bytes longer; that is left as the residual window (docs/design.md §7.7).
const cancelHold = 5 * time.Minute

// maxCancelling bounds the cancels one server runs at once. In an outage
// every request's reservation fails and each cancel keeps retrying for
// SettleAtEndTimeout; the bound keeps their goroutines and their calls on
// a recovering store in check. A cancel past it is not tried (counted as
// dropped): its reservation, if one arrives, stands as before.
const maxCancelling = 1024

// giveUp undoes, in the background, the reservation this attempt asked
// for when the call failed with err; the attempt never lets its request
// through. It does not delay the answer: the cancel has a time of its own
// (SettleAtEndTimeout) and retries until the store answers. A failure
// that proves nothing was written (idem.ErrRefused) needs no cancel.
func (a *Attempt) giveUp(ctx context.Context, err error) {
	if errors.Is(err, idem.ErrRefused) {
		return
	}
	s := a.srv
	// The attempt's fields as they are now, for the log lines: the caller
	// goes on with the attempt meanwhile.
	snap := *a
	if s.cancelling.Add(1) > maxCancelling {
		s.cancelling.Add(-1)
		s.Observer.ReservationCancelled(snap.Policy.Name, idem.CancelOutcomeDropped)
		snap.LogAt(slog.LevelError, "reservation given up on not cancelled: too many cancels running; "+
			"if it reached the store, the key answers request-in-progress, then outcome-unknown",
			slog.String("reserve_error", err.Error()))
		return
	}
	base := context.WithoutCancel(ctx) // the stream's span, not its end
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		defer s.cancelling.Add(-1)
		cctx, cancel := context.WithTimeout(base, s.SettleAtEndTimeout)
		defer cancel()
		var res idem.CancelResult
		cerr := retryUntil(cctx, func(ctx context.Context) error {
			sctx, scancel := context.WithTimeout(ctx, snap.storeBudget())
			defer scancel()
			var err error
			res, err = snap.recordStore().Cancel(sctx, snap.ID, snap.token, cancelHold)
			return err
		})
		if cerr != nil {
			s.Observer.ReservationCancelled(snap.Policy.Name, idem.CancelOutcomeFailed)
			snap.LogAt(slog.LevelError, "reservation given up on not cancelled; "+
				"if it reached the store, the key answers request-in-progress, then outcome-unknown",
				slog.String("reserve_error", err.Error()), slog.String("error", cerr.Error()))
			return
		}
		o := idem.CancelOutcomeOf(res)
		s.Observer.ReservationCancelled(snap.Policy.Name, o)
		snap.LogAt(slog.LevelInfo, "reservation given up on cancelled", slog.String("outcome", string(o)),
			slog.String("reserve_error", err.Error()))
	}()
}

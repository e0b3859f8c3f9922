package attempt

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Response is what the protocol side read of a response (AtResponse).
type Response struct {
	// Origin is who made the response; Retried, whether an earlier
	// upstream attempt may have been sent (actionFor).
	Origin  idem.Origin
	Retried bool
	// Status is what the policy's response rules judge: the HTTP status,
	// or a gRPC call's status as its HTTP equivalent; 0 when unknown (no
	// rule covers it).
	Status int
	// Later: the status that decides comes at the response's end (a gRPC
	// call's, in its trailers): nothing is judged before it.
	Later bool
	// End: the response is whole, and Read is what was kept of it.
	End  bool
	Read idem.Response
}

// AtResponse is the verdict on a response, at its headers and at its end:
// Pass when the attempt holds no record; Store while the response is to be
// stored, so that its body is read; SkipBody when the policy's response
// rules settled the record at the headers without it; Settled at the end,
// the record completed with what was read, or settled by the status that
// came there. attrs, with the response's origin, go on the settlement's
// line, so that one line says how the response was judged and what it
// settled.
func (a *Attempt) AtResponse(ctx context.Context, r Response, attrs ...slog.Attr) Verdict {
	switch {
	case a.renew == nil:
		return verdictPass
	case r.Later:
		return Verdict{Kind: Store}
	}
	action := idem.ActionStore
	if !a.storing {
		action = a.actionFor(r.Origin, r.Status, r.Retried) // the origin it keeps goes on the line
		a.storing = action == idem.ActionStore
	}
	if action == idem.ActionStore && !r.End {
		return Verdict{Kind: Store}
	}
	var buf [4]slog.Attr
	judged := append(append(buf[:0], attrs...), slog.String("origin", a.origin.String()))
	if action == idem.ActionStore {
		a.settleStored(ctx, r.Read, judged...)
	} else {
		a.settle(ctx, action, judged...)
	}
	if !r.End {
		return Verdict{Kind: SkipBody, Unsettled: a.retry != nil}
	}
	return Verdict{Kind: Settled, Unsettled: a.retry != nil}
}

// actionFor is what a response proves about the operation, by the policy's
// response rules: the one place a response is judged, for HTTP and gRPC
// answers alike. A response no rule covers is unknown. retried says that
// the proxy may have sent the request upstream more than once (a router
// retry): the response then describes the last attempt only, and proves
// nothing about the earlier ones, so what the rules would release (an
// upstream 429, a reply that proves the last attempt never left) is
// unknown instead: releasing could run an operation that already ran. The
// origin and retried are kept for settleStored.
func (a *Attempt) actionFor(origin idem.Origin, status int, retried bool) idem.Action {
	a.origin, a.retried = origin, retried
	return a.unlessRetried(idem.DecideResponse(a.Policy.ResponseRules, origin, status))
}

// unlessRetried is act, but unknown for a release when an earlier upstream
// attempt may have been sent (actionFor's retried): a release needs proof
// that the operation never ran, which the last attempt cannot give.
func (a *Attempt) unlessRetried(act idem.Action) idem.Action {
	if a.retried && act == idem.ActionRelease {
		return idem.ActionUnknown
	}
	return act
}

// settleStored completes the record with resp as the operation's result,
// unless resp answers a JSON-RPC call in a way that proves nothing ran. It
// runs before the reply that lets the response go on, so a client that
// sees the response and retries at once finds it stored. judged, how the
// response was judged (AtResponse), goes on the settled line.
//
// The upstream's answer to the JSON-RPC call the attempt took (answers:
// jsonrpc; its id callID), that the response rules said to store, is not
// stored when it is the upstream's transport refusing the call
// (transportRefused), which never ran it: the record is released (unknown
// when an earlier attempt may have run it: unlessRetried); nor when it is
// an interim result that asks for input (isInterim): the record is
// released for the continuation.
func (a *Attempt) settleStored(ctx context.Context, resp idem.Response, judged ...slog.Attr) {
	if a.renew == nil {
		return
	}
	var buf [6]slog.Attr
	attrs := append(append(buf[:0], slog.Int("status", resp.Status), slog.Bool("body_omitted", resp.BodyOmitted)), judged...)
	if a.Policy.Answers == policy.AnswersJSONRPC && a.origin == idem.OriginUpstream {
		switch {
		case transportRefused(resp, a.callID):
			a.settle(ctx, a.unlessRetried(idem.ActionRelease), append(attrs, slog.String("reason", "transport refused the call"))...)
			return
		case isInterim(resp, a.callID):
			// The server asks for input; an interim round is taken to have no
			// effect of its own (docs/design.md §4, MCP multi round-trip
			// requests): the record goes, the continuation runs.
			a.settle(ctx, idem.ActionRelease, append(attrs, slog.String("reason", "interim result: input required"))...)
			return
		}
	}
	if c := a.Policy.Compression.Codec; c != nil {
		// Before sealing: an envelope's bytes do not compress.
		resp = c.Compress(resp)
	}
	if a.Policy.Encrypt {
		sealed, err := a.srv.Sealer.Seal(a.ID, resp)
		if err != nil {
			// Never store in the clear what the policy says to seal.
			a.LogAt(slog.LevelError, "response not sealed; marking the outcome unknown", slog.String("error", err.Error()))
			a.settle(ctx, idem.ActionUnknown)
			return
		}
		resp = sealed
	}
	st := a.renew.store
	a.settleWith(ctx, codeStored, func(ctx context.Context) error {
		return st.Complete(ctx, a.ID, a.token, resp, a.Policy.Retention)
	}, attrs...)
}

// settle releases the record (ActionRelease) or marks it unknown (any
// other action). attrs are added to the settled line.
func (a *Attempt) settle(ctx context.Context, action idem.Action, attrs ...slog.Attr) {
	if a.renew == nil {
		return
	}
	st := a.renew.store
	d, op := codeMarkedUnknown, func(ctx context.Context) error {
		return st.MarkUnknown(ctx, a.ID, a.token, a.Policy.Retention)
	}
	if action == idem.ActionRelease {
		d, op = codeReleased, func(ctx context.Context) error { return st.Release(ctx, a.ID, a.token) }
	}
	a.settleWith(ctx, d, op, attrs...)
}

// settleWith applies the attempt's last transition. It does not end with the
// stream's context: Envoy resetting the stream must not cancel the write
// that records what happened. If the store fails, SettleAtEnd keeps trying
// (within SettleAtEndTimeout); if that fails too, the unrenewed lease still
// turns the record unknown: never a silent second execution.
func (a *Attempt) settleWith(ctx context.Context, code decisionCode, apply func(context.Context) error, attrs ...slog.Attr) {
	d, r := code.decision(), a.renew
	r.stop()
	a.renew = nil
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.budget)
	err := apply(sctx)
	cancel()
	var buf [8]slog.Attr
	extra := append(append(buf[:0], attrs...), slog.String("outcome", string(d)), errAttr(err))
	if err != nil && !definite(err) {
		a.retry, a.retryDecision = apply, code
		a.LogAt(slog.LevelWarn, "record not settled; will retry when the stream ends", extra...)
		return
	}
	if err == nil {
		a.conv.Decided(a.Policy.Name, d)
	}
	a.LogAt(slog.LevelInfo, "settled", extra...)
}

// definite reports a store answer that says the record moved on without
// this attempt (taken over, purged): nothing to retry.
func definite(err error) bool {
	return errors.Is(err, idem.ErrNotHolder) || errors.Is(err, idem.ErrNotFound)
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}

// SettleAtEnd runs when the stream ends, however it ends, with base
// carrying the stream's span (not its deadline). It retries a refused
// transition, or settles a record still held: partial, when not nil, is
// the response whose headers arrived but not its whole body (the upstream
// did answer: it completes without its body); without one the outcome is
// the policy's on_stream_reset.
func (a *Attempt) SettleAtEnd(base context.Context, partial *idem.Response) {
	if a.renew == nil && a.retry == nil {
		return // settled already, or nothing was reserved: the usual end
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(base), a.srv.SettleAtEndTimeout)
	defer cancel()
	if a.retry != nil {
		err := retryUntil(ctx, a.retry)
		level, msg, d := slog.LevelInfo, "settled on retry", a.retryDecision.decision()
		switch {
		case err == nil:
			a.conv.Decided(a.Policy.Name, d)
		case !definite(err):
			level, msg = slog.LevelError, "record not settled; it turns unknown when its lease ends"
			a.srv.Observer.SettleFailed(a.Policy.Name, string(d))
		}
		a.LogAt(level, msg, slog.String("outcome", string(d)), errAttr(err))
		return
	}
	if partial != nil {
		a.settleStored(ctx, *partial)
		return
	}
	a.settle(ctx, a.Policy.OnStreamReset)
}

// retryUntil applies op until it succeeds, the store gives a definite
// answer (the record moved on), or ctx ends; each call keeps the store's
// own per-call budget, so this outlasts a short outage of the store.
func retryUntil(ctx context.Context, op func(context.Context) error) error {
	backoff := 25 * time.Millisecond
	for {
		err := op(ctx)
		if err == nil || definite(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// A reservation whose call failed may still reach the store (the command
// written past its budget, or its reply lost) after the client was told to
// retry the same key. Nobody would settle it, so the attempt's own server
// undoes it (giveUp, Store.Cancel): the token proves the reservation is
// this attempt's, and the attempt knows the upstream was never called.
// docs/design.md §7.7 gives the whole argument and the window that remains.

// cancelHold is how long a cancelled token's reservation is refused if it
// arrives after the cancel: how late a reservation may reach the store and
// still be undone. The lateness comes from the network and from Redis, not
// from the server's budget: a closed socket's retransmits (about 102 s on
// Linux, net/ipv4/tcp_timer.c tcp_orphan_retries) and Redis's pauses
// (seconds); five minutes covers both with room (docs/design.md §7.7).
const cancelHold = 5 * time.Minute

// maxCancelling bounds the cancels one server runs at once, so that in an
// outage their goroutines and calls on a recovering store stay in check; a
// cancel past it is not tried (counted as dropped).
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
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		defer s.cancelling.Add(-1)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.SettleAtEndTimeout) // the stream's span, not its end
		defer cancel()
		var res idem.CancelResult
		cerr := retryUntil(cctx, func(ctx context.Context) (err error) {
			sctx, scancel := context.WithTimeout(ctx, snap.storeBudget())
			defer scancel()
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

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
// came there. attrs start the debug line that says how it was judged.
func (a *Attempt) AtResponse(ctx context.Context, r Response, attrs ...slog.Attr) Verdict {
	switch {
	case a.renew == nil:
		return verdictPass
	case r.Later:
		return Verdict{Kind: Store}
	case !a.storing:
		action := a.actionFor(r.Origin, r.Status, r.Retried)
		var buf [4]slog.Attr
		a.LogAt(slog.LevelDebug, "response", append(append(buf[:0], attrs...),
			slog.String("origin", r.Origin.String()), slog.String("action", action.String()))...)
		if action != idem.ActionStore {
			a.settle(ctx, action)
			if r.End {
				return Verdict{Kind: Settled, Unsettled: a.retry != nil}
			}
			return Verdict{Kind: SkipBody, Unsettled: a.retry != nil}
		}
		a.storing = true
	}
	if !r.End {
		return Verdict{Kind: Store}
	}
	a.settleStored(ctx, r.Read)
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
// origin and retried are kept for settleStored (settledCall).
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
// unless resp answers a JSON-RPC call in a way that proves nothing ran
// (settledCall). It runs before the reply that lets the response go on,
// so a client that sees the response and retries at once finds it stored.
func (a *Attempt) settleStored(ctx context.Context, resp idem.Response) {
	attrs := []slog.Attr{slog.Int("status", resp.Status), slog.Bool("body_omitted", resp.BodyOmitted)}
	if a.renew == nil || a.Policy.Answers == policy.AnswersJSONRPC && a.settledCall(ctx, resp, attrs) {
		return
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
	var buf [4]slog.Attr
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

// pending reports whether SettleAtEnd has work: a record still held, or a
// transition to retry.
func (a *Attempt) pending() bool { return a.renew != nil || a.retry != nil }

// SettleAtEnd runs when the stream ends, however it ends, with base
// carrying the stream's span (not its deadline). It retries a refused
// transition, or settles a record still held: partial, when not nil, is
// the response whose headers arrived but not its whole body (the upstream
// did answer: it completes without its body); without one the outcome is
// the policy's on_stream_reset.
func (a *Attempt) SettleAtEnd(base context.Context, partial *idem.Response) {
	if !a.pending() {
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

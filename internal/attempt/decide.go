package attempt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// decide is the request-time decision (docs/design.md §3) for a complete
// request's fingerprint: it reserves the record for a new token; a
// completed record's response is opened when sealed. A duplicate of an
// attempt in flight is returned as such: whether it waits for that attempt
// is request's to say (waits), and the wait is awaitFirst. An error means
// no answer: the store could not be asked or used (unreachable tells
// which).
//
// After an error the request goes on only under a policy that fails open
// (and only when unreachable): otherwise the caller refuses it (503), and
// decide has already started undoing the reservation the failed call may
// still make (settle.go, giveUp). Under fail_open the request runs unprotected, so
// such a reservation is left to turn unknown: the effect may have
// happened.
func (a *Attempt) decide(ctx context.Context, fp idem.Fingerprint) (idem.ReserveResult, error) {
	a.token = idem.NewToken()
	if a.Policy.Encrypt && a.srv.Sealer == nil {
		// The response could not be stored as the policy demands: refuse
		// before anything runs. (The daemon refuses such a configuration;
		// this guards other embeddings.)
		return idem.ReserveResult{}, unusable{errNoKeyRing}
	}
	res, err := a.reserve(ctx, fp)
	if errors.Is(err, idem.ErrDamaged) {
		return res, unusable{err} // it reserved nothing: no cancel
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
// proxy must then give the request's message (extension). A far home's
// ask was made before its reservation, wait included.
func (a *Attempt) waits(res idem.ReserveResult) (time.Duration, bool) {
	if _, ok := a.recordStore().(idem.Watcher); !ok || res.Outcome != idem.InFlight || a.Policy.WaitForInFlight <= 0 {
		return 0, false
	}
	d := a.asked
	if d == 0 {
		d = a.extension(0, a.storeBudget())
	}
	return d, a.waitFor > 0
}

// extension is the time to ask the proxy for in one message, which it
// grants once (ext_proc processor_state.cc restartMessageTimer): calls,
// the store calls about to be made; a duplicate's wait after them
// (wait_for_in_flight) and its two calls of after each (awaitFirst: the
// record reread, and a reservation if it was released); and the server's
// own budget, for its work and the reply's way back, because Envoy's timer
// starts when the ask arrives, before the calls do. The wait is shortened
// so that the ask fits Server.MaxMessageTimeout, down to none; awaitFirst
// waits waitFor.
func (a *Attempt) extension(calls, after time.Duration) time.Duration {
	fixed := calls + a.srv.StoreTimeout + 2*after
	a.waitFor = a.Policy.WaitForInFlight
	if limit := a.srv.MaxMessageTimeout; limit > 0 && fixed+a.waitFor > limit {
		a.waitFor = max(0, limit-fixed)
	}
	if a.waitFor == 0 {
		return calls + a.srv.StoreTimeout
	}
	return fixed + a.waitFor
}

// opened gives a completed record's response as it is replayed: opened
// when sealed, then expanded when compressed (it is compressed before it
// is sealed). A stored response that does not open (tampered, or its key
// left the ring), is not sealed under a policy that encrypts, or does not
// expand is never replayed, and the key is not free.
func (a *Attempt) opened(res idem.ReserveResult) (idem.ReserveResult, error) {
	if res.Outcome != idem.Completed || !a.Policy.Encrypt && !res.Response.Sealed && !res.Response.Compressed {
		return res, nil // nothing to open or expand: replayed as stored
	}
	r, err := *res.Response, error(nil)
	switch {
	case a.Policy.Encrypt && !r.Sealed:
		err = errNotSealed
	case r.Sealed && a.srv.Sealer == nil:
		err = errors.New("a stored response is sealed and the server has no key ring")
	case r.Sealed:
		r, err = a.srv.Sealer.Open(a.ID, r)
	}
	switch c := a.Policy.Compression.Codec; {
	case err != nil || !r.Compressed:
	case c == nil:
		err = errors.New("a stored response is compressed and the policy has no compression codec")
	default:
		r, err = c.Expand(r, a.Policy.MaxExpanded())
	}
	if err != nil {
		return res, unusable{err}
	}
	res.Response = &r
	return res, nil
}

// reserve asks the store for the record, with the policy's lease,
// retention and durability. A store that sends the key elsewhere is an
// error: without a finder that follows the key to its new home
// (Server.Homes), this server cannot ask the store that does.
func (a *Attempt) reserve(ctx context.Context, fp idem.Fingerprint) (idem.ReserveResult, error) {
	sctx, cancel := context.WithTimeout(ctx, a.storeBudget())
	defer cancel()
	waitReplicas, waitTimeout := a.Policy.WaitReplicas()
	res, err := a.recordStore().Reserve(sctx, idem.Reservation{
		ID:           a.ID,
		Fingerprint:  fp,
		Token:        a.token,
		Lease:        a.Policy.Lease,
		Retention:    a.Policy.Retention,
		LeaseExpiry:  a.Policy.LeaseExpiry,
		WaitReplicas: waitReplicas,
		WaitTimeout:  waitTimeout,
	})
	switch {
	case err != nil:
	case a.home != nil && res.Outcome == idem.Moved:
		err = errMoved
	case a.home == nil && (res.Outcome == idem.Moved || res.Outcome == idem.HandedOver):
		err = fmt.Errorf("the key is arbitrated in region %q, which this server's store does not reach", res.Home)
	}
	return res, err
}

// errMoved is a HomeStore's Moved answer (HomeStore): nothing was
// reserved, and the key's new home needs more time than the message has.
var errMoved = fmt.Errorf("%w: the key's store sent it to a newer home", idem.ErrRefused)

// awaitFirst lets a duplicate wait, up to the policy's wait_for_in_flight,
// for the attempt that holds the record to settle, woken by the store
// rather than polling it. It returns what the duplicate should be told
// once the record, reread, settled: the replay once the first attempt
// completed (opened when sealed), a fresh reservation if it was released,
// or the outcome found when the wait ends. A damaged record is an error,
// as at the reservation.
func (a *Attempt) awaitFirst(ctx context.Context, fp idem.Fingerprint, first idem.ReserveResult) (idem.ReserveResult, error) {
	w := a.recordStore().(idem.Watcher) // waits checked it
	wctx, cancel := context.WithTimeout(ctx, a.waitFor)
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
		sctx, scancel := context.WithTimeout(ctx, a.storeBudget())
		rec, err := a.recordStore().Get(sctx, a.ID)
		scancel()
		if errors.Is(err, idem.ErrNotFound) {
			// Released (the upstream asked for a retry): this attempt may
			// run the operation now.
			var res idem.ReserveResult
			if res, err = a.reserve(ctx, fp); err == nil {
				return a.opened(res)
			}
			if !errors.Is(err, idem.ErrDamaged) {
				// The duplicate is answered 409 below, as when the wait
				// began; a reservation this call may still make is undone.
				a.giveUp(ctx, err)
			}
		}
		switch {
		case errors.Is(err, idem.ErrDamaged):
			return first, unusable{err}
		case err != nil:
			return first, nil
		case rec.Fingerprint != fp:
			return idem.ReserveResult{Outcome: idem.Mismatch}, nil
		case rec.State == idem.StateCompleted:
			return a.opened(idem.ReserveResult{Outcome: idem.Completed, Attempt: first.Attempt, Response: rec.Response, CreatedAt: rec.CreatedAt})
		case rec.State == idem.StateMoved:
			return first, nil // handed over meanwhile: the first answer stands
		case rec.State == idem.StateUnknown:
			return idem.ReserveResult{Outcome: idem.Unknown, Attempt: first.Attempt, CreatedAt: rec.CreatedAt}, nil
		}
		if wctx.Err() != nil {
			return first, nil // still in flight when the wait ran out: 409
		}
	}
}

// decideShadow makes the decision an enforcing policy would make, against
// the shadow key space (policy.RecordNamespace), and reports it: the
// request goes on whatever it is (docs/design.md §9).
//
// A first attempt holds its reservation as an enforced one does (the
// caller calls hold), so its response completes the record and later
// duplicates are measured against it. A duplicate holds nothing: the
// upstream runs it again (that is what shadow means) and its own response
// stores nothing, so it never overwrites the first one's record. It does
// not wait for an attempt in flight either (wait_for_in_flight): shadow
// adds no latency beyond the reservation. A store that cannot be asked or
// used is ShadowStoreError, with the error; the request goes on all the
// same, so a reservation the failed call may still make is not cancelled
// (settle.go, giveUp): the upstream ran.
func (a *Attempt) decideShadow(ctx context.Context, fp idem.Fingerprint) (idem.ShadowDecision, error) {
	a.token = idem.NewToken()
	if a.Policy.Encrypt && a.srv.Sealer == nil {
		return idem.ShadowStoreError, errNoKeyRing
	}
	res, err := a.reserve(ctx, fp)
	if err != nil {
		return idem.ShadowStoreError, err
	}
	a.Number = res.Attempt
	return idem.ShadowDecisionFor(res.Outcome), nil
}

// Body is the request's body as the protocol side read it (Request).
type Body struct {
	// Bytes is the whole body.
	Bytes []byte
	// Unread, when set, is why the body could not be read whole (over a
	// limit or the server's budget, cut at the proxy's buffer): the
	// request is refused with it (refuse).
	Unread *problem.Problem
}

// Request is the request-time verdict on the complete request, b its
// body: for a request deferred to it, the policy it picks (pickAtBody),
// then its fingerprint (its method, path and the policy's fingerprint
// headers read at the headers, and the body), then request.
func (a *Attempt) Request(ctx context.Context, b Body, now time.Time) Verdict {
	if b.Unread != nil {
		return a.refuse(b.Unread)
	}
	var picked Verdict
	if a.cands != nil {
		if picked = a.pickAtBody(b.Bytes, now); picked.Kind != Continue {
			return picked
		}
	}
	fp := fingerprint.Compute(fingerprint.Request{
		Method:      a.method,
		Path:        a.path,
		Headers:     a.fpHeaders,
		Body:        b.Bytes,
		JSON:        a.Policy.FingerprintJSON,
		JSONOptions: a.Policy.FingerprintOptions(),
	}, a.Policy.FingerprintHeaders)
	a.fpHeaders = nil
	v := a.request(ctx, fp)
	v.JSONRPC, v.ID = picked.JSONRPC, picked.ID
	return v
}

// request is the request-time verdict (docs/design.md §3) for a complete
// request's fingerprint: Continue for the attempt that reserved the record
// (it now holds it, its lease renewed), an answer for any other (a replay,
// 409, 422), Wait for a duplicate that waits for the attempt in flight
// (wait_for_in_flight), and for a store that cannot be asked, Pass under
// fail_open and the 503 otherwise. A shadow policy's request always goes
// on (decideShadow).
func (a *Attempt) request(ctx context.Context, fp idem.Fingerprint) Verdict {
	if h := a.home; h != nil && !h.asked && h.store.Budget() > a.srv.StoreTimeout {
		// The scope's home is another region (Server.Homes): its store
		// calls may outlast the proxy's timer for this message, so the
		// proxy is asked for their time first, shadow policies' included:
		// a shadow must never make a request fail.
		return a.askForHome(fp)
	}
	if a.Policy.Enforcement == policy.EnforcementShadow {
		d, err := a.decideShadow(ctx, fp)
		if errors.Is(err, errMoved) && !a.home.asked {
			return a.askForHome(fp)
		}
		v := verdictPass
		if d == idem.ShadowWouldReserve { // never after an error (ShadowStoreError)
			v = a.reserved()
		}
		return a.shadowed(d, v, errAttr(err))
	}
	res, err := a.decide(ctx, fp)
	if errors.Is(err, errMoved) {
		if !a.home.asked {
			return a.askForHome(fp)
		}
		// The message's one extension is spent: the key cannot be
		// followed in time.
		err = fmt.Errorf("%w: its store sent it on to a home this message has no time left for", ErrHomeOutOfReach)
	}
	if err != nil {
		return a.unavailable(err)
	}
	if d, ok := a.waits(res); ok {
		a.wait = &waiting{fp: fp, first: res}
		return Verdict{Kind: Wait, Wait: d}
	}
	return a.answer(res)
}

// askForHome is the verdict that asks the proxy for the time of the home's
// calls (HomeStore.Budget) before they are made; Await then decides.
func (a *Attempt) askForHome(fp idem.Fingerprint) Verdict {
	a.home.asked = true
	a.wait = &waiting{fp: fp, far: true}
	b := a.home.store.Budget()
	a.asked = a.extension(b, b)
	return Verdict{Kind: Wait, Wait: a.asked}
}

// Await waits for the attempt in flight after a Wait verdict and gives the
// verdict on what it found.
func (a *Attempt) Await(ctx context.Context) Verdict {
	w := a.wait
	a.wait = nil
	if w.far {
		return a.request(ctx, w.fp)
	}
	res, err := a.awaitFirst(ctx, w.fp, w.first)
	if err != nil {
		return a.unavailable(err)
	}
	return a.answer(res)
}

// answer turns a reservation's outcome into the verdict. The decision's
// name is the metric's (decisions_total): "replayed", "conflict", not the
// record's state.
func (a *Attempt) answer(res idem.ReserveResult) Verdict {
	d := idem.DecisionFor(res.Outcome)
	if a.atBody {
		// Decided at the body: say where the key came from (the record id
		// stands for it; a derived key is a hash, never body text).
		a.LogAt(slog.LevelInfo, "decision", slog.String("decision", string(d)), slog.String("key_source", a.keySource.String()))
	} else {
		a.LogAt(slog.LevelInfo, "decision", slog.String("decision", string(d)))
	}
	a.conv.Decided(a.Policy.Name, d)
	switch res.Outcome {
	case idem.Reserved:
		return a.reserved()
	case idem.Completed:
		if !res.CreatedAt.IsZero() {
			a.srv.Observer.Replayed(a.Policy.Name, time.Since(res.CreatedAt))
		}
		if a.callID == nil {
			return Verdict{Kind: answered, Replay: res.Response}
		}
		// A JSON-RPC call's replay is the call's own response (jsonrpcReplay).
		// A stored response that is no JSON-RPC response to replay answers
		// outcome-unknown: the call ran, and what it returned cannot be told.
		out, err := jsonrpcReplay(*res.Response, a.callID)
		if err != nil {
			a.LogAt(slog.LevelWarn, "stored response cannot be replayed as a JSON-RPC response; answering outcome-unknown",
				slog.String("error", err.Error()))
			return Verdict{Kind: answered, Problem: problem.New(problem.OutcomeUnknown,
				"an earlier call with this key completed, but its response cannot be replayed as a JSON-RPC response; "+
					"check the tool's effect before calling again with a new key")}
		}
		return Verdict{Kind: answered, Replay: &out}
	case idem.InFlight:
		return Verdict{Kind: answered, Problem: &problem.Problem{Kind: problem.InProgress, RetryAfter: a.Policy.RetryAfter,
			Detail: "an earlier request with this Idempotency-Key is still being processed; retry later"}}
	case idem.Unknown:
		return Verdict{Kind: answered, Problem: problem.New(problem.OutcomeUnknown,
			"an earlier request with this Idempotency-Key ended without a known outcome; "+
				"check the resource's state before retrying with a new key")}
	}
	return Verdict{Kind: answered, Problem: problem.New(problem.KeyReused, // idem.Mismatch
		"this Idempotency-Key was already used for a request with a different method, path, headers or body")}
}

// reserved makes the attempt the record's holder once the store reserved
// it for its token: the lease is kept alive in the background, under the
// stream's span, until the attempt settles (renewer). The verdict lets the
// request go upstream. Its Wait is the time to ask the proxy for before a
// response message that may settle the record, or 0 when the settlement
// fits the message's own timer: it does unless the record is held in a far
// home's store, whose budget (HomeStore.Budget, fixed once the record is
// reserved) passes the local --store-timeout. Envoy's timer starts when
// the ask arrives, so the server's own budget is added. Envoy ignores an
// ask above its max_message_timeout rather than cap it (ext_proc.cc
// Filter::onNewTimeout); the ask is capped here at what the request's own
// ask (a.asked) left of it, so that the asks of one request add up to at
// most max_message_timeout, as docs/envoy.md's rule for a request's time
// in Envoy counts them.
func (a *Attempt) reserved() Verdict {
	base := a.conv.Background()
	if base.Done() != nil {
		base = context.WithoutCancel(base)
	}
	r := &renewer{store: a.recordStore(), budget: a.storeBudget(), log: a.srv.Log,
		id: a.ID, token: a.token, lease: a.Policy.Lease, base: base}
	r.mu.Lock()
	r.timer = time.AfterFunc(r.lease/2, r.tick)
	r.mu.Unlock()
	a.renew = r
	v := Verdict{Kind: Continue}
	if a.home != nil && r.budget > a.srv.StoreTimeout {
		v.Wait = max(0, min(r.budget+a.srv.StoreTimeout, a.srv.MaxMessageTimeout-a.asked))
	}
	return v
}

// recordStore is the store of the attempt's record.
func (a *Attempt) recordStore() idem.Store {
	if a.home != nil {
		return a.home.store
	}
	return a.srv.Store
}

// storeBudget bounds each call to recordStore while the proxy waits.
func (a *Attempt) storeBudget() time.Duration {
	if a.home != nil {
		return a.home.store.Budget()
	}
	return a.srv.StoreTimeout
}

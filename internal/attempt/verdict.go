package attempt

import (
	"context"
	"log/slog"
	"net/textproto"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// The attempt's decisions, each a Verdict: what is to happen to the request
// at that point, with the policy's enforcement (enforce or shadow), its key
// grace period, its failure mode and the outcome's answer already applied
// (docs/design.md §3 and §9). The protocol side only renders a verdict for
// the phase at hand and the caller (HTTP, gRPC, JSON-RPC); it decides
// nothing.

// Kind is what a verdict tells the request to do.
type Kind uint8

const (
	// Continue: the request goes on, protected: the attempt reads more of
	// it, or (once decided) holds the record while the upstream runs.
	Continue Kind = iota
	// Pass: the request goes on unprotected; nothing more is recorded.
	Pass
	// Answer: the server answers in the upstream's place, with Problem or
	// with Replay, and the request goes no further.
	Answer
	// Wait: the request waits, up to Verdict.Wait, for the attempt in
	// flight; Await gives the verdict once the wait is over.
	Wait
)

// Verdict is one decision about a request.
type Verdict struct {
	Kind Kind
	// Problem is the refusal an Answer carries; nil for a replay.
	Problem *problem.Problem
	// Replay is the stored response an Answer carries (opened when it was
	// sealed); nil for a refusal.
	Replay *idem.Response
	// Add are headers to add to the response the client gets: a shadow
	// policy's decision, a key grace period's warning.
	Add []ResponseHeader
	// Shadow is what a shadow policy would have done; "" under any other.
	Shadow idem.ShadowDecision
	// Wait bounds a Wait: the time the proxy must give the request's
	// current message (the wait plus two store calls).
	Wait time.Duration
}

// ResponseHeader is a header a verdict adds to the response: appended to
// the response's own values of the name, or in their place.
type ResponseHeader struct {
	Name, Value string
	Append      bool
}

var (
	verdictContinue = Verdict{Kind: Continue}
	verdictPass     = Verdict{Kind: Pass}
)

// waiting is what Await needs of the decision that began the wait.
type waiting struct {
	fp    idem.Fingerprint
	first idem.ReserveResult
	// far marks a wait for a far home's store, before the decision is
	// made: Await then makes it.
	far bool
}

// Refuse is the verdict on a request the policy refuses before any store
// call (key missing or invalid, no principal, a body too large or
// unreadable, the server's buffers full). A shadow policy only counts what
// it would have refused, and lets the request on.
func (a *Attempt) Refuse(ctx context.Context, prob *problem.Problem) Verdict {
	if a.Policy.Enforcement == policy.EnforcementShadow {
		return a.shadowed(ctx, idem.ShadowWouldReject, verdictPass, slog.String("problem", prob.Slug))
	}
	a.conv.Decided(idem.DecisionRejected)
	a.LogAt(ctx, slog.LevelInfo, "rejected", slog.String("problem", prob.Slug))
	return Verdict{Kind: Answer, Problem: prob}
}

// Admitted is the verdict on an admission that did not name a record
// (AdmitKey, AdmitKeyFrom): a pass, a pass in the key's grace period, or a
// refusal. It is Continue for Keyed.
func (a *Attempt) Admitted(ctx context.Context, adm Admission, prob *problem.Problem) Verdict {
	switch adm {
	case Bypass:
		return verdictPass
	case Grace:
		return a.grace(ctx)
	case Refuse:
		return a.Refuse(ctx, prob)
	}
	return verdictContinue
}

// Named is the verdict on naming the record of a Keyed request in scope
// (Admit): Continue, or the refusal of a request without the principal its
// policy scopes by.
func (a *Attempt) Named(ctx context.Context, scope, key string) Verdict {
	if prob := a.Admit(scope, key); prob != nil {
		return a.Refuse(ctx, prob)
	}
	return verdictContinue
}

// grace lets a request without a required key on during the policy's
// grace period (key.warn_until): counted, and with a Warning header that
// says from when the key is required. The header has RFC 7234 §5.5's form
// (code 299, a persistent warning); RFC 9111 retired the field, but
// clients, logs and tools still show it, and a header of its own would
// need every client taught about it. A shadow policy, which refuses
// nothing anyway, measures what enforcement would do now: it passes the
// request as a keyless one.
func (a *Attempt) grace(ctx context.Context) Verdict {
	a.conv.Decided(idem.DecisionBypassed)
	if a.Policy.Enforcement == policy.EnforcementShadow {
		return verdictPass
	}
	a.srv.Observer.KeyWarned(a.Policy.Name)
	a.LogAt(ctx, slog.LevelInfo, "key missing; passed in its grace period", slog.Time("warn_until", a.Policy.KeyWarnUntil))
	return Verdict{Kind: Pass, Add: []ResponseHeader{{
		Name: "warning", Value: GraceWarning(a.Policy.KeyHeader, a.Policy.KeyWarnUntil), Append: true,
	}}}
}

// GraceWarning is the Warning header value sent during a required key's
// grace period.
func GraceWarning(keyHeader string, until time.Time) string {
	return `299 idem-extproc "` + textproto.CanonicalMIMEHeaderKey(keyHeader) + ` will be required from ` +
		until.UTC().Format(time.RFC3339) + `; requests without it will then be refused with 400"`
}

// shadowed records a shadow policy's decision (counted, logged, put on the
// request's trace by the protocol side) and returns v with it, and with
// the policy's shadow header when it names one ("would-replay").
func (a *Attempt) shadowed(ctx context.Context, d idem.ShadowDecision, v Verdict, attrs ...slog.Attr) Verdict {
	a.conv.Decided(idem.DecisionShadowed)
	a.srv.Observer.ShadowDecided(a.Policy.Name, d)
	level := slog.LevelInfo
	if d == idem.ShadowStoreError {
		level = slog.LevelWarn
	}
	a.LogAt(ctx, level, "shadow decision", append(attrs, slog.String("shadow_decision", string(d)))...)
	v.Shadow = d
	if a.Policy.ShadowHeader != "" {
		v.Add = []ResponseHeader{{Name: a.Policy.ShadowHeader, Value: strings.ReplaceAll(string(d), "_", "-")}}
	}
	return v
}

// Request is the request-time verdict (docs/design.md §3) for a complete
// request's fingerprint: Continue for the attempt that reserved the record
// (it now holds it, its lease renewed), an Answer for any other (a replay,
// 409, 422), Wait for a duplicate that waits for the attempt in flight
// (wait_for_in_flight), and for a store that cannot be asked, Pass under
// fail_open and the 503 otherwise. A shadow policy's request always goes
// on (DecideShadow).
func (a *Attempt) Request(ctx context.Context, fp idem.Fingerprint) Verdict {
	if a.budget > a.srv.StoreTimeout && !a.farAsked {
		// The scope's home is another region (Server.Homes): its store
		// calls may outlast the proxy's timer for this message, so the
		// proxy is asked for their time first (and for a wait that may
		// follow: the proxy extends a message's timer once), shadow
		// policies' included: a shadow must never make a request fail.
		a.farAsked = true
		a.wait = &waiting{fp: fp, far: true}
		return Verdict{Kind: Wait, Wait: 2*a.budget + a.Policy.WaitForInFlight}
	}
	if a.Policy.Enforcement == policy.EnforcementShadow {
		d, err := a.DecideShadow(ctx, fp)
		if err != nil {
			return a.shadowed(ctx, d, verdictPass, slog.String("error", err.Error()))
		}
		if d == idem.ShadowWouldReserve {
			a.Hold(a.conv.Background())
			return a.shadowed(ctx, d, verdictContinue)
		}
		return a.shadowed(ctx, d, verdictPass)
	}
	res, err := a.Decide(ctx, fp)
	if err != nil {
		return a.unavailable(ctx, err)
	}
	if d, ok := a.waits(res); ok {
		a.wait = &waiting{fp: fp, first: res}
		return Verdict{Kind: Wait, Wait: d}
	}
	return a.answer(ctx, res)
}

// Await waits for the attempt in flight after a Wait verdict and gives the
// verdict on what it found.
func (a *Attempt) Await(ctx context.Context) Verdict {
	w := a.wait
	a.wait = nil
	if w.far {
		return a.Request(ctx, w.fp)
	}
	res, err := a.awaitFirst(ctx, w.fp, w.first)
	if err != nil {
		return a.unavailable(ctx, err)
	}
	return a.answer(ctx, res)
}

// unavailable is the verdict when the store cannot be asked or used: the
// request passes unprotected under fail_open when the store could not be
// asked at all, and is refused 503 otherwise.
func (a *Attempt) unavailable(ctx context.Context, err error) Verdict {
	if Unreachable(err) && a.Policy.FailureMode == policy.FailOpen {
		a.conv.Decided(idem.DecisionFailOpen)
		a.LogAt(ctx, slog.LevelWarn, "store unavailable; request passes unprotected (fail_open)", slog.String("error", err.Error()))
		return verdictPass
	}
	a.conv.Decided(idem.DecisionStoreUnavailable)
	a.LogAt(ctx, slog.LevelError, "store unavailable; request refused (fail_closed)", slog.String("error", err.Error()))
	prob := problem.New(problem.StoreUnavailable, "the idempotency store cannot be used; retry later")
	prob.RetryAfter = a.Policy.RetryAfter
	return Verdict{Kind: Answer, Problem: prob}
}

// answer turns a reservation's outcome into the verdict. The decision's
// name is the metric's (decisions_total): "replayed", "conflict", not the
// record's state.
func (a *Attempt) answer(ctx context.Context, res idem.ReserveResult) Verdict {
	d := idem.DecisionFor(res.Outcome)
	if a.atBody {
		// Decided at the body: say where the key came from (the record id
		// stands for it; a derived key is a hash, never body text).
		a.LogAt(ctx, slog.LevelInfo, "decision", slog.String("decision", string(d)), slog.String("key_source", a.keySource.String()))
	} else {
		a.LogAt(ctx, slog.LevelInfo, "decision", slog.String("decision", string(d)))
	}
	a.conv.Decided(d)
	switch res.Outcome {
	case idem.Reserved:
		a.Hold(a.conv.Background())
		return verdictContinue
	case idem.Completed:
		if !res.CreatedAt.IsZero() {
			a.srv.Observer.Replayed(a.Policy.Name, time.Since(res.CreatedAt))
		}
		return Verdict{Kind: Answer, Replay: res.Response}
	case idem.InFlight:
		prob := problem.New(problem.InProgress, "an earlier request with this Idempotency-Key is still being processed; retry later")
		prob.RetryAfter = a.Policy.RetryAfter
		return Verdict{Kind: Answer, Problem: prob}
	case idem.Unknown:
		return Verdict{Kind: Answer, Problem: problem.New(problem.OutcomeUnknown,
			"an earlier request with this Idempotency-Key ended without a known outcome; "+
				"check the resource's state before retrying with a new key")}
	}
	return Verdict{Kind: Answer, Problem: problem.New(problem.KeyReused, // idem.Mismatch
		"this Idempotency-Key was already used for a request with a different method, path, headers or body")}
}

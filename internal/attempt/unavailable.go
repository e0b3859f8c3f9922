package attempt

import (
	"errors"
	"log/slog"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// A store the attempt cannot ask, or can ask but not use, and the verdict
// on the request then: the policy's store_failure for the first (a pass
// under fail_open), a refusal for the second (docs/design.md §3).

// unusable is a store the attempt can reach but not use: the policy seals
// and the server has no key ring, or the stored record is damaged
// (idem.ErrDamaged), not sealed under a policy that encrypts, or does not
// open or expand. The request is then refused whatever the policy's
// failure_mode: fail_open is for a store that cannot be asked, not for one
// whose answer cannot be trusted. Its text is the cause's, as logged.
type unusable struct{ err error }

func (e unusable) Error() string { return e.err.Error() }
func (e unusable) Unwrap() error { return e.err }

// unreachable reports whether an error from decide means the store could
// not be asked (so fail_open may pass the request), rather than that it
// could not be used.
func unreachable(err error) bool {
	var u unusable
	return !errors.As(err, &u) && !errors.Is(err, ErrHomeOutOfReach) && !errors.Is(err, ErrHomesDisagree)
}

var (
	errNoKeyRing = errors.New("policy asks for encryption and the server has no key ring")
	// errNotSealed: nothing in a record tells one stored in the clear
	// before the policy encrypted from one forged in the clear since, so
	// neither is replayed (docs/design.md §6.8).
	errNotSealed = errors.New("a stored response is not sealed and the policy encrypts: stored before encryption was turned on, or forged")
)

// unavailable is the verdict when the store cannot be asked or used: the
// request passes unprotected under fail_open when the store could not be
// asked at all, and is refused 503 otherwise.
func (a *Attempt) unavailable(err error) Verdict {
	if unreachable(err) && a.Policy.FailureMode == policy.FailOpen {
		a.conv.Decided(a.Policy.Name, idem.DecisionFailOpen)
		a.LogAt(slog.LevelWarn, "store unavailable; request passes unprotected (fail_open)", slog.String("error", err.Error()))
		return verdictPass
	}
	d, line := idem.DecisionStoreUnavailable, "store unavailable; request refused (fail_closed)"
	prob := &problem.Problem{Kind: problem.StoreUnavailable, Detail: "the idempotency store cannot be used; retry later",
		RetryAfter: a.Policy.RetryAfter}
	switch {
	case errors.Is(err, ErrHomeOutOfReach):
		// A retry would take as long: no Retry-After.
		line, prob = "key's home out of reach within the proxy's timers; request refused", problem.New(problem.HomeOutOfReach,
			"the idempotency store of this key's home region cannot be asked within the proxy's timers; nothing was done")
	case errors.Is(err, ErrHomesDisagree):
		// A retry would meet the same maps until they are rolled out.
		line, prob = "homes maps disagree about the key's home; request refused", problem.New(problem.HomesDisagree,
			"the idempotency servers' homes maps disagree about this key's home region; nothing was done")
	case !unreachable(err) && !errors.Is(err, errNoKeyRing):
		d, line = idem.DecisionRecordUnusable, "stored record cannot be used; request refused"
	}
	a.conv.Decided(a.Policy.Name, d)
	a.LogAt(slog.LevelError, line, slog.String("error", err.Error()))
	return Verdict{Kind: answered, Problem: prob}
}

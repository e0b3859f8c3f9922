package attempt

import (
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// Admission is what admission made of a request, before any store call
// (docs/design.md §3, the first table).
type Admission uint8

const (
	// Bypass: not protected (no policy, enforcement off, no key where it
	// is optional); the request goes on and nothing is recorded.
	Bypass Admission = iota + 1
	// Grace: no key where one is required, within the policy's grace
	// period (key.warn_until): the request goes on with a warning.
	Grace
	// Refuse: refused with a problem (400 key missing or invalid).
	Refuse
	// Keyed: the key is valid; the record is named once the scope is
	// known (Admit).
	Keyed
)

// Match picks the request's policy out of set: Continue when one matched,
// and a Pass (counted as bypassed) when none did.
func (a *Attempt) Match(set *policy.Set, r policy.Request) Verdict {
	a.Policy = set.Match(r)
	if a.Policy == nil {
		a.conv.Decided(idem.DecisionBypassed)
		return verdictPass
	}
	return verdictContinue
}

// AdmitKey judges the request's key field under the matched policy: raw is
// its first line's value, lines how many lines carried it (0 when absent).
// It counts the request for key adoption, whatever the enforcement. For
// Keyed it returns the parsed key, for Refuse the problem.
func (a *Attempt) AdmitKey(raw string, lines int, now time.Time) (Admission, string, *problem.Problem) {
	a.srv.Observer.Requested(a.Policy.Name, lines > 0)
	if a.Policy.Enforcement == policy.EnforcementOff {
		// Matched for the adoption counts only: no store call.
		a.conv.Decided(idem.DecisionBypassed)
		return Bypass, "", nil
	}
	if lines == 0 {
		switch {
		case a.Policy.KeyRequired && a.Policy.KeyGrace(now):
			return Grace, "", nil
		case a.Policy.KeyRequired:
			return Refuse, "", problem.New(problem.KeyMissing, "this endpoint requires an Idempotency-Key header")
		}
		a.conv.Decided(idem.DecisionBypassed)
		return Bypass, "", nil
	}
	return a.headerKey(raw, lines)
}

// Admit names the record of a Keyed request's key in scope, the owner of
// its key space read where the policy says. A policy that scopes by a
// header, metadata or the peer's identity refuses a request that carries
// none (401 principal-missing): its key would otherwise share a record
// with every other unscoped client's. Scoped by authority or not at all,
// "" is a scope like any other.
func (a *Attempt) Admit(scope, key string) *problem.Problem {
	switch a.Policy.Scope.Source {
	case policy.ScopeNone, policy.ScopeAuthority:
	default:
		if scope == "" {
			return problem.New(problem.PrincipalMissing, "the request carries no principal to scope its Idempotency-Key")
		}
	}
	a.Scope = scope
	ns := a.Policy.RecordNamespace()
	if a.keySource == policy.KeyFromDerived {
		ns += policy.DerivedNamespaceSuffix // never a key a client sent
	}
	a.ID = idem.RecordIDFor(ns, scope, key)
	if a.srv.Homes != nil && a.Policy.Homes != nil {
		a.store, a.budget = a.srv.Homes.StoreFor(a.Policy, scope, key)
	}
	return nil
}

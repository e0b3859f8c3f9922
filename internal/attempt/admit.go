package attempt

import (
	"context"
	"fmt"
	"log/slog"
	"net/textproto"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// admission is what admission made of a request, before any store call
// (docs/design.md §3, the first table).
type admission uint8

const (
	// admitBypass: not protected (no policy, enforcement off, no key where it
	// is optional); the request goes on and nothing is recorded.
	admitBypass admission = iota + 1
	// admitGrace: no key where one is required, within the policy's grace
	// period (key.warn_until): the request goes on with a warning.
	admitGrace
	// admitRefused: refused with a problem (400 key missing or invalid).
	admitRefused
	// admitKeyed: the key is valid; the record is named once the scope is
	// known (admit).
	admitKeyed
)

// Match picks the request's policy out of set: Continue when one matched,
// and a Pass (counted as bypassed) when none did.
func (a *Attempt) Match(set *policy.Set, r policy.Request) Verdict {
	a.Policy = set.Match(r)
	if a.Policy == nil {
		a.conv.Decided("", idem.DecisionBypassed)
		return verdictPass
	}
	return verdictContinue
}

// admitKey judges the request's key field under the matched policy: raw is
// its first line's value, lines how many lines carried it (0 when absent).
// It counts the request for key adoption, whatever the enforcement. For
// admitKeyed it returns the parsed key, for admitRefused the problem.
func (a *Attempt) admitKey(raw string, lines int, now time.Time) (admission, string, *problem.Problem) {
	a.srv.Observer.Requested(a.Policy.Name, lines > 0)
	if a.Policy.Enforcement == policy.EnforcementOff {
		// Matched for the adoption counts only: no store call.
		a.conv.Decided(a.Policy.Name, idem.DecisionBypassed)
		return admitBypass, "", nil
	}
	if lines == 0 {
		switch {
		case a.Policy.KeyRequired && a.Policy.KeyGrace(now):
			return admitGrace, "", nil
		case a.Policy.KeyRequired:
			return admitRefused, "", problem.New(problem.KeyMissing, "this endpoint requires an Idempotency-Key header")
		}
		a.conv.Decided(a.Policy.Name, idem.DecisionBypassed)
		return admitBypass, "", nil
	}
	return a.headerKey(raw, lines)
}

// admit names the record of an admitKeyed request's key in scope, the owner of
// its key space read where the policy says. A policy that scopes by a
// header, metadata or the peer's identity refuses a request that carries
// none (401 principal-missing): its key would otherwise share a record
// with every other unscoped client's. Scoped by authority or not at all,
// "" is a scope like any other.
func (a *Attempt) admit(scope, key string) *problem.Problem {
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
		// A request sent to its home asks no store here, not even to
		// find out that its calls would not fit (StoreFor).
		if a.sendTo, a.astray = a.route(scope); a.sendTo == "" && a.astray == nil {
			a.home = &home{store: a.srv.Homes.StoreFor(a.Policy, scope, key)}
		}
	}
	return nil
}

// headerKey is admitKey's judgement of a header key that is present.
func (a *Attempt) headerKey(raw string, lines int) (admission, string, *problem.Problem) {
	if lines > 1 {
		// Which line counts would depend on who reads it (this server the
		// first, many upstreams the last): one record for two keys.
		return admitRefused, "", problem.New(problem.KeyInvalid,
			fmt.Sprintf("invalid Idempotency-Key: sent on %d field lines; the field is a single string", lines))
	}
	key, err := idem.ParseKey(raw, a.Policy.MaxKeyLength)
	if err != nil {
		return admitRefused, "", problem.New(problem.KeyInvalid, err.Error())
	}
	return admitKeyed, key, nil
}

// Refuse is the verdict on a request the policy refuses before any store
// call (key missing or invalid, no principal, a body too large or
// unreadable, the server's buffers full). A shadow policy only counts what
// it would have refused, and lets the request on.
func (a *Attempt) Refuse(ctx context.Context, prob *problem.Problem) Verdict {
	if a.Policy.Enforcement == policy.EnforcementShadow {
		return a.shadowed(ctx, idem.ShadowWouldReject, verdictPass, slog.String("problem", prob.Slug))
	}
	a.conv.Decided(a.Policy.Name, idem.DecisionRejected)
	a.LogAt(ctx, slog.LevelInfo, "rejected", slog.String("problem", prob.Slug))
	return Verdict{Kind: answered, Problem: prob}
}

// admitted is the verdict on an admission that did not name a record
// (admitKey, admitKeyFrom): a pass, a pass in the key's grace period, or a
// refusal. It is Continue for admitKeyed.
func (a *Attempt) admitted(ctx context.Context, adm admission, prob *problem.Problem) Verdict {
	switch adm {
	case admitBypass:
		return verdictPass
	case admitGrace:
		return a.grace(ctx)
	case admitRefused:
		return a.Refuse(ctx, prob)
	}
	return verdictContinue
}

// Key is the verdict on the request's key field (admitKey): Continue with
// the parsed key when it is admitKeyed, and otherwise the pass or refusal
// (admitted).
func (a *Attempt) Key(ctx context.Context, raw string, lines int, now time.Time) (string, Verdict) {
	adm, key, prob := a.admitKey(raw, lines, now)
	return key, a.admitted(ctx, adm, prob)
}

// Named is the verdict on naming the record of an admitKeyed request in scope
// (admit): Continue, the refusal of a request without the principal its
// policy scopes by, or where a homes map sends the request (routed).
func (a *Attempt) Named(ctx context.Context, scope, key string) Verdict {
	if prob := a.admit(scope, key); prob != nil {
		return a.Refuse(ctx, prob)
	}
	return a.routed(ctx)
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
	a.conv.Decided(a.Policy.Name, idem.DecisionBypassed)
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
	a.conv.Decided(a.Policy.Name, idem.DecisionShadowed)
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

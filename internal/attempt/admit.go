package attempt

import (
	"fmt"
	"log/slog"
	"net/textproto"
	"slices"
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

// Facts is what the attempt reads of a request at its headers, kept where
// the protocol side has it: the target, the headers, the forwarded dynamic
// metadata and the peer's identity. A policy's scope and key are read
// through it (scopeOf, AtHeaders), so that a new source is a case of
// scopeOf and at most a method here, and nothing of the protocol side.
type Facts interface {
	// Target is the request's method, authority, path and route name, as
	// policies match them.
	Target() policy.Request
	// Header is the named header's first line and how many lines carried
	// it (0: absent).
	Header(name string) (string, int)
	// Headers copies the named headers (a fingerprint's).
	Headers(names []string) []idem.Header
	// HeadersPrefixed copies the headers whose names start with prefix
	// (an MCP call's Mcp-Param-{Name} headers).
	HeadersPrefixed(prefix string) []idem.Header
	// Metadata is the string or number at path in one namespace of the
	// forwarded dynamic metadata; "" when there is none.
	Metadata(namespace string, path []string) string
	// Peer is the peer's identity of the kind named, "" when there is
	// none; a proxy that does not send it is reported under policyName.
	Peer(policyName string, id policy.PeerIdentity) string
}

// AtHeaders is the admission of a request at its headers (docs/design.md
// §3, the first table): the policy it matches in set (a Pass, counted as
// bypassed, when none does), then its key, the key's grace period, its
// scope, its record's name and where it runs (admit). A policy that reads
// the body first reads, for every policy the request may end with, what
// it needs of the headers, and the verdict is ReadBody with AtBody (Request
// picks the policy). ReadBody alone: the body is awaited, then Request
// decides.
func (a *Attempt) AtHeaders(set *policy.Set, f Facts, now time.Time) Verdict {
	r := f.Target()
	a.method, a.path = r.Method, r.Path
	if a.Policy = set.Match(r); a.Policy == nil {
		a.conv.Decided("", idem.DecisionBypassed)
		return verdictPass
	}
	if a.Policy.NeedsBody() {
		return a.readBody(set, r, f)
	}
	raw, lines := f.Header(a.Policy.KeyHeader)
	adm, key, prob := a.admitKey(raw, lines, now)
	if adm != admitKeyed {
		return a.admitted(adm, prob)
	}
	scope, required := a.scopeOf(a.Policy, f)
	v := a.named(scope, required, key)
	if v.Kind == Continue {
		a.fpHeaders = f.Headers(a.Policy.FingerprintHeaders)
		v.Kind = ReadBody
	}
	return v
}

// scopeOf reads the owner of the request's key space where pol says, and
// whether pol requires one (admit). It is the one reading of a scope
// source: a new source is a case here.
func (a *Attempt) scopeOf(pol *policy.Policy, f Facts) (scope string, required bool) {
	switch sc := pol.Scope; sc.Source {
	case policy.ScopeAuthority:
		return f.Target().Authority, false
	case policy.ScopeHeader:
		scope, _ = f.Header(sc.Header)
		return scope, true
	case policy.ScopeMetadata:
		return f.Metadata(sc.Namespace, sc.Path), true
	case policy.ScopePrincipal:
		return f.Peer(pol.Name, sc.PeerIdentity), true
	}
	return "", false // ScopeNone
}

// admitKey judges the request's key field under the matched policy: raw is
// its first line's value, lines how many lines carried it (0 when absent).
// It counts the request for key adoption, whatever the enforcement. For
// admitKeyed it returns the parsed key, for admitRefused the problem.
func (a *Attempt) admitKey(raw string, lines int, now time.Time) (admission, string, *problem.Problem) {
	a.srv.Observer.Requested(a.Policy.Name, lines > 0)
	switch {
	case a.Policy.Enforcement == policy.EnforcementOff:
		// Matched for the adoption counts only: no store call.
	case lines > 0:
		return a.headerKey(raw, lines)
	case a.Policy.KeyRequired && a.Policy.KeyGrace(now):
		return admitGrace, "", nil
	case a.Policy.KeyRequired:
		return admitRefused, "", problem.New(problem.KeyMissing, "this endpoint requires an Idempotency-Key header")
	}
	a.conv.Decided(a.Policy.Name, idem.DecisionBypassed)
	return admitBypass, "", nil
}

// admit names the record of an admitKeyed request's key in scope, the owner of
// its key space read where the policy says (scopeOf). A policy that
// requires a scope (by a header, metadata or the peer's identity) refuses
// a request that carries none (401 principal-missing): its key would
// otherwise share a record with every other unscoped client's. Scoped by
// authority or not at all, "" is a scope like any other.
func (a *Attempt) admit(scope string, required bool, key string) *problem.Problem {
	if required && scope == "" {
		return problem.New(problem.PrincipalMissing, "the request carries no principal to scope its Idempotency-Key")
	}
	a.Scope = scope
	ns := a.Policy.RecordNamespace()
	if a.keySource == policy.KeyFromDerived {
		ns += policy.DerivedNamespaceSuffix // never a key a client sent
	}
	a.ID = idem.RecordIDFor(ns, scope, key)
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

// refuse is the verdict on a request the policy refuses before any store
// call (key missing or invalid, no principal, a body too large or
// unreadable, the server's buffers full). A shadow policy only counts what
// it would have refused, and lets the request on.
func (a *Attempt) refuse(prob *problem.Problem) Verdict {
	if a.Policy.Enforcement == policy.EnforcementShadow {
		return a.shadowed(idem.ShadowWouldReject, verdictPass, slog.String("problem", prob.Slug))
	}
	a.conv.Decided(a.Policy.Name, idem.DecisionRejected)
	a.LogAt(slog.LevelInfo, "rejected", slog.String("problem", prob.Slug))
	return Verdict{Kind: answered, Problem: prob}
}

// admitted is the verdict on an admission that did not name a record
// (admitKey, admitKeyFrom): a pass, a pass in the key's grace period, or a
// refusal. It is Continue for admitKeyed.
//
// A request without a required key goes on during the policy's grace
// period (key.warn_until): counted, and with a Warning header that says
// from when the key is required. The header has RFC 7234 §5.5's form
// (code 299, a persistent warning); RFC 9111 retired the field, but
// clients, logs and tools still show it, and a header of its own would
// need every client taught about it. A shadow policy, which refuses
// nothing anyway, measures what enforcement would do now: it passes the
// request as a keyless one.
func (a *Attempt) admitted(adm admission, prob *problem.Problem) Verdict {
	switch adm {
	case admitBypass:
		return verdictPass
	case admitGrace:
		a.conv.Decided(a.Policy.Name, idem.DecisionBypassed)
		if a.Policy.Enforcement == policy.EnforcementShadow {
			return verdictPass
		}
		a.srv.Observer.KeyWarned(a.Policy.Name)
		a.LogAt(slog.LevelInfo, "key missing; passed in its grace period", slog.Time("warn_until", a.Policy.KeyWarnUntil))
		return Verdict{Kind: Pass, Add: []ResponseHeader{{
			Name: "warning", Value: GraceWarning(a.Policy.KeyHeader, a.Policy.KeyWarnUntil), Append: true,
		}}}
	case admitRefused:
		return a.refuse(prob)
	}
	return verdictContinue
}

// named is the verdict on naming the record of an admitKeyed request in
// scope (admit): Continue to decide here, the refusal of a request without
// the scope its policy requires, SendHome where a homes map sends the
// request, or the refusal of a request sent here astray (503
// idempotency-homes-disagree, nothing reserved anywhere).
func (a *Attempt) named(scope string, required bool, key string) Verdict {
	if prob := a.admit(scope, required, key); prob != nil {
		return a.refuse(prob)
	}
	if a.srv.Homes == nil || a.Policy.Homes == nil {
		return verdictContinue
	}
	sendTo, astray := a.route(scope)
	switch {
	case astray != nil:
		return a.unavailable(astray)
	case sendTo == "":
		// Only a request decided here asks for its store: one sent to
		// its home asks no store here, not even to find out that its
		// calls would not fit (StoreFor).
		a.home = &home{store: a.srv.Homes.StoreFor(a.Policy, scope, key)}
		return verdictContinue
	}
	a.conv.Decided(a.Policy.Name, idem.DecisionSentHome)
	a.LogAt(slog.LevelInfo, "decision", slog.String("decision", string(idem.DecisionSentHome)), slog.String("home", sendTo))
	return Verdict{Kind: SendHome, Home: sendTo}
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
func (a *Attempt) shadowed(d idem.ShadowDecision, v Verdict, attrs ...slog.Attr) Verdict {
	a.conv.Decided(a.Policy.Name, idem.DecisionShadowed)
	a.srv.Observer.ShadowDecided(a.Policy.Name, d)
	level := slog.LevelInfo
	if d == idem.ShadowStoreError {
		level = slog.LevelWarn
	}
	a.LogAt(level, "shadow decision", append(attrs, slog.String("shadow_decision", string(d)))...)
	v.Shadow = d
	if a.Policy.ShadowHeader != "" {
		v.Add = []ResponseHeader{{Name: a.Policy.ShadowHeader, Value: strings.ReplaceAll(string(d), "_", "-")}}
	}
	return v
}

// Routing is what the proxy says of a request's way between regions
// (Server.SendHome).
type Routing struct {
	// SentTo names the region a server of another region sent the request
	// to (a SendHome verdict there), as the proxy carried it; "" for a
	// request from a client.
	SentTo string
	// CanSend reports whether the proxy can send this request on to
	// another region: a proxy that routes (Envoy) can, a client's own
	// filter (grpc-go) cannot.
	CanSend bool
}

// route decides, once the record's scope is known, whether the request
// runs here or at its scope's home: it returns the home to send it to, ""
// to decide here, or an error for a request another region's server sent
// here that this server's map homes elsewhere. A request is sent at most
// once: one that was sent here is never sent on, whatever this server's
// map says, so two maps that disagree cannot make a loop; they refuse it
// (ErrHomesDisagree) rather than run it in a store the sender's map does
// not name. A shadow policy never moves a request.
func (a *Attempt) route(scope string) (string, error) {
	if a.Policy.Enforcement != policy.EnforcementEnforce || len(a.srv.SendHome) == 0 && a.Routing.SentTo == "" {
		return "", nil // nothing to send, nor a sender's mark to check: no lookup
	}
	home, here := a.srv.Homes.HomeOf(a.Policy, scope)
	switch sent := a.Routing.SentTo; {
	case sent != "" && (!here || sent != home):
		return "", fmt.Errorf("%w: a server of another region sent the request to region %q, and this server's map homes scope %q in %q",
			ErrHomesDisagree, sent, scope, home)
	case sent != "" || here || !slices.Contains(a.srv.SendHome, home) || !a.Routing.CanSend:
		return "", nil
	}
	return home, nil
}

package attempt

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// keyInput is what a request decided at its body offers as its key: the
// key header's first line and how many lines carried it, and the whole
// body.
type keyInput struct {
	headerRaw   string
	headerLines int
	body        []byte
}

// admitKeyFrom judges a request's key under a policy whose key may come
// from the body (key.from): each source in order, the first
// that yields a key wins. A key that is there but malformed is refused,
// whatever follows (it is the client's key, sent wrong). When no source
// yields one, key.required decides as for a header: 400 with a detail
// naming what was looked for (the header, the pointer), the grace period,
// or a pass. A derived key lives in a key space of its own (admit).
func (a *Attempt) admitKeyFrom(in keyInput, now time.Time) (admission, string, *problem.Problem) {
	p := a.Policy
	a.keySource, a.atBody = policy.KeyFromHeader, true
	if p.Enforcement == policy.EnforcementOff {
		return a.admitKey(in.headerRaw, in.headerLines, now) // counted, then bypassed
	}
	sources := p.KeySources
	if len(sources) == 0 {
		sources = []policy.KeySource{policy.KeyFromHeader}
	}
	kind, details := problem.KeyMissing, []string(nil)
	for _, src := range sources {
		key, miss, prob := a.keyFrom(src, in)
		if prob != nil {
			// A key sent malformed, or a body that may hold one and cannot
			// be read: whether a key was sent is known for the header only.
			a.srv.Observer.Requested(p.Name, prob.Kind != problem.BodyUnreadable || in.headerLines > 0)
			return admitRefused, "", prob
		}
		if miss != nil {
			if miss.Kind == problem.KeyInvalid {
				kind = problem.KeyInvalid
			}
			details = append(details, miss.Detail)
			continue
		}
		a.srv.Observer.Requested(p.Name, src != policy.KeyFromDerived)
		a.keySource = src
		return admitKeyed, key, nil
	}
	if !p.KeyRequired || p.KeyGrace(now) {
		return a.admitKey("", 0, now) // no key: the grace period or a pass, as at the headers
	}
	a.srv.Observer.Requested(p.Name, false)
	return admitRefused, "", problem.New(kind, "this endpoint requires an idempotency key: "+strings.Join(details, "; "))
}

// keyFrom reads one source: a key, or why there is none (miss), or the
// problem of a key sent malformed. A body source that meets a body it
// cannot read (policy.ErrBodyUnreadable) refuses the request whatever
// key.required says: the key may be in it, as the upstream reads it, and
// the request would pass unprotected although the client sent one (for a
// derived key, although the body would have yielded one).
func (a *Attempt) keyFrom(src policy.KeySource, in keyInput) (key string, miss, prob *problem.Problem) {
	p := a.Policy
	ptr := p.KeyPointer // KeyFromBody's
	switch src {
	case policy.KeyFromHeader:
		if in.headerLines == 0 {
			return "", problem.New(problem.KeyMissing, "no "+p.KeyHeader+" header"), nil
		}
		_, key, prob = a.headerKey(in.headerRaw, in.headerLines) // "" for a refusal
		return key, nil, prob
	case policy.KeyFromDerived:
		return derivedKey(p.KeyDerive, in.body)
	case policy.KeyFromMCPParam:
		// The body's value: its Mcp-Param header, if the tool marks the
		// parameter, was checked against it (policy.MCPParamMismatch).
		ptr = p.KeyParam
	}
	// The key at ptr in the body: a string of 1 to MaxKeyLength bytes.
	vs, err := policy.FindInBody(in.body, ptr)
	if errors.Is(err, policy.ErrBodyUnreadable) {
		return "", nil, unreadableProblem(err)
	}
	var s string
	if err == nil {
		s, err = vs[0].Text()
	}
	if err != nil {
		return "", bodyMiss(ptr, err), nil
	}
	if err := idem.CheckKey(s, p.MaxKeyLength); err != nil {
		return "", nil, problem.New(problem.KeyInvalid, fmt.Sprintf("the key at %s: %v", ptr, err))
	}
	return s, nil, nil
}

// bodyMiss words why the body has no key at ptr.
func bodyMiss(ptr jsonpointer.Pointer, err error) *problem.Problem {
	switch {
	case errors.Is(err, jsonpointer.ErrMissing):
		return problem.New(problem.KeyMissing, fmt.Sprintf("the body has no member at %s", ptr))
	case errors.Is(err, jsonpointer.ErrNotString):
		return problem.New(problem.KeyInvalid, fmt.Sprintf("the member at %s is not a string", ptr))
	}
	return problem.New(problem.KeyMissing, fmt.Sprintf("the body is not a JSON object, so it has no key at %s", ptr))
}

// derivedKey is the key of a client that sends none: the SHA-256 of the
// canonical JSON of the chosen members (fingerprint.Compute with
// JSONOptions.Include: an object from pointer to value, an absent member
// left out, so absent differs from null), in hex. It is never the raw
// body text, so logs and metrics show no member's value. A body that is
// not a JSON object, or has none of the members, yields no key; one that
// cannot be read is refused (policy.ErrBodyUnreadable, unreadableProblem).
func derivedKey(members []jsonpointer.Pointer, body []byte) (key string, miss, prob *problem.Problem) {
	vs, err := policy.FindInBody(body, members...)
	if errors.Is(err, policy.ErrBodyUnreadable) {
		return "", nil, unreadableProblem(err)
	}
	if err != nil {
		return "", bodyMiss(members[0], err), nil
	}
	if !slices.ContainsFunc(vs, jsonpointer.Value.Found) {
		names := make([]string, len(members))
		for i, m := range members {
			names[i] = m.String()
		}
		return "", problem.New(problem.KeyMissing, "the body has none of the members the key is derived from ("+strings.Join(names, ", ")+")"), nil
	}
	sum := fingerprint.Compute(fingerprint.Request{Body: body, JSON: true, JSONOptions: fingerprint.JSONOptions{Include: members}}, nil)
	return hex.EncodeToString(sum[:]), nil, nil
}

// admitUnreadable judges a request under a policy with body criteria
// whose body cannot be read (policy.BodyUnreadable), so whether the
// criteria hold cannot be told, while another reader upstream may well
// take the body for a call that meets them. The request is refused
// (unreadableProblem) unless the policy would let it pass unprotected
// whatever its body said, which is then an admitBypass of this policy only (the
// caller goes on to the next): under enforcement: off, and when the key
// comes from the header alone, none was sent, and none is required (or a
// grace period lets a request without one pass). A key the client sent
// in the header asks for protection that cannot be given without reading
// the body, and a key from the body or derived from it cannot be read:
// both refuse, whatever key.required says. A shadow policy's refusal is
// counted, never made: the caller answers an admitRefused as any other.
func (a *Attempt) admitUnreadable(cause error, headerLines int, now time.Time) (admission, *problem.Problem) {
	p := a.Policy
	fromBody := p.KeyFrom(policy.KeyFromBody) || p.KeyFrom(policy.KeyFromDerived)
	headerKey := p.KeyFrom(policy.KeyFromHeader) && headerLines > 0
	if p.Enforcement == policy.EnforcementOff || !fromBody && !headerKey && !(p.KeyRequired && !p.KeyGrace(now)) {
		return admitBypass, nil
	}
	a.srv.Observer.Requested(p.Name, headerKey)
	return admitRefused, unreadableProblem(cause)
}

// unreadableProblem is the answer to a body a policy must read and cannot
// (policy.ErrBodyUnreadable): 400 request-body-unreadable, or in JSON-RPC
// the parse error -32700. Nothing was reserved or executed.
func unreadableProblem(cause error) *problem.Problem {
	return problem.New(problem.BodyUnreadable, fmt.Sprintf(
		"%v; this endpoint protects some requests by what their body says, so a body it cannot read is refused, "+
			"not passed unprotected; send one JSON object, in UTF-8, nested at most 200 levels, each member name once", cause))
}

package attempt

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// Requests whose policy is decided at the body: the policy that matched at
// the headers has body criteria (match.json, answers: jsonrpc) or reads its
// key from the body. The protocol side reads, for each policy the request
// may end with (policy.Set.BodyCandidates), what that policy needs of the
// headers while they are at hand (a Candidate), and once the body is whole
// asks AtBody for the verdict.

// Candidate is one policy a request deferred to its body may end with,
// and what that policy reads of the request's headers: the key header's
// first line and how many lines carried it, the scope, the fingerprint's
// headers.
type Candidate struct {
	Policy    *policy.Policy
	RawKey    string
	KeyLines  int
	Scope     string
	FPHeaders []idem.Header
	// MCP are the request's MCP headers, for a JSON-RPC policy's check of
	// them against the body (policy.MCPHeaderMismatch).
	MCP policy.MCPHeaders
	// Upstream names where the request goes (policy.ToolsUpstream), for a
	// policy that protects tools by their annotations
	// (policy.ToolHinted).
	Upstream string
}

// BodyVerdict is the verdict on a request deferred to its body, with what
// the protocol side needs to render it: whether its answers are JSON-RPC
// responses, and to which id (nil when none was read: a refusal made
// before the body named one).
type BodyVerdict struct {
	Verdict
	// Chosen is the candidate that took the request, for Continue.
	Chosen  *Candidate
	JSONRPC bool
	ID      []byte
	// Unreadable: the refusal is of a body a candidate could not read; a
	// JSON-RPC one goes to the id the body's first bytes carry, if any.
	Unreadable bool
}

// AtBody picks the policy of a deferred request once its body is whole:
// the first candidate whose body criteria hold, whose key is then admitted
// (admitKeyFrom) and record named (admit). The verdict is Continue when the
// request is admitted (the attempt's policy is the chosen one), a Pass when
// no candidate takes the body or one passes it without a key, and a
// refusal otherwise. A request no candidate takes costs no store call.
func (a *Attempt) AtBody(ctx context.Context, cands []Candidate, body []byte, now time.Time) BodyVerdict {
	first := a.Policy
	miss := policy.BodyMatched
	var shadow *Candidate
	var shadowWhy error
	for i := range cands {
		c := &cands[i]
		a.Policy = c.Policy
		id, m, why := c.Policy.MatchBodyWhy(body)
		if m == policy.BodyUnreadable {
			// Whether this policy applies cannot be told, and a reader
			// upstream may take the body for a call it protects: refused
			// unless the policy would pass it whatever it said. A shadow
			// policy protects nothing, so it does not end the search: a
			// later enforced one may still refuse; its would-reject is
			// counted below if none does.
			if c.Policy.Enforcement == policy.EnforcementShadow {
				if shadow == nil {
					shadow, shadowWhy = c, why
				}
				miss = m
				continue
			}
			if v, refused := a.unreadable(ctx, c, why, now); refused {
				return v
			}
		}
		if m == policy.BodyMatched && c.Policy.ToolHinted(c.Upstream, body, now) {
			// The upstream listed the tool as read-only or idempotent,
			// and the policy protects only the others (tools.protect).
			m = policy.BodyHinted
		}
		if m != policy.BodyMatched {
			miss = m
			continue
		}
		out := BodyVerdict{JSONRPC: c.Policy.Answers == policy.AnswersJSONRPC, ID: id}
		if out.JSONRPC {
			a.callID = id // a replay answers this call (answer)
			if why := headersMismatch(c, body, now); why != "" {
				out.Verdict = a.Refuse(ctx, problem.New(problem.HeaderMismatch, why))
				return out
			}
		}
		adm, key, prob := a.admitKeyFrom(keyInput{headerRaw: c.RawKey, headerLines: c.KeyLines, body: body}, now)
		if out.Verdict = a.admitted(ctx, adm, prob); out.Kind != Continue {
			return out
		}
		if out.Verdict = a.Named(ctx, c.Scope, key); out.Kind != Continue {
			return out
		}
		// The body was read under the limit of the policy that deferred
		// it; the policy that takes it holds it to its own, in the order
		// the headers path keeps: a request it would pass or refuse for
		// its key never gets this far there either.
		if limit := c.Policy.MaxRequestBody; len(body) > limit {
			out.Verdict = a.Refuse(ctx, BodyTooLarge(limit))
			return out
		}
		out.Chosen = c
		return out
	}
	if shadow != nil {
		a.Policy = shadow.Policy
		if v, refused := a.unreadable(ctx, shadow, shadowWhy, now); refused {
			return v
		}
	}
	// Counted as bypassed under the policy that matched at the headers, so
	// that an MCP route's reads, notifications and batches show there.
	a.Policy = first
	a.conv.Decided(a.Policy.Name, idem.DecisionBypassed)
	a.LogAt(ctx, slog.LevelDebug, "no policy's body criteria hold; passes unprotected", slog.String("body", miss.String()))
	a.Policy = nil
	return BodyVerdict{Verdict: verdictPass}
}

// headersMismatch says why a JSON-RPC call's MCP headers disagree with
// its body, or "": such a call is refused as a compliant server would
// refuse it, before any effect, since an intermediary may have acted on
// the headers (policy.MCPHeaderMismatch, policy.MCPParamMismatch).
func headersMismatch(c *Candidate, body []byte, now time.Time) string {
	if policy.MCPHeaderMismatch(c.MCP, body) {
		return "the Mcp-Method or Mcp-Name header does not match the request body"
	}
	return c.Policy.MCPParamMismatch(c.MCP, c.Upstream, body, now)
}

// unreadable judges a body candidate c cannot read (admitUnreadable):
// the refusal, in c's answers (counted and passed on a shadow policy), or
// false when c would pass the request whatever its body said, and the
// next candidate is tried.
func (a *Attempt) unreadable(ctx context.Context, c *Candidate, why error, now time.Time) (BodyVerdict, bool) {
	adm, prob := a.admitUnreadable(why, c.KeyLines, now)
	if adm != admitRefused {
		return BodyVerdict{}, false
	}
	return BodyVerdict{Verdict: a.Refuse(ctx, prob), JSONRPC: c.Policy.Answers == policy.AnswersJSONRPC, Unreadable: true}, true
}

// BodyTooLarge is the refusal of a request body over limit bytes.
func BodyTooLarge(limit int) *problem.Problem {
	return problem.New(problem.BodyTooLarge, "the request body exceeds "+strconv.Itoa(limit)+" bytes")
}

// RuledOutByHeaders is the verdict on a JSON-RPC request whose MCP headers
// rule out every policy it may end with (policy.RuledOutByMCPHeaders,
// mcp_headers: trust): it passes at its headers, its body never read, no
// store command made, counted as bypassed under the policy that matched.
// It is false when any candidate may still take the request.
func (a *Attempt) RuledOutByHeaders(ctx context.Context, cands []*policy.Policy, h policy.MCPHeaders) (Verdict, bool) {
	for _, p := range cands {
		if !p.RuledOutByMCPHeaders(h) {
			return Verdict{}, false
		}
	}
	a.conv.Decided(a.Policy.Name, idem.DecisionBypassed)
	a.LogAt(ctx, slog.LevelDebug, "MCP headers rule out every policy; passes at its headers",
		slog.String("mcp_method", h.Method))
	a.Policy = nil
	return verdictPass, true
}

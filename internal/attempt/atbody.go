package attempt

import (
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonrpc"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// Requests whose policy is decided at the body: the policy that matched at
// the headers has body criteria (match.json, answers: jsonrpc) or reads its
// key from the body. At the headers the attempt reads, for each policy the
// request may end with (policy.Set.BodyCandidates), what that policy needs
// of them (a candidate, readBody); once the body is whole Request picks
// the policy (pickAtBody).

// candidate is one policy a request deferred to its body may end with,
// and what that policy reads of the request's headers: the key header's
// first line and how many lines carried it, the scope and whether the
// policy requires one, the fingerprint's headers.
type candidate struct {
	pol           *policy.Policy
	rawKey        string
	keyLines      int
	scope         string
	scopeRequired bool
	fpHeaders     []idem.Header
	// mcp are the request's MCP headers, for a JSON-RPC policy's check of
	// them against the body (policy.MCPHeaderMismatch).
	mcp policy.MCPHeaders
	// upstream names where the request goes (policy.ToolsUpstream), for a
	// policy that protects tools by their annotations
	// (policy.ToolHinted).
	upstream string
}

// readBody defers a request to its body: it reads, for every policy the
// request may end with, the key header, the scope and the fingerprint
// headers, and says ReadBody at the body (AtBody); until the body says otherwise, the first
// policy's limits (its max_request_body) and answers hold.
func (a *Attempt) readBody(set *policy.Set, r policy.Request, f Facts) Verdict {
	first := a.Policy
	pols := set.BodyCandidates(r, first)
	jsonRPC := first.Answers == policy.AnswersJSONRPC
	var mcp policy.MCPHeaders
	if jsonRPC {
		// The headers MCP 2026-07-28 mirrors a call's method and name in;
		// those of an earlier revision, which nothing here acts on
		// (MCPHeaders.Validated), are not read.
		if v, _ := f.Header(policy.MCPVersionHeader); (policy.MCPHeaders{Version: v}).Validated() {
			var n int
			mcp.Version = v
			mcp.Method, n = f.Header(policy.MCPMethodHeader)
			mcp.HasMethod = n > 0
			mcp.Name, n = f.Header(policy.MCPNameHeader)
			mcp.HasName = n > 0
		}
		if !slices.ContainsFunc(pols, func(p *policy.Policy) bool { return !p.RuledOutByMCPHeaders(mcp) }) {
			// The MCP headers rule out every policy the request may end
			// with (policy.RuledOutByMCPHeaders, mcp_headers: trust): it
			// passes at its headers, its body never read, no store command
			// made, counted as bypassed under the policy that matched.
			a.conv.Decided(first.Name, idem.DecisionBypassed)
			a.LogAt(slog.LevelDebug, "MCP headers rule out every policy; passes at its headers",
				slog.String("mcp_method", mcp.Method))
			a.Policy = nil
			return verdictPass
		}
		if slices.ContainsFunc(pols, func(p *policy.Policy) bool { return p.KeyFrom(policy.KeyFromMCPParam) }) {
			// Which of them mirrors a tool parameter is known only once
			// the body names the tool (policy.MCPParamMismatch).
			mcp.Params = f.HeadersPrefixed(policy.MCPParamPrefix)
		}
	}
	a.cands = make([]candidate, 0, len(pols))
	for _, pol := range pols {
		c := candidate{pol: pol, fpHeaders: f.Headers(pol.FingerprintHeaders), mcp: mcp}
		c.scope, c.scopeRequired = a.scopeOf(pol, f)
		if pol.LearnsTools() {
			c.upstream = policy.ToolsUpstream(r.Authority, r.Path)
		}
		if pol.KeyFrom(policy.KeyFromHeader) {
			c.rawKey, c.keyLines = f.Header(pol.KeyHeader)
		}
		a.cands = append(a.cands, c)
	}
	return Verdict{Kind: ReadBody, AtBody: true, JSONRPC: jsonRPC}
}

// pickAtBody picks the policy of a deferred request once its body is whole:
// the first candidate whose body criteria hold, whose key is then admitted
// (admitKeyFrom) and record named (admit). The verdict is Continue when the
// request is admitted (the attempt's policy is the chosen one), a Pass when
// no candidate takes the body or one passes it without a key, and a
// refusal otherwise. A request no candidate takes costs no store call.
func (a *Attempt) pickAtBody(body []byte, now time.Time) Verdict {
	cands := a.cands
	a.cands = nil
	bv := a.pick(cands, body, now)
	if bv.Kind == Pass {
		for i := range cands {
			if c := &cands[i]; c.pol.LearnsTools() {
				if bv.Learners == nil && !policy.IsToolsList(body) {
					break
				}
				bv.Learners, bv.Upstream = append(bv.Learners, c.pol), c.upstream
			}
		}
	}
	return bv
}

// pick is pickAtBody's verdict, before what a pass learns.
func (a *Attempt) pick(cands []candidate, body []byte, now time.Time) Verdict {
	first := a.Policy
	miss := policy.BodyMatched
	var shadow *candidate
	var shadowWhy error
	for i := range cands {
		c := &cands[i]
		a.Policy = c.pol
		id, m, why := c.pol.MatchBodyWhy(body)
		// Whether a policy whose body is unreadable applies cannot be told,
		// and a reader upstream may take the body for a call it protects:
		// refused unless the policy would pass it whatever it said. A
		// shadow policy protects nothing, so it does not end the search: a
		// later enforced one may still refuse; its would-reject is counted
		// below if none does.
		if m == policy.BodyUnreadable && c.pol.Enforcement != policy.EnforcementShadow {
			if v, refused := a.unreadable(c, why, body, now); refused {
				return v
			}
		} else if m == policy.BodyUnreadable && shadow == nil {
			shadow, shadowWhy = c, why
		}
		if m == policy.BodyMatched && c.pol.ToolHinted(c.upstream, body, now) {
			// The upstream listed the tool as read-only or idempotent,
			// and the policy protects only the others (tools.protect).
			m = policy.BodyHinted
		}
		if m != policy.BodyMatched {
			miss = m
			continue
		}
		v := a.took(c, id, body, now)
		v.JSONRPC, v.ID = c.pol.Answers == policy.AnswersJSONRPC, id
		return v
	}
	if shadow != nil {
		a.Policy = shadow.pol
		if v, refused := a.unreadable(shadow, shadowWhy, body, now); refused {
			return v
		}
	}
	// Counted as bypassed under the policy that matched at the headers, so
	// that an MCP route's reads, notifications and batches show there.
	a.Policy = first
	a.conv.Decided(a.Policy.Name, idem.DecisionBypassed)
	a.LogAt(slog.LevelDebug, "no policy's body criteria hold; passes unprotected", slog.String("body", miss.String()))
	a.Policy = nil
	return verdictPass
}

// took is the verdict on the request whose body candidate c's criteria
// took (id: the JSON-RPC call's): its MCP headers checked against the
// body, then its key admitted (admitKeyFrom), its record named (named)
// and its body held to c's limit.
func (a *Attempt) took(c *candidate, id, body []byte, now time.Time) Verdict {
	if c.pol.Answers == policy.AnswersJSONRPC {
		a.callID = id // a replay answers this call (answer)
		// A call whose MCP headers disagree with its body is refused as a
		// compliant server would refuse it, before any effect, since an
		// intermediary may have acted on the headers.
		why := "the Mcp-Method or Mcp-Name header does not match the request body"
		if !policy.MCPHeaderMismatch(c.mcp, body) {
			why = c.pol.MCPParamMismatch(c.mcp, c.upstream, body, now)
		}
		if why != "" {
			return a.refuse(problem.New(problem.HeaderMismatch, why))
		}
	}
	adm, key, prob := a.admitKeyFrom(keyInput{headerRaw: c.rawKey, headerLines: c.keyLines, body: body}, now)
	if v := a.admitted(adm, prob); v.Kind != Continue {
		return v
	}
	if v := a.named(c.scope, c.scopeRequired, key); v.Kind != Continue {
		return v
	}
	// The body was read under the limit of the policy that deferred it;
	// the policy that takes it holds it to its own, in the order the
	// headers path keeps: a request it would pass or refuse for its key
	// never gets this far there either.
	if limit := c.pol.MaxRequestBody; len(body) > limit {
		return a.refuse(BodyTooLarge(limit))
	}
	a.fpHeaders = c.fpHeaders
	return verdictContinue
}

// unreadable judges a body candidate c cannot read (admitUnreadable):
// the refusal, in c's answers (counted and passed on a shadow policy), or
// false when c would pass the request whatever its body said, and the
// next candidate is tried.
func (a *Attempt) unreadable(c *candidate, why error, body []byte, now time.Time) (Verdict, bool) {
	adm, prob := a.admitUnreadable(why, c.keyLines, now)
	if adm != admitRefused {
		return Verdict{}, false
	}
	v := a.refuse(prob)
	if v.JSONRPC = c.pol.Answers == policy.AnswersJSONRPC; v.JSONRPC {
		v.ID = jsonrpc.ScanID(body, nil) // the id the body's first bytes carry, if any
	}
	return v, true
}

// BodyTooLarge is the refusal of a request body over limit bytes.
func BodyTooLarge(limit int) *problem.Problem {
	return problem.New(problem.BodyTooLarge, "the request body exceeds "+strconv.Itoa(limit)+" bytes")
}

package attempt

import (
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// verdictKind is what a verdict tells the request to do.
type verdictKind uint8

const (
	// Continue: the request goes on, protected: the attempt holds the
	// record while the upstream runs.
	Continue verdictKind = iota
	// Pass: the request goes on unprotected; nothing more is recorded.
	Pass
	// answered: the server answers in the upstream's place, with Problem or
	// with Replay, and the request goes no further.
	answered
	// Wait: the request waits, up to Verdict.Wait, for the attempt in
	// flight; Await gives the verdict once the wait is over.
	Wait
	// SendHome: the proxy is to send the request to the region named
	// Verdict.Home, whose server decides it; this server records nothing
	// of it (Server.SendHome).
	SendHome
	// ReadBody: the request's body is read whole, then Request decides:
	// its fingerprint needs it, and with Verdict.AtBody its policy is
	// picked there.
	ReadBody
	// Store: the response is to be stored: its body is read, and
	// AtResponse at its end stores it.
	Store
	// SkipBody: the response's headers settled the record without it; its
	// body has nothing for the record.
	SkipBody
	// Settled: the response's end settled the record.
	Settled
)

// Verdict is one decision about a request.
type Verdict struct {
	Kind verdictKind
	// AtBody: the request's policy is picked at its body (ReadBody).
	AtBody bool
	// JSONRPC: the answers made in the upstream's place are JSON-RPC
	// responses (a policy with answers: jsonrpc), for ReadBody and at
	// the body.
	JSONRPC bool
	// Problem is the refusal an answer carries; nil for a replay.
	Problem *problem.Problem
	// Replay is the stored response an answer carries (opened when it was
	// sealed); nil for a refusal.
	Replay *idem.Response
	// Add are headers to add to the response the client gets: a shadow
	// policy's decision, a key grace period's warning.
	Add []ResponseHeader
	// Shadow is what a shadow policy would have done; "" under any other.
	Shadow idem.ShadowDecision
	// Wait bounds a Wait: the time the proxy must give the request's
	// current message (the wait plus two store calls). For Continue, the
	// time to ask for before a response message that may settle the
	// record; 0 when its own timer is enough (reserved).
	Wait time.Duration
	// Home is the region a SendHome sends the request to.
	Home string
	// Unsettled: the store did not take a SkipBody's or Settled's
	// transition; SettleAtEnd retries it when the stream ends.
	Unsettled bool

	// ID is, at the body of a request deferred to it (ReadBody), the
	// JSON-RPC id its answers go to; nil when none was read.
	ID []byte
	// Learners are, for a tools/list passed, the policies that learn the
	// tools' annotations from its answer, and Upstream where it goes
	// (policy.ToolsUpstream).
	Learners []*policy.Policy
	Upstream string
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
